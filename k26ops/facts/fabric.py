"""The fabric manager's reasons: the `fabric_manager` fact and its pure parser.

Why: on an NVSwitch host (HGX/DGX H100, H200, B200, B300) the GPUs form their NVLink fabric
only through nvidia-fabricmanager; when it does not run, CUDA fails at init
(cudaErrorSystemNotReady) or NCCL falls back to PCIe, while every GPU still looks healthy to
nvidia-smi. systemd says only "failed"; the reason is in the unit's journal lines, which the
fabric manager writes as `nv-fabricmanager[PID]: ...` (or, from driver 570,
`nvidia-fabricmanager-start.sh[PID]: ...`), and in /var/log/fabricmanager.log. Both are read
bounded (the last 40 journal lines of this boot, the last 20 error lines of the log).

Reasons named, each on public real output (tests/data/facts/pub-*-fm-*, MANIFEST.json):
  version-mismatch   "fabric manager NVIDIA GPU driver interface version A don't match with
                     driver version B": the package is not the loaded driver's exact version
  nothing-to-do      NV_WARN_NOTHING_TO_DO: no NVSwitch for it to manage. Not a fault on a
                     host without NVSwitches; on an NVSwitch host of NVLink 5 (B200/B300) the
                     NVLink subnet manager (NVLSM) is missing (fabric manager user guide)
  config-invalid     "fabric manager config file item: X has an invalid value"
  failed             any other failure: systemd's own line ("Control process exited ...",
                     "Failed with result ...", "Failed to start ...") is the evidence
"""

from __future__ import annotations

import re

from k26ops.facts.base import Fact, command_missing, safe, split_marked

UNIT = "nvidia-fabricmanager.service"
SEP = "--- k26ops:"
GUIDE_URL = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html"

ACTION_TEXT = {
    "install-matching": "install nvidia-fabricmanager of exactly the loaded driver's version "
    "(`k26ops provision` pins both), then start it",
    "install-nvlsm": "on an NVLink 5 NVSwitch host (B200/B300) install the NVLink subnet manager (nvlsm) "
    "the fabric manager needs; on older ones check that the NVSwitch driver sees the switches",
    "fix-config": "fix the named item in /usr/share/nvidia/nvswitch/fabricmanager.cfg, then start it",
    "read-log": "read `journalctl -u nvidia-fabricmanager` and /var/log/fabricmanager.log, fix the cause "
    "and start it; GPUs on an NVSwitch host have no NVLink fabric until it runs",
    "start": "start it (systemctl start nvidia-fabricmanager) and enable it: "
    "an NVSwitch host has no NVLink fabric without it",
    "install": "install nvidia-fabricmanager of the driver's version (`k26ops provision` does it on NVSwitch hosts)",
    "none": "no action",
}

MISMATCH = re.compile(
    r"fabric manager NVIDIA GPU driver interface version (?P<fm>[\d.]+) do(?:n|esn)\S?t match "
    r"with driver version (?P<driver>\d+(?:\.\d+)*)"
)
NOTHING = re.compile(r"NV_WARN_NOTHING_TO_DO")
CONFIG = re.compile(r"fabric manager config file item: (?P<item>\S+) has an invalid value")
SYSTEMD_FAIL = re.compile(
    r"(?:Control process exited, code=\S+ status=\S+|Main process exited, code=\S+ status=\S+"
    r"|Failed with result '[^']+'|Failed to start .*fabric manager.*)",
    re.I,
)


def reasons(text: str) -> list[dict]:
    """Named reasons in fabric manager journal/log text, most specific first: [{"reason",
    "evidence", "action", ...}]. A systemd failure line is a reason only when nothing more
    specific was found."""
    out: list[dict] = []
    seen = set()
    generic = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        evidence = line[line.find("fabric manager") if "fabric manager" in line else 0 :][:240]
        if m := MISMATCH.search(line):
            r = {
                "reason": "version-mismatch",
                "action": "install-matching",
                "fabric_manager_version": m.group("fm"),
                "driver_version": m.group("driver").rstrip("."),
            }
        elif NOTHING.search(line):
            r = {"reason": "nothing-to-do", "action": "install-nvlsm"}
            evidence = line[line.find("request to") if "request to" in line else 0 :][:240]
        elif m := CONFIG.search(line):
            r = {"reason": "config-invalid", "action": "fix-config", "item": m.group("item")}
        else:
            if generic is None and (m := SYSTEMD_FAIL.search(line)):
                generic = {"reason": "failed", "action": "read-log", "evidence": m.group(0)}
            continue
        if r["reason"] not in seen:
            seen.add(r["reason"])
            out.append({**r, "evidence": evidence})
    if not out and generic:
        out.append(generic)
    return out


