"""What a report shows, from the data k26ops already stores: pure functions.

Inputs:
- a run document: what `k26ops --json bench [--compare TAG]` or `k26ops --json deploy
  --gate TAG` printed (`{"command", "hosts": {host: result}}`);
- a baseline's stored benches (`{host: bench}`, `snapshot --bench`), when at hand: then the
  baseline is drawn whole; otherwise it is rebuilt from the figures the run compared with it.

Optional per-host fields, drawn only when present (other features write them):
- `ttfgt`: the restart's time to first good token as the deploy writes it
  (k26ops.steps.warmstart.timeline: `{"milestones": [{"name", "at_s", "source"}], ...}`,
  each `at_s` from the stop), or a bench's `startup.ttfgt` (the last start k26ops made, which
  `snapshot --bench` stores for the baseline too); drawn as the seconds between milestones.
  Without one, `health.wait_s` of a restart is shown as the one phase "until /health".
- `gpu_changes`: GPU health changes over the run (k26ops.facts.changes: the deploy gathers
  the GPU health facts again after its steps), a list of `{"gpu": INDEX or bus id, "change":
  "new Xid 79: ..." | "uncorrectable ECC errors (volatile)" | "row remap pending" | ...,
  "before": X, "after": Y}`; an empty list: compared, nothing changed.
- `traffic`: the host's drain (k26ops.traffic.drain's record: `mode`, `requests` in flight at
  the drain, `drain_s`, `left` still in flight at the stop, `out_of_rotation_s`,
  `stop_to_serving_s`, `zero_healthy_seen`); the document's own `traffic` is the run's gateway
  watch (`zero_worker_windows`, `gateways: {name: {min_healthy, zero_worker_windows}}`).
- in `bench.cells[i]`: `accept_histogram` (the engine's verify steps by drafts accepted,
  summed by k26ops' load generator; drawn as the acceptance rate per draft position).
- in `compare.rows[i]`: `verdict` (any word), `why` (text) and `spread_pct` are shown as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k26ops.enginebench import figures as figs
from k26ops.enginebench.run import METRICS
from k26ops.errors import UserError

KINDS = ("bench", "compare", "gate", "deploy")


@dataclass
class HostView:
    host: str
    status: str = "ok"
    error: str | None = None
    bench: dict | None = None  # the new figures
    baseline: dict | None = None  # the baseline's, same shape (cells with figures)
    baseline_host: str | None = None
    rows: list[dict] = field(default_factory=list)  # bench --compare's rows
    settings_differ: list[str] = field(default_factory=list)
    gate: dict | None = None
    phases: list[tuple[str, list[tuple[str, float]]]] = field(default_factory=list)  # (whose, phases)
    phases_what: str = ""
    gpu_changes: list[dict] | None = None  # None: not compared; []: compared, nothing changed
    traffic: dict | None = None
    gpus: int = 8


@dataclass
class ReportView:
    kind: str  # bench, compare, gate, deploy
    title: str
    new_label: str  # "new", a release or a tag
    baseline_label: str | None
    hosts: list[HostView]
    generated: str = ""  # when the page was made (the caller's clock: build_html stays pure)
    notes: list[str] = field(default_factory=list)
    watch: dict | None = None  # the run's gateway watch (zero healthy workers ever?)


def cells_from_figures(flat: dict[str, dict]) -> dict:
    """A bench's shape ({cells: [{concurrency, temperature, figures}]}) from {figure name: stat}."""
    cells: dict[tuple[int, float], dict] = {}
    for name, stat in flat.items():
        try:
            metric, c, t = figs.parse_figure(name)
        except UserError:
            continue
        if c is None:  # a start-up figure (METRIC@start, issue 43): the start's phases show it, no cell
            continue
        cell = cells.setdefault((c, t), {"concurrency": c, "temperature": t, "figures": {}})
        cell["figures"][metric] = stat
    return {"cells": [cells[k] for k in sorted(cells, key=lambda k: (k[1], k[0]))]}


def _median_only(value) -> dict:
    return {"median": value, "min": value, "max": value, "n": 1}


def milestone_phases(ttfgt) -> list[tuple[str, float]]:
    """[(phase, seconds)] between a TTFGT record's milestones: `to weights loaded 20.5`."""
    ms = [
        m
        for m in (ttfgt or {}).get("milestones") or []
        if isinstance(m, dict) and isinstance(m.get("at_s"), (int, float)) and m.get("name")
    ]
    return [(f"to {b['name']}", round(b["at_s"] - a["at_s"], 2)) for a, b in zip(ms, ms[1:])]


