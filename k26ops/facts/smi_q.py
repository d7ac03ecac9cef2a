"""GPU health from `nvidia-smi -q`: the `gpu_health` fact and its pure parsers.

Why: a GPU can list fine in the query and the table and still be unfit to serve: a
pending row remap or retired page (takes effect at the next GPU reset), a remapping
failure (the GPU can no longer hide bad memory: RMA), volatile uncorrectable ECC, a
hardware or thermal slowdown, a temperature past the slowdown threshold, a recovery
action the driver asks for. `nvidia-smi -q` prints all of it, indented "Key : value".

Healthy counters are zeros ("Uncorrectable Error : 0" is not an error). Aggregate
(lifetime) counters and inactive rows are reported but are not an active fault.
Temperature thresholds come in two spellings: absolute ("GPU Slowdown Temp : 97 C",
older drivers) and T.Limit margins ("GPU T.Limit Temp : 53 C" against "GPU Slowdown
T.Limit Temp : -2 C", newer ones; the margin falling to the slowdown value slows the GPU).
Actions follow NVIDIA's memory error management page
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html): a pending remap or
page retirement needs a GPU reset; a remapping failure needs the GPU serviced.
"""

from __future__ import annotations

import re

from k26ops.facts.base import Fact, safe, strip_ansi
from k26ops.facts.gpu import handle_failures, nvidia_smi_error

