"""Readers of nvidia-smi's human-readable outputs: the plain table and `-L`.

Why: the table is what every host can print (old drivers included) and the
only place that shows a failed GPU as `ERR!`; it also holds the MIG devices and
the processes, which must never be counted as GPUs. `-L` is the most common
GPU list people paste and the one that names MIG devices with their UUIDs.
Layouts seen: drivers 340 to 610 (column widths changed several times), so rows
are matched by their cells, not by column positions.
"""

from __future__ import annotations

import re

from k26ops.facts.base import strip_ansi

ERROR_MARKERS = ("ERR!", "GPU requires reset", "Unknown Error")
_BUS = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
# "|   0  NVIDIA H200      On  |   00000000:00:06.0 Off |   0 |" (also "ERR!" as the name,
# a 340-era "0000:01:00.0", no space before the first "|" on old layouts)
_GPU_ROW = re.compile(r"^\|\s*(\d+)\s+(.+?)\s+(On|Off|ERR!|N/A)\s*\|\s*(" + _BUS + r")\s")
_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_MIG_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(\d+)?")
# "|    0   N/A  N/A      441      C   python3      6662MiB |" and the pre-MIG "|    0   489   G   /usr/bin/X   1025MiB |"
_PROC_ROW = re.compile(r"^\|\s*(\d+)\s+(?:(\S+)\s+(\S+)\s+)?(\d+)\s+([CGM+]{1,3})\s+(.+?)\s+(\d+MiB|N/A)\s*\|\s*$")


def _markers(text: str) -> list[str]:
    return [m for m in ERROR_MARKERS if m in text]


def _section(line: str) -> str | None:
    """Which block a header line opens: gpus, mig or processes."""
    low = line.lower()
    if "processes:" in low:
        return "processes"
    if "mig devices:" in low:
        return "mig"
    if re.search(r"\bGPU\s+Name\b", line):
        return "gpus"
    return None


def parse_table(text: str) -> dict:
    """{"gpus": [{index, name, bus_id, memory_used_mib, memory_mib, errors}], "mig_devices", "processes"}.

    Only rows of the GPU block are GPUs; names are kept as printed (a
    truncated "NVIDIA A100-SXM..." stays so). `errors` lists the markers
    (ERR!, GPU requires reset, Unknown Error) anywhere in that GPU's rows.
    """
    gpus, migs, procs = [], [], []
    section, cur = None, None
    for raw in strip_ansi(text).splitlines():
        line = raw.rstrip()
        opened = _section(line)
        if opened:
            section, cur = opened, None
            continue
        if section in ("gpus", None):  # a pasted excerpt may start below the header
            m = _GPU_ROW.match(line)
            if m:
                name = m.group(2).strip()  # "ERR!" in the name cell is the GPU's fault, never its name
                cur = {
                    "index": int(m.group(1)),
                    "name": None if name in ERROR_MARKERS else name,
                    "bus_id": m.group(4),
                    "memory_used_mib": None,
                    "memory_mib": None,
                    "errors": _markers(line),
                }
                gpus.append(cur)
            elif cur is not None and line.startswith("|"):
                mem = _MEM.search(line)
                if mem and cur["memory_mib"] is None:
                    cur["memory_used_mib"], cur["memory_mib"] = int(mem.group(1)), int(mem.group(2))
                cur["errors"] += [e for e in _markers(line) if e not in cur["errors"]]
            elif not line.startswith(("|", "+")):
                section, cur = None, None  # the block ended (blank line, prompt, "[...]")
        elif section == "mig":
            m = _MIG_ROW.match(line)
            if m:
                migs.append(
                    {
                        "gpu": int(m.group(1)),
                        "gi": int(m.group(2)),
                        "ci": int(m.group(3)),
                        "device": int(m.group(4)),
                        "memory_used_mib": int(m.group(5)),
                        "memory_mib": int(m.group(6)),
                        "sm": int(m.group(7)) if m.group(7) else None,
                    }
                )
        elif section == "processes":
            m = _PROC_ROW.match(line)
            if m:
                gi, ci = (None if v in (None, "N/A") else v for v in (m.group(2), m.group(3)))
                procs.append(
                    {
                        "gpu": int(m.group(1)),
                        "gi": gi,
                        "ci": ci,
                        "pid": int(m.group(4)),
                        "type": m.group(5),
                        "name": m.group(6).strip(),
                        "memory_mib": int(m.group(7)[:-3]) if m.group(7) != "N/A" else None,
                    }
                )
    return {"gpus": gpus, "mig_devices": migs, "processes": procs}


_L_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)\s]+)\)\s*$")
_L_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)\s*$")


def parse_list(text: str) -> dict:
    """`nvidia-smi -L`: {"gpus": [{index, name, uuid, mig: [{profile, device, uuid}]}], "mig_count"}."""
    gpus: list[dict] = []
    for line in strip_ansi(text).splitlines():
        m = _L_GPU.match(line)
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "mig": []})
            continue
        m = _L_MIG.match(line)
        if m and gpus:
            gpus[-1]["mig"].append({"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)})
    return {"gpus": gpus, "mig_count": sum(len(g["mig"]) for g in gpus)}