STARTING = re.compile(r"systemd\[1\]: Starting .*fabric manager", re.I)


def last_start(journal: str) -> str:
    """The journal lines from systemd's last "Starting NVIDIA fabric manager service..." on: the
    reasons of the latest start, not of an earlier one that was since fixed."""
    lines = journal.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if STARTING.search(line)]
    return "".join(lines[starts[-1] :] if starts else lines)


def _show(text: str) -> dict:
    d = {}
    for line in text.splitlines():
        k, eq, v = line.partition("=")
        if eq:
            d[k.strip()] = v.strip()
    return d


@safe
def parse_fabric_manager(stdout: str, rc: int) -> dict:
    """{"present", "active_state", "sub_state", "result", "reasons", "error"}: the unit's state
    (systemctl show) and the reasons in its journal and log of this boot."""
    s = split_marked(stdout, SEP, "show")
    show = _show(s.get("show", ""))
    if not show and command_missing(stdout, rc):
        return {
            "present": False,
            "active_state": None,
            "sub_state": None,
            "result": None,
            "reasons": [],
            "error": "systemctl not found",
        }
    present = show.get("LoadState") == "loaded"
    text = last_start(s.get("journal", "")) + "\n" + s.get("log", "")
    return {
        "present": present,
        "active_state": show.get("ActiveState"),
        "sub_state": show.get("SubState"),
        "result": show.get("Result"),
        "reasons": reasons(text) if present else [],
        "error": None,
    }


def verdict(fm: dict, nvswitch: dict | None) -> dict | None:
    """What the fabric manager means for this host: None when it does not concern it (no unit
    and no NVSwitch), else {"ok", "reason", "evidence", "action", "line"}. NV_WARN_NOTHING_TO_DO
    on a host without NVSwitches is the fabric manager having nothing to manage: ok."""
    if not isinstance(fm, dict) or fm.get("error"):
        return None
    switches = bool((nvswitch or {}).get("present")) if isinstance(nvswitch, dict) else False
    if not fm.get("present"):
        if not switches:
            return None
        return _v(False, "not-installed", "NVSwitches found, no nvidia-fabricmanager unit", "install")
    state = fm.get("active_state")
    if state in ("active", "activating", "reloading"):
        return _v(True, None, f"nvidia-fabricmanager {state}", "none")
    found = list(fm.get("reasons") or [])
    if found and found[0]["reason"] == "nothing-to-do" and not switches:
        return _v(True, "nothing-to-do", "not needed: no NVSwitch on this host (NV_WARN_NOTHING_TO_DO)", "none")
    if not found:
        if not switches and state == "inactive":
            return _v(True, None, "nvidia-fabricmanager inactive, no NVSwitch on this host", "none")
        return _v(
            False,
            "not-running",
            f"nvidia-fabricmanager {state or 'unknown'}"
            + (f" ({fm['result']})" if fm.get("result") not in (None, "", "success") else ""),
            "start",
        )
    r = found[0]
    return _v(False, r["reason"], r["evidence"], r["action"])


def _v(ok: bool, reason, evidence: str, action: str) -> dict:
    line = f"nvidia-fabricmanager {reason}: {evidence}; action: {ACTION_TEXT[action]}" if not ok else evidence
    return {"ok": ok, "reason": reason, "evidence": evidence, "action": action, "line": line}


COMMAND = (
    f"systemctl show -p LoadState -p ActiveState -p SubState -p Result {UNIT} 2>&1; "
    f'if [ "$(systemctl show -p LoadState --value {UNIT} 2>/dev/null)" = loaded ]; then '
    f"echo '{SEP}journal'; journalctl -u {UNIT} -b -o short-iso --no-pager -n 40 2>&1 | tail -n 40; "
    f"echo '{SEP}log'; tail -n 2000 /var/log/fabricmanager.log 2>/dev/null "
    "| grep -iE 'error|fail|match|invalid' | tail -n 20; fi; true"
)

FACTS = {"fabric_manager": Fact("fabric_manager", COMMAND, parse_fabric_manager, timeout=20.0)}
