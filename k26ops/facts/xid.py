"""Kernel NVRM Xid events: the `gpu_xid` fact (recent kernel lines, bounded) and a pure
parser shared with `diagnose log`.

Why: the commonest reason an engine dies on a fleet is the GPU under it; the driver says so
in the kernel log ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."), which no
engine log carries. The table below says what each Xid means and what to do, following
NVIDIA's Xid catalogue (docs/reference/gpu-facts.md names the pages and what was checked on each).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime

from k26ops.facts import xid_table
from k26ops.facts.base import Fact, command_missing, safe

# Actions, mildest first (an event's action; a host's is its worst).
ACTIONS = ("none", "restart-app", "reset-gpu", "reboot", "drain-and-rma")
ACTION_TEXT = {
    "none": "no action; watch for repeats",
    "restart-app": "restart the engine (the fault was the program's, or is contained to it)",
    "reset-gpu": "drain the host, stop GPU processes and reset the GPU (nvidia-smi -r -i N) or reboot",
    "reboot": "drain the host and reboot it (a GPU reset cannot reach this GPU)",
    "drain-and-rma": "drain the host, reset the GPU, run diagnostics; if it repeats, RMA the GPU",
}

# xid -> (meaning, kind, action): NVIDIA's whole catalogue, in xid_table.py
XID_TABLE = xid_table.XID_TABLE
# sxid -> (NVIDIA's name, "fatal"/"non-fatal", kind, action): the Fabric Manager guide's SXid tables
SXID_TABLE = xid_table.SXID_TABLE
FATAL_SXID_NOTE = " (fatal NVSwitch errors need the GPUs and NVSwitches reset: a reboot)"
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

# "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus." / older drivers "Xid (0000:01:00): 3, ..."
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?:\.\d)?\): (?P<xid>\d+)(?:, pid=(?P<pid>'[^']*'|[^,\s]+))?"
    r"(?:, name=(?P<name>[^,]+))?,?\s*(?P<message>.*)$"
)
# "NVRM: GPU at 0000:01:00.0 has fallen off the bus." / "NVRM: GPU 0000:2b:00.0: GPU has fallen off
# the bus." / the multi-line "NVRM: The NVIDIA GPU 0000:b3:00.0 ... fallen off the bus"
FALLEN = re.compile(
    r"NVRM: (?:GPU at |GPU |The NVIDIA GPU )(?:PCI:)?(?P<pci>(?:[0-9a-fA-F]{4,8}:)?"
    r"[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?:?(?: has)?(?: GPU has)? fallen off the bus"
)
FALLEN_SPLIT = re.compile(
    r"NVRM: The NVIDIA GPU (?P<pci>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:"
    r"[0-9a-fA-F]{2})(?:\.\d)?\s*$"
)
GPU_AT = re.compile(
    r"NVRM: GPU at (?:PCI:)?(?P<pci>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?:\.\d)?: (?P<uuid>GPU-[0-9a-fA-F-]+)"
)
MAX_EVENTS = 200
# journalctl -o short-iso / short-iso-precise: "2026-12-02T03:04:05+0000" / "...05.123456+00:00"
ISO_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d:?\d\d|Z)\s")


def line_time(line: str) -> float | None:
    """Epoch seconds of a line stamped as journalctl's short-iso prints it, else None (dmesg's
    seconds since boot and syslog's yearless stamps do not say when)."""
    m = ISO_STAMP.match(line.strip())
    if not m:
        return None
    zone = "+0000" if m.group(2) == "Z" else m.group(2).replace(":", "")
    try:
        return datetime.strptime(m.group(1).split(".")[0] + zone, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


@dataclass
class XidEvent:
    xid: int | None  # None for nvidia-smi's own error; 79 for a "fallen off the bus" line without an Xid number
    pci: str | None  # None when a GSP line names only the driver's GPUn; normalised "0000:2b:00" (domain:bus:device)
    message: str
    line: int  # 0-based line in the input
    text: str  # the kernel line from "NVRM:" on
    pid: str | None = None
    name: str | None = None
    meaning: str = ""
    kind: str = "unknown"  # hardware / application / echo / info / unused / unknown (xid_table.py)
    action: str = "none"
    uuid: str | None = None
    gpu: int | None = None  # index, when nvidia-smi's bus ids are known
    caused_by: int | None = None  # "... caused by previous Xid 149": the Xid this one echoes
    time: float | None = None  # epoch seconds, where the line has a full time stamp (journalctl -o short-iso)
    # what reported it: "xid" (NVRM Xid or fallen-off-the-bus), "sxid" (an NVSwitch; `xid` is the
    # SXid), "gsp" (the GSP firmware's own NVRM lines; `xid` is the catalogue's 119/120),
    # "nvidia-smi" (a GPU nvidia-smi cannot open; `xid` None)
    source: str = "xid"
    label: str = ""  # how to name it: "Xid 79", "SXid 12028 (fatal)", "GSP", "nvidia-smi"
    link: int | None = None  # an NVSwitch SXid's link: its "Link 48" or its Severity line's "Engine instance 48"

    def to_json(self) -> dict:
        return asdict(self)


def norm_pci(value: str | None) -> str | None:
    """ "PCI:0000:2b:00", "00000000:2B:00.0", "2b:00" -> "0000:2b:00"; None stays None."""
    if value is None:
        return None
    value = value.strip().lower().removeprefix("pci:")
    value = value.split(".")[0]
    parts = value.split(":")
    if len(parts) == 2:
        parts = ["0"] + parts
    domain, bus, dev = parts[-3], parts[-2], parts[-1]
    return f"{int(domain, 16):04x}:{bus.zfill(2)}:{dev.zfill(2)}"


UNKNOWN_XID = ("not in k26ops' table: see NVIDIA's Xid catalogue", "unknown", "none")
CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
# Xid 154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
RECOVERY = re.compile(r"recovery action changed from .*? to \S+ \(([^)]+)\)")
RECOVERY_ACTIONS = {
    "none": "none",
    "gpu reset required": "reset-gpu",
    "drain and reset": "reset-gpu",
    "drain p2p": "reset-gpu",
    "node reboot required": "reboot",
}

_PCI = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
# NVSwitch: "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ
# interrupt", followed by its "Severity ..." and "Data {...}" lines (the same SXid, same switch)
SXID_LINE = re.compile(
    r"(?P<switch>nvidia-nvswitch\d+): SXid \((?:PCI:)?(?P<pci>" + _PCI + r")(?:\.\d)?\): "
    r"(?P<sxid>\d+), (?P<rest>.*?)\s*$"
)
SXID_SEVERITY = re.compile(r"^(?P<sev>Non-fatal|Fatal)\b,?\s*(?P<what>.*)$", re.IGNORECASE)
# the link an SXid line names: "Fatal, Link 48 LTSSM Fault Up"; its Severity line's "Engine instance 48" (the
# driver logs a link's error with the link as the instance: NVSWITCH_REPORT_FATAL/NONFATAL)
SXID_LINK = re.compile(r"^(?:(?:Non-fatal|Fatal),\s*Link|Severity \d+ Engine instance)\s+(?P<link>\d+)\b", re.I)
# The GSP firmware's faults, in the driver's own words (open-gpu-kernel-modules #446, #1080, #1200)
GSP_FAULTS = (
    (
        119,
        re.compile(
            r"_kgspIsHeartbeatTimedOut: Heartbeat timed out|GSP RM heartbeat timed out|"
            r"LibOS heartbeat timed out"
        ),
        "GSP firmware heartbeat timed out",
    ),
    (
        119,
        re.compile(
            r"Timeout waiting for RPC from GSP|rpcRecvPoll timedout|GSP RPC timeout|"
            r"Timeout after \d+s of waiting for RPC response from \w+ GSP"
        ),
        "GSP firmware RPC timeout",
    ),
    # the GSP firmware failing to boot (open-gpu-kernel-modules #974: "kgspBootstrap_GH100: GSP-FMC reported an
    # error while attempting to boot GSP")
    (
        120,
        re.compile(
            r"GSP-FMC reported an error|error while attempting to boot GSP|cannot proceed with booting GSP|"
            r"Cannot initialize GSP firmware RM"
        ),
        "GSP firmware failed to boot",
    ),
    (
        120,
        re.compile(r"Reset required \[NV_ERR_RESET_REQUIRED\]|GPU marked for reset"),
        "the driver marked the GPU for reset after a GSP fault (reset required)",
    ),
    (
        120,
        re.compile(
            r"GspRmAlloc failed|rpcRmApiAlloc_GSP.*failed|RmInitAdapter failed|kgspInitRm\w*.*failed", re.IGNORECASE
        ),
        "GSP firmware RPC or allocation failure",
    ),
)
GSP_GPU = re.compile(r"NVRM: (?:(?P<drv>GPU\d+) |GPU (?:at )?(?:PCI:)?(?P<pci>" + _PCI + r")(?:\.\d)?:? )")
# nvidia-smi failing for one GPU: "Unable to determine the device handle for GPU 0000:03:00.0: Unknown Error"
# (also "GPU0000:4F:00.0" without the space, and "...: GPU is lost. Reboot the system to recover this GPU")
SMI_HANDLE = re.compile(
    r"Unable to determine the device handle for GPU ?(?P<pci>" + _PCI + r")(?:\.\d)?: "
    r"(?P<why>.*?)\s*$"
)


def _event(xid: int, pci: str, message: str, line: int, text: str, pid=None, name=None) -> XidEvent:
    meaning, kind, action = XID_TABLE.get(xid, UNKNOWN_XID)
    cause = CAUSED_BY.search(message)
    if cause:  # an echo names its cause: the cause's kind and action are what to act on
        cmeaning, kind, action = XID_TABLE.get(int(cause.group(1)), UNKNOWN_XID)
        meaning = f"{meaning}, caused by Xid {cause.group(1)}: {cmeaning}"
    if (recovery := RECOVERY.search(message)) and xid == 154:  # the line names the action
        action = RECOVERY_ACTIONS.get(recovery.group(1).strip().lower(), action)
        kind = "hardware" if action != "none" else "info"
    unknown = ("<unknown>", "")
    return XidEvent(
        xid=xid,
        pci=norm_pci(pci),
        message=message.strip().rstrip(")").strip(),
        line=line,
        text=text,
        pid=None if (pid or "").strip("'") in unknown else pid.strip("'"),
        name=None if (name or "").strip() in unknown else name.strip(),
        meaning=meaning,
        kind=kind,
        action=action,
        caused_by=int(cause.group(1)) if cause else None,
        label=f"Xid {xid}",
    )


def _gsp_event(raw: str, at: str, i: int, events: list[XidEvent]) -> XidEvent | None:
    """A GSP firmware fault line, once per GPU and fault (its lines repeat)."""
    for xid, rx, what in GSP_FAULTS:
        if rx.search(raw):
            g = GSP_GPU.search(raw)
            pci = norm_pci(g.group("pci")) if g and g.group("pci") else None
            drv = g.group("drv") if g and g.group("drv") else None
            if any(e.source == "gsp" and e.message == what and e.pci == pci and e.name == drv for e in events):
                return None
            return XidEvent(
                xid=xid,
                pci=pci,
                message=what,
                line=i,
                text=at,
                name=drv,
                meaning=f"{what} ({XID_TABLE[xid][0]})",
                kind="hardware",
                action="reset-gpu",
                time=line_time(raw),
                source="gsp",
                label="GSP",
            )
    return None


def _other_event(raw: str, i: int, events: list[XidEvent]) -> XidEvent | None:
    """An NVSwitch SXid (its Severity/Data lines fold into the event of that switch and SXid)
    or nvidia-smi failing to open one GPU."""
    if "SXid" in raw and (m := SXID_LINE.search(raw)):
        pci, sxid, rest = norm_pci(m.group("pci")), int(m.group("sxid")), m.group("rest")
        sev = SXID_SEVERITY.match(rest)
        link = int(n.group("link")) if (n := SXID_LINK.match(rest)) else None
        # the same SXid of that switch and link (a Data line names no link: the latest of that SXid)
        prev = next(
            (
                e
                for e in reversed(events[-12:])
                if e.source == "sxid"
                and e.pci == pci
                and e.xid == sxid
                and i - e.line <= 6
                and (link is None or e.link is None or e.link == link)
            ),
            None,
        )
        # a Data/Severity line folds in, and so does the severity-word line of an event whose first line
        # had none (a second severity-word line is another error); the severity-word line is the evidence
        if prev is not None and (not sev or not SXID_SEVERITY.match(prev.message)):
            prev.link = prev.link if prev.link is not None else link
            if sev:
                _sxid_severity(prev, sev)
                prev.message, prev.line, prev.text = rest, i, raw[raw.index(m.group("switch")) :].strip()
            return None
        e = XidEvent(
            xid=sxid,
            pci=pci,
            message=rest,
            line=i,
            text=raw[raw.index(m.group("switch")) :].strip(),
            name=m.group("switch"),
            time=line_time(raw),
            source="sxid",
            meaning=f"NVSwitch SXid {sxid}: severity not in these lines nor in NVIDIA's SXid tables",
            kind="unknown",
            label=f"SXid {sxid}",
            link=link,
        )
        if sxid in SXID_TABLE:  # a Data/Severity line alone: NVIDIA's table gives the severity
            name, severity, e.kind, e.action = SXID_TABLE[sxid]
            e.label = f"SXid {sxid} ({severity})"
            e.meaning = f"NVSwitch SXid {sxid} ({name}), {severity} in NVIDIA's SXid tables" + (
                FATAL_SXID_NOTE if severity == "fatal" else ""
            )
        if sev:
            _sxid_severity(e, sev)
        return e
    if "device handle" in raw and (m := SMI_HANDLE.search(raw)):
        why = m.group("why")
        return XidEvent(
            xid=None,
            pci=norm_pci(m.group("pci")),
            message=why,
            line=i,
            text=raw[raw.index("Unable") :].strip(),
            time=line_time(raw),
            source="nvidia-smi",
            meaning=f"nvidia-smi cannot open this GPU ({why})",
            kind="hardware",
            action="reboot",
            label="nvidia-smi",
        )
    return None


def _sxid_severity(e: XidEvent, sev: re.Match) -> None:
    fatal = sev.group("sev").lower() == "fatal"
    e.kind, e.action = ("hardware", "reboot") if fatal else ("info", "none")
    e.label = f"SXid {e.xid} ({'fatal' if fatal else 'non-fatal'})"
    name = f" ({SXID_TABLE[e.xid][0]})" if e.xid in SXID_TABLE else ""
    e.meaning = f"NVSwitch SXid {e.xid}{name}, {'fatal' if fatal else 'non-fatal'}: {sev.group('what')}" + (
        FATAL_SXID_NOTE if fatal else ""
    )


# The driver's own lines whatever prefix a paste kept: its asserts (`NVRM: GPU0 nvAssertFailedNoLog`,
# seen without `NVRM:` once prefixes are stripped) and the other NVIDIA kernel modules' messages
# (`nvidia-peermem nv_get_p2p_free_callback:127 ERROR ...` beside an Xid 109).
_DRIVER_LINE = re.compile(r"NVRM|\bnvAssert\w*Failed|\bnvidia-(?:peermem|uvm|modeset|nvlink|drm|fs)\b")


def reports_gpu(line: str) -> bool:
    """Whether a line is one of the GPU's or its driver's own reports (an NVRM line or another NVIDIA
    kernel module's, an NVSwitch SXid, nvidia-smi failing to open a GPU): a fault's evidence, never
    an engine's error that it caused."""
    return bool(_DRIVER_LINE.search(line)) or bool(SXID_LINE.search(line)) or bool(SMI_HANDLE.search(line))


def label(event: dict) -> str:
    """'Xid 79', 'SXid 12028 (fatal)', 'GSP', 'nvidia-smi' (events recorded before labels: Xid N)."""
    return event.get("label") or f"Xid {event.get('xid')}"


def parse_kernel_text(text: str, bus_ids: dict | None = None, limit: int = MAX_EVENTS) -> list[XidEvent]:
    """Xid and fallen-off-the-bus events in kernel log text (journalctl -k, dmesg, syslog, or
    lines pasted anywhere), oldest first, the last `limit`. A fallen-off-the-bus line right
    after that GPU's Xid 79 is the same event. `bus_ids` maps a PCI address (any spelling)
    to the GPU index (nvidia-smi's pci.bus_id)."""
    bus = {norm_pci(k): v for k, v in (bus_ids or {}).items()}
    events: list[XidEvent] = []
    uuids: dict[str, str] = {}
    lines = (text or "").splitlines()
    for i, raw in enumerate(lines):
        if "NVRM" not in raw:
            if (e := _other_event(raw, i, events)) is not None:
                events.append(e)
            continue
        at = raw[raw.index("NVRM") :].strip()
        if m := GPU_AT.search(raw):
            uuids[norm_pci(m.group("pci"))] = m.group("uuid")
        if m := XID_LINE.search(raw):
            events.append(
                _event(int(m.group("xid")), m.group("pci"), m.group("message"), i, at, m.group("pid"), m.group("name"))
            )
            events[-1].time = line_time(raw)
            continue
        m = FALLEN.search(raw)
        if not m and (s := FALLEN_SPLIT.search(raw)):
            window = " ".join(lines[i + 1 : i + 3])
            m = s if "fallen off the bus" in window else None
        if m:
            pci = norm_pci(m.group("pci"))
            if any(e.xid == 79 and e.pci == pci and i - e.line <= 5 for e in events[-3:]):
                continue
            events.append(_event(79, pci, "GPU has fallen off the bus", i, at))
            events[-1].time = line_time(raw)
            continue
        if (e := _gsp_event(raw, at, i, events)) is not None:
            events.append(e)
    for e in events:
        e.uuid = uuids.get(e.pci)
        e.gpu = bus.get(e.pci)
    return events[-limit:]


def distinct(events: list[dict]) -> list[dict]:
    """One event per GPU and Xid (a fault repeats its line for every channel it stops)."""
    seen, out = set(), []
    for e in events:
        key = (e.get("gpu"), e.get("pci"), e.get("xid"))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def who(event: dict) -> str:
    """'GPU 3 (0000:2b:00)', or 'GPU (0000:2b:00)' when nvidia-smi does not list that bus id."""
    return (f"GPU {event['gpu']} " if event.get("gpu") is not None else "GPU ") + f"({event.get('pci')})"


def since(xid_fact: dict, start: float | None) -> list[dict]:
    """The fact's events stamped at or after `start` (epoch seconds; the engine unit's
    ActiveEnterTimestamp): the Xids the running engine has lived through. Events without a
    time stamp are left out (their time is unknown); so is everything when `start` is None."""
    if start is None:
        return []
    return [e for e in (xid_fact or {}).get("events") or [] if e.get("time") is not None and e["time"] >= start - 1]


def since_engine_start(status: dict) -> list[dict]:
    """From the engine agent's `status` answer (the unit's show, the host's clocks, the kernel
    Xid lines and nvidia-smi's bus ids): the Xid events since the unit last became active, each
    with its GPU index. The unit's ActiveEnterTimestampMonotonic is turned into wall-clock time
    with the host's own two clocks read in the same call."""
    show, kernel = status.get("show") or {}, status.get("kernel")
    entered = show.get("ActiveEnterTimestampMonotonic") or 0
    if not kernel or not entered or status.get("now") is None:
        return []
    start = status["now"] - (status["now_monotonic_us"] - entered) / 1e6
    fact = parse_xid_fact(kernel.get("stdout", ""), int(kernel.get("rc", 0)))
    with_gpu_index(fact, parse_bus_ids(status.get("bus_ids") or ""))
    return since(fact, start)


def parse_bus_ids(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader` -> [{"index", "bus_id"}]."""
    gpus = []
    for line in (text or "").splitlines():
        index, _, bus = line.partition(",")
        if index.strip().isdigit() and bus.strip():
            gpus.append({"index": int(index), "bus_id": bus.strip()})
    return gpus


def worst_action(events: list[XidEvent]) -> str:
    return max((e.action for e in events), key=ACTIONS.index, default="none")


# ---------------------------------------------------------------- the fact

# Bounded by time (this boot, at most the last day) and count; journalctl when there is a
# journal, else dmesg. Reading the kernel log may need root (dmesg_restrict, the journal's
# groups): the refusal's own line passes the filter, so it is reported, not hidden.
_REFUSALS = "Operation not permitted|insufficient permissions|No journal files|not seeing messages from other users"
XID_COMMAND = (
    "F='NVRM: (Xid|GPU|The NVIDIA GPU)|fallen off the bus|SXid|kgsp|GSP|Reset required|"
    "dmesg: not found|" + _REFUSALS + "'; "
    "if command -v journalctl >/dev/null 2>&1 && ! journalctl -k -b -n 1 --no-pager 2>&1 "
    "| grep -q 'No journal files were found'; then "
    "journalctl -k -b -o short-iso --since '-24h' --no-pager 2>&1 | grep -E \"$F\" | tail -n 400; "
    'else dmesg 2>&1 | grep -E "$F" | tail -n 400; fi; '
    "echo __K26OPS_RC=$?"
)


@safe
def parse_xid_fact(stdout: str, rc: int) -> dict:
    """{"events": [...], "count", "worst_action", "error"}: Xid events of the last day (the GPU
    index is filled in by the caller that knows nvidia-smi's bus ids: `with_gpu_index`)."""
    if command_missing(stdout, rc):
        return {"events": [], "count": 0, "worst_action": "none", "error": "neither journalctl nor dmesg found"}
    text = re.sub(r"^__K26OPS_RC=\d+\s*$", "", stdout, flags=re.M)
    if re.search(
        r"Operation not permitted|No journal files were (?:found|opened)|insufficient permissions"
        r"|not seeing messages from other users",
        text,
    ):
        return {
            "events": [],
            "count": 0,
            "worst_action": "none",
            "error": "the kernel log could not be read (run as root or with become: true)",
        }
    events = parse_kernel_text(text)
    return {
        "events": [e.to_json() for e in events],
        "count": len(events),
        "worst_action": worst_action(events),
        "error": None,
    }


def with_gpu_index(xid_fact: dict, gpus: list[dict]) -> dict:
    """Fill each event's `gpu` from the GPUs' bus ids (nvidia-smi's pci.bus_id)."""
    bus = {norm_pci(g["bus_id"]): g.get("index") for g in gpus or [] if g.get("bus_id")}
    for e in (xid_fact or {}).get("events") or []:
        e["gpu"] = bus.get(e["pci"])
    return xid_fact


FACTS = {"gpu_xid": Fact("gpu_xid", XID_COMMAND, parse_xid_fact, timeout=20.0)}
