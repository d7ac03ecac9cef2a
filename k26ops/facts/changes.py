"""What changed in a host's GPU health over a run: two gatherings of the facts `gpu_health`
(nvidia-smi -q) and `gpu_xid` (the kernel log) compared. Pure; the playbook gathers the
second after its steps and reports `gpu_changes` (the HTML report draws them)."""

from __future__ import annotations

from k26ops.facts.smi_q import norm_bus

# (key in gpu_health's per-GPU record, sub-key, what a change means)
COUNTERS = (
    ("ecc", "volatile_uncorrectable", "uncorrectable ECC errors (volatile)"),
    ("ecc", "aggregate_uncorrectable", "uncorrectable ECC errors (aggregate)"),
    ("remapped_rows", "uncorrectable", "rows remapped for uncorrectable errors"),
    ("remapped_rows", "correctable", "rows remapped for correctable errors"),
    ("remapped_rows", "pending", "row remap pending"),
    ("remapped_rows", "failure", "row remapping failed"),
)
# faults the counters above already say
COUNTED = {"ecc-uncorrectable", "row-remap-pending", "row-remap-failure"}


def _who(g: dict, bus: str | None):
    return g.get("index") if g.get("index") is not None else bus


def _health_changes(before: dict, after: dict) -> list[dict]:
    old = {norm_bus(g.get("bus_id")): g for g in before.get("gpus") or []}
    out = []
    for g in after.get("gpus") or []:
        bus = norm_bus(g.get("bus_id"))
        was = old.pop(bus, None)
        if was is None:
            continue  # a GPU not seen before: nothing to compare with
        for key, sub, what in COUNTERS:
            a, b = (was.get(key) or {}).get(sub), (g.get(key) or {}).get(sub)
            if isinstance(a, int) and isinstance(b, int) and b <= a:
                continue  # a counter that went down was cleared (a GPU reset): nothing new went wrong
            if a != b and b not in (None, 0, "No", "N/A"):
                out.append({"gpu": _who(g, bus), "change": what, "before": a, "after": b})
        seen = {f["fault"] for f in was.get("faults") or []}
        for f in g.get("faults") or []:
            if f["fault"] not in seen and f["fault"] not in COUNTED:
                out.append(
                    {
                        "gpu": _who(g, bus),
                        "change": f"new fault {f['fault']}: {f['evidence']}",
                        "before": None,
                        "after": f.get("action"),
                    }
                )
    for bus, g in old.items():
        out.append({"gpu": _who(g, bus), "change": "gone from nvidia-smi -q", "before": bus, "after": None})
    return out


def _xid_changes(before: dict, after: dict) -> list[dict]:
    def key(e):
        return (e.get("pci"), e.get("xid"), e.get("text"), e.get("time"))

    seen = {key(e) for e in before.get("events") or []}
    new: dict[tuple, list[dict]] = {}  # one line per GPU and Xid, with how many times
    for e in after.get("events") or []:
        if key(e) not in seen:
            new.setdefault((e.get("gpu") if e.get("gpu") is not None else e.get("pci"), e.get("xid")), []).append(e)
    return [
        {
            "gpu": gpu,
            "change": f"new Xid {code}"
            + (f" ({len(es)} times)" if len(es) > 1 else "")
            + (f": {es[0]['meaning']}" if es[0].get("meaning") else ""),
            "before": None,
            "after": code,
        }
        for (gpu, code), es in new.items()
    ]


def gpu_changes(before: dict, after: dict) -> list[dict] | None:
    """[{gpu, change, before, after}] between two fact sets ({"gpu_health": ..., "gpu_xid": ...});
    None when neither fact could be read both times (nothing was compared)."""
    out, compared = [], False
    for name, diff in (("gpu_health", _health_changes), ("gpu_xid", _xid_changes)):
        a, b = before.get(name), after.get(name)
        if isinstance(a, dict) and isinstance(b, dict) and not a.get("error") and not b.get("error"):
            compared = True
            out += diff(a, b)
    return out if compared else None