def _phases(
    data: dict, new_label: str, base: dict | None, base_label: str | None
) -> tuple[list[tuple[str, list[tuple[str, float]]]], str]:
    """The restart's phases: this run's (the deploy's `ttfgt`, else its bench's last start),
    the baseline's stored bench's beside them; else a restart's wait for /health."""
    mine = milestone_phases(data.get("ttfgt")) or milestone_phases(
        ((data.get("bench") or {}).get("startup") or {}).get("ttfgt")
    )
    if mine:
        theirs = milestone_phases(((base or {}).get("startup") or {}).get("ttfgt"))
        rows = ([(base_label or "baseline", theirs)] if theirs else []) + [(new_label, mine)]
        return rows, "time to first good token: seconds from the stop, between milestones"
    h = data.get("health")
    if data.get("engine_restarted") and isinstance(h, dict) and isinstance(h.get("wait_s"), (int, float)):
        return (
            [(new_label, [("until /health", float(h["wait_s"]))])],
            "the restart (phases not recorded: the wait for /health)",
        )
    return [], ""


def host_view(
    host: str,
    data: dict,
    stored: dict | None = None,
    gpus: int = 8,
    new_label: str = "new",
    base_label: str | None = None,
) -> HostView:
    """One host's view from its run result (`data`) and, when at hand, the baseline's stored bench."""
    v = HostView(
        host=host, status=data.get("status") or "ok", error=data.get("error"), bench=data.get("bench"), gpus=gpus
    )
    cmp = data.get("compare") or {}
    gate = data.get("gate")
    v.rows = list(cmp.get("rows") or [])
    v.settings_differ = list(cmp.get("settings_differ") or [])
    v.baseline_host = cmp.get("baseline_host") or (gate or {}).get("baseline_host")
    if stored:
        v.baseline = stored
    elif v.rows:
        v.baseline = cells_from_figures({r["figure"]: _median_only(r["baseline"]) for r in v.rows})
    elif gate and gate.get("checked"):
        v.baseline = cells_from_figures({r["figure"]: _median_only(r["baseline"]) for r in gate["checked"]})
    if stored and v.bench and not v.rows:
        v.rows = figs.compare(v.bench, stored)
    v.gate = gate
    v.phases, v.phases_what = _phases(data, new_label, stored, base_label)
    g = data.get("gpu_changes")
    v.gpu_changes = [c for c in g if isinstance(c, dict)] if isinstance(g, list) else None
    t = data.get("traffic")
    v.traffic = t if isinstance(t, dict) and "mode" in t else None
    return v


def from_run(
    doc: dict,
    *,
    stored: dict[str, dict] | None = None,
    gpus: dict[str, int] | None = None,
    generated: str = "",
    source: str = "the run",
) -> ReportView:
    """The view of a `--json` run document (bench, bench --compare, deploy --gate)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
        raise UserError(
            f'{source}: not a k26ops --json run document (no "hosts" mapping); '
            "save one with `k26ops --json bench ... > run.json`"
        )
    hosts = doc["hosts"]
    tag = next(
        (
            d.get("compare", {}).get("tag") or (d.get("gate") or {}).get("tag")
            for d in hosts.values()
            if isinstance(d, dict) and (d.get("compare") or d.get("gate"))
        ),
        None,
    )
    views = []
    for name, data in hosts.items():
        if not isinstance(data, dict):
            raise UserError(f"{source}: host {name!r}: not a result mapping")
        base = (stored or {}).get(name) or (next(iter(stored.values())) if stored else None)
        views.append(host_view(name, data, base, (gpus or {}).get(name, 8), base_label=tag))
    command = str(doc.get("command") or "")
    if any(v.gate for v in views):
        kind = "gate"
    elif command == "deploy":
        kind = "deploy"
    else:
        kind = "compare" if tag else "bench"
    watch = doc.get("traffic") if isinstance(doc.get("traffic"), dict) else None
    if not any(v.bench or v.gate or v.phases or v.traffic or v.gpu_changes is not None for v in views) and not watch:
        raise UserError(
            f"{source}: nothing to draw: no host has a bench, a gate, restart phases, GPU changes or gateway traffic"
        )
    title = {
        "gate": f"Canary gate against {tag}",
        "compare": f"Bench against {tag}",
        "bench": "Engine bench",
        "deploy": "Deploy",
    }[kind]
    return ReportView(
        kind=kind, title=title, new_label="new", baseline_label=tag, hosts=views, generated=generated, watch=watch
    )


def from_baselines(
    old_tag: str,
    old: dict[str, dict],
    new_tag: str,
    new: dict[str, dict],
    *,
    gpus: dict[str, int] | None = None,
    generated: str = "",
) -> ReportView:
    """Two baselines' stored benches side by side: NEW's figures beside OLD's, host by host."""
    for tag, stored in ((old_tag, old), (new_tag, new)):
        if not stored:
            raise UserError(
                f"baseline {tag!r} has no bench results (take one with `k26ops snapshot --tag NAME --bench`)"
            )
    views = []
    for host, bench in new.items():
        base_host = host if host in old else next(iter(old))
        v = host_view(host, {"bench": bench}, old[base_host], (gpus or {}).get(host, 8), new_tag, old_tag)
        v.baseline_host = base_host
        v.settings_differ = figs.spec_differences(bench, old[base_host])
        views.append(v)
    return ReportView(
        kind="compare",
        title=f"{new_tag} against {old_tag}",
        new_label=new_tag,
        baseline_label=old_tag,
        hosts=views,
        generated=generated,
    )


def metric_label(metric: str) -> str:
    return METRICS[metric][1]