# Mildest first: a GPU's action is its worst fault's.
ACTIONS = ("none", "check-cooling", "restart-app", "reset-gpu", "reboot", "drain-and-rma")
ACTION_TEXT = {
    "none": "no action",
    "check-cooling": "check the cooling and power of the host (airflow, fans, PSU); the GPU runs slowed",
    "restart-app": "restart the engine",
    "reset-gpu": "drain the host, stop GPU processes and reset the GPU (nvidia-smi -r -i N) or reboot",
    "reboot": "drain the host and reboot it",
    "drain-and-rma": "drain the host and have the GPU serviced (RMA): it can no longer hide bad memory",
}
GPU_HEADER = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
KV = re.compile(r"^(?P<ind> *)(?P<key>\S.*?)\s*:\s?(?P<val>.*?)\s*$")
NA = {"N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "[Unknown Error]", ""}
# Clocks event (throttle) reasons that mean the hardware is held back; SW Power Cap under load,
# Idle, Applications Clocks, Sync Boost and Display Clock are the normal running of a GPU.
SLOWDOWN_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")


def parse_tree(text: str) -> dict:
    """-q text -> {"driver_version", "cuda_version", "gpus": [{"bus_id", "tree"}]}.
    `tree` nests sections by indentation: {"Remapped Rows": {"Pending": "No", ...}}. A pasted
    section without its "GPU 0000..." header is one GPU with bus_id None."""
    out = {"driver_version": None, "cuda_version": None, "gpus": []}
    cur = None
    stack: list[tuple[int, dict]] = []  # open sections: (indent of their title, their dict)
    raw_lines = strip_ansi(text).splitlines()
    # a paste indented as a whole (a markdown code block): its GPU lines set the left margin
    margins = [len(x) - len(x.lstrip()) for x in raw_lines if GPU_HEADER.match(x.strip())]
    margin = min(margins) if margins else 0
    for raw in raw_lines:
        line = raw.rstrip()
        if margin and line[:margin].strip() == "":
            line = line[margin:]
        if not line.strip() or line.lstrip().startswith(("=", "# ", "$ ")):  # banner, pasted prompt
            continue
        m = GPU_HEADER.match(line)
        if m:
            cur = {"bus_id": m.group("bus"), "tree": {}}
            out["gpus"].append(cur)
            stack = []
            continue
        indent = len(line) - len(line.lstrip())
        kv = KV.match(line) if ":" in line else None
        if indent == 0 and cur is None and kv:  # the log's header
            key = kv.group("key")
            if key in ("Driver Version", "CUDA Version"):
                out[key.lower().replace(" ", "_")] = kv.group("val")
            continue
        if cur is None:  # a section pasted without its GPU line
            cur = {"bus_id": None, "tree": {}}
            out["gpus"].append(cur)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else cur["tree"]
        if kv:
            # a value with deeper lines under it ("HW Slowdown : Not Active" over "HW Thermal
            # Slowdown"): those stay in the same section, as siblings
            parent[kv.group("key")] = kv.group("val")
        else:
            section: dict = {}
            parent[line.strip()] = section
            stack.append((indent, section))
    return out


def _int(v):
    if v is None:
        return None
    m = re.match(r"^-?\d+", str(v).strip())
    return int(m.group(0)) if m else None


def _temp(v):
    """'56 C' -> 56, 'N/A' -> None."""
    return None if v is None or v.strip() in NA else _int(v)


def _sec(tree: dict, *names):
    for n in names:
        if isinstance(tree.get(n), dict):
            return tree[n]
    return {}


def _flat(section: dict) -> dict:
    """A section with nested children flattened (HW Slowdown's sub-reasons)."""
    out = {}
    for k, v in section.items():
        if isinstance(v, dict):
            out.update(_flat(v))
        else:
            out[k] = v
    return out


def _fault(faults, fault, evidence, action):
    faults.append({"fault": fault, "evidence": evidence, "action": action})


def gpu_health(gpu: dict) -> dict:
    """One GPU's health sections and its active faults: {"bus_id", "ecc", "retired_pages",
    "remapped_rows", "clock_event_reasons_active", "temperature", "recovery_action",
    "reset_status", "gsp_firmware", "faults": [{"fault", "evidence", "action"}], "action"}."""
    t, faults = gpu["tree"], []
    ecc = _sec(t, "ECC Errors")
    aggregate = _flat(_sec(ecc, "Aggregate"))

    def uncorrectable(section):
        """Uncorrectable counters: "DRAM Uncorrectable : 0" (Ampere+) or the "Double Bit" section's
        "Total" (older drivers, where Single Bit and Double Bit hold the same keys)."""
        out = {
            k: _int(v)
            for k, v in section.items()
            if not isinstance(v, dict) and ("Uncorrectable" in k or "Double Bit" in k) and _int(v) is not None
        }
        double = section.get("Double Bit")
        if isinstance(double, dict):
            total = _int(double.get("Total"))
            out.update(
                {"Double Bit Total": total}
                if total is not None
                else {f"Double Bit {k}": _int(v) for k, v in double.items() if _int(v) is not None}
            )
        return out

    vol_unc, agg_unc = uncorrectable(_sec(ecc, "Volatile")), uncorrectable(_sec(ecc, "Aggregate"))
    for k, n in vol_unc.items():
        if n:
            _fault(faults, "ecc-uncorrectable", f"ECC Errors, Volatile: {k} : {n}", "reset-gpu")
    if str(aggregate.get("SRAM Threshold Exceeded", "")).strip() == "Yes":
        _fault(
            faults, "sram-threshold-exceeded", "ECC Errors, Aggregate: SRAM Threshold Exceeded : Yes", "drain-and-rma"
        )
    for k in ("Channel Repair Pending", "TPC Repair Pending"):
        if str(ecc.get(k, "")).strip() == "Yes":
            _fault(faults, k.lower().replace(" ", "-"), f"ECC Errors: {k} : Yes", "reset-gpu")
    if str(ecc.get("Unrepairable Memory", "")).strip() == "Yes":
        _fault(faults, "unrepairable-memory", "ECC Errors: Unrepairable Memory : Yes", "drain-and-rma")

    retired = _sec(t, "Retired Pages")
    pend_key = next((k for k in ("Pending Page Blacklist", "Pending Page Retirement", "Pending") if k in retired), None)
    if pend_key and str(retired[pend_key]).strip() == "Yes":
        _fault(faults, "page-retirement-pending", f"Retired Pages: {pend_key} : Yes", "reset-gpu")

    rows = _sec(t, "Remapped Rows")
    if str(rows.get("Remapping Failure Occurred", "")).strip() == "Yes":
        _fault(faults, "row-remap-failure", "Remapped Rows: Remapping Failure Occurred : Yes", "drain-and-rma")
    if str(rows.get("Pending", "")).strip() == "Yes":
        unc = rows.get("Uncorrectable Error")
        _fault(
            faults,
            "row-remap-pending",
            "Remapped Rows: Pending : Yes" + (f" (Uncorrectable Error : {unc})" if unc else ""),
            "reset-gpu",
        )

    reasons = _flat(_sec(t, "Clocks Event Reasons", "Clocks Throttle Reasons"))
    active = [k for k, v in reasons.items() if str(v).strip() == "Active"]
    slowed = [k for k in SLOWDOWN_REASONS if k in active]
    if slowed:
        _fault(
            faults,
            "thermal-slowdown" if any("Thermal" in k for k in slowed) else "hw-slowdown",
            "Clocks Event Reasons: " + ", ".join(f"{k} : Active" for k in slowed),
            "check-cooling",
        )

    temp = _sec(t, "Temperature")
    tt = {
        "current_c": _temp(temp.get("GPU Current Temp")),
        "slowdown_c": _temp(temp.get("GPU Slowdown Temp")),
        "shutdown_c": _temp(temp.get("GPU Shutdown Temp")),
        "tlimit_c": _temp(temp.get("GPU T.Limit Temp")),
        "slowdown_tlimit_c": _temp(temp.get("GPU Slowdown T.Limit Temp")),
        "shutdown_tlimit_c": _temp(temp.get("GPU Shutdown T.Limit Temp")),
        "memory_c": _temp(temp.get("Memory Current Temp")),
    }
    cur = tt["current_c"]
    if cur is not None and tt["shutdown_c"] is not None and cur >= tt["shutdown_c"]:
        _fault(
            faults,
            "over-shutdown-temp",
            f"Temperature: GPU Current Temp {cur} C >= shutdown {tt['shutdown_c']} C",
            "check-cooling",
        )
    elif cur is not None and tt["slowdown_c"] is not None and cur >= tt["slowdown_c"]:
        _fault(
            faults,
            "over-slowdown-temp",
            f"Temperature: GPU Current Temp {cur} C >= slowdown {tt['slowdown_c']} C",
            "check-cooling",
        )
    elif (
        tt["tlimit_c"] is not None and tt["slowdown_tlimit_c"] is not None and tt["tlimit_c"] <= tt["slowdown_tlimit_c"]
    ):
        _fault(
            faults,
            "over-slowdown-temp",
            f"Temperature: GPU T.Limit Temp {tt['tlimit_c']} C <= slowdown "
            f"T.Limit {tt['slowdown_tlimit_c']} C (current {cur} C)",
            "check-cooling",
        )

    recovery = t.get("GPU Recovery Action")
    if recovery and recovery.strip() not in NA and recovery.strip().lower() != "none":
        # NVML's recovery actions: GPU reset, node reboot, drain P2P, drain and reset
        act = "reboot" if "reboot" in recovery.lower() else "reset-gpu"
        _fault(faults, "recovery-action", f"GPU Recovery Action : {recovery.strip()}", act)
    reset = _sec(t, "GPU Reset Status")
    for k, v in reset.items():
        if str(v).strip() == "Yes":
            _fault(faults, "reset-required", f"GPU Reset Status: {k} : Yes", "reset-gpu")

    gsp = t.get("GSP Firmware Version")
    return {
        "bus_id": gpu.get("bus_id"),
        "ecc_mode": (_sec(t, "ECC Mode").get("Current") or None),
        "ecc": {
            "volatile_uncorrectable": sum(v for v in vol_unc.values() if v) if vol_unc else None,
            "aggregate_uncorrectable": sum(v for v in agg_unc.values() if v) if agg_unc else None,
        },
        "retired_pages": {k: v for k, v in retired.items() if not isinstance(v, dict)} or None,
        "remapped_rows": {
            "pending": rows.get("Pending"),
            "failure": rows.get("Remapping Failure Occurred"),
            "uncorrectable": _int(rows.get("Uncorrectable Error")),
            "correctable": _int(rows.get("Correctable Error")),
        }
        if rows
        else None,
        "clock_event_reasons_active": active,
        "temperature": tt,
        "recovery_action": recovery,
        "reset_status": {k: v for k, v in reset.items() if not isinstance(v, dict)} or None,
        "gsp_firmware": None if gsp is None or gsp.strip() in NA else gsp.strip(),
        "faults": faults,
        "action": max((f["action"] for f in faults), key=ACTIONS.index, default="none"),
    }


def parse_health(text: str) -> dict:
    """Every GPU's health from `nvidia-smi -q` text (pure; the fact's parser wraps it)."""
    tree = parse_tree(text)
    gpus = [gpu_health(g) for g in tree["gpus"]]
    return {
        "driver_version": tree["driver_version"],
        "gpus": gpus,
        "faults": sum(len(g["faults"]) for g in gpus),
        "action": max((g["action"] for g in gpus), key=ACTIONS.index, default="none"),
        "error": None,
    }


@safe
def parse_health_fact(stdout: str, rc: int) -> dict:
    err = nvidia_smi_error(stdout, rc)
    failed = [
        {
            "bus_id": f["bus_id"],
            "faults": [{"fault": "gpu-unreachable", "evidence": f["error"], "action": "reboot"}],
            "action": "reboot",
        }
        for f in handle_failures(stdout)
    ]  # nvidia-smi cannot open that GPU: its fault
    if err and not re.search(r"^\s*GPU [0-9A-Fa-f]{4,8}:", stdout or "", re.MULTILINE):
        if failed:
            return {"driver_version": None, "gpus": failed, "faults": len(failed), "action": "reboot", "error": None}
        return {"driver_version": None, "gpus": [], "faults": 0, "action": "none", "error": err}
    health = parse_health(stdout)
    if failed:
        health["gpus"] += failed
        health["faults"] += len(failed)
        health["action"] = max([health["action"], "reboot"], key=ACTIONS.index)
    return health


def norm_bus(bus: str | None) -> str | None:
    """'00000000:00:06.0' / '0000:00:06.0' -> '0000:00:06.0' (lower case, 4-digit domain)."""
    if not bus:
        return None
    m = re.match(r"^(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.([0-9A-Fa-f]))?$", bus.strip())
    if not m:
        return bus.lower()
    dom = int(m.group(1) or "0", 16)
    return f"{dom:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{(m.group(4) or '0').lower()}"


def with_gpu_index(health: dict, gpus: list[dict]) -> dict:
    """Fill each GPU's `index` from the gpus fact's bus ids (nvidia-smi's pci.bus_id)."""
    bus = {norm_bus(g.get("bus_id")): g.get("index") for g in gpus or [] if g.get("bus_id")}
    for g in (health or {}).get("gpus") or []:
        g["index"] = bus.get(norm_bus(g.get("bus_id")))
    return health


def fault_lines(health: dict) -> list[str]:
    """One line per GPU with an active fault: 'GPU 0 (00000000:19:00.0): row-remap-pending
    (Remapped Rows: Pending : Yes); action: reset-gpu: drain the host, ...'."""
    out = []
    for g in (health or {}).get("gpus") or []:
        if not g.get("faults"):
            continue
        who = f"GPU {g['index']}" if g.get("index") is not None else "GPU"
        who += f" ({g['bus_id']})" if g.get("bus_id") else ""
        what = ", ".join(f"{f['fault']} ({f['evidence']})" for f in g["faults"])
        out.append(f"{who}: {what}; action: {g['action']}: {ACTION_TEXT[g['action']]}")
    return out


FACTS = {"gpu_health": Fact("gpu_health", "nvidia-smi -q 2>&1", parse_health_fact, timeout=30.0)}
