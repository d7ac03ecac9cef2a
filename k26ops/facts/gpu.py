"""GPU facts from nvidia-smi: the GPU list, the interconnect, the table header.

Why: preflight compares GPU count, compute capability and driver with the
inventory, and TP8 on PCIe-only hosts (RTX PRO 6000) is bandwidth-bound, so
the interconnect is a fact of its own. Formats vary by driver (header/units,
[N/A], driver 610's KMD/UMD header); NVML errors become values.
"""

from __future__ import annotations

import re

from k26ops.facts.base import Fact, command_missing, first_line, safe, strip_ansi

GPU_FIELDS = ("index", "name", "memory.total", "driver_version", "compute_cap", "uuid")
NA_VALUES = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", ""}
_UNIT_RE = re.compile(r"^(-?[\d.]+)\s*(MiB|W|MHz|%|C|KiB|GiB)$")


def nvidia_smi_error(stdout: str, rc: int) -> str | None:
    """A one-line reason when nvidia-smi did not answer, else None."""
    if command_missing(stdout, rc):
        return "nvidia-smi: command not found"
    for pat in (r"Failed to initialize NVML[^\n]*", r"No devices were found[^\n]*",
                r"NVIDIA-SMI has failed[^\n]*", r"Unable to determine the device handle[^\n]*"):
        m = re.search(pat, stdout)
        if m:
            return m.group(0).strip()
    if rc != 0:
        return f"nvidia-smi exited {rc}: {first_line(stdout)[:200] or 'no output'}"
    return None


def _value(raw: str):
    v = raw.strip()
    if v in NA_VALUES:
        return None
    m = _UNIT_RE.match(v)
    return m.group(1) if m else v


def parse_query_csv(stdout: str, fields=GPU_FIELDS) -> list[dict]:
    """Rows of `--query-gpu=... --format=csv[,noheader][,nounits]` as dicts keyed by field."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if cells[0].split(" [")[0] == fields[0]:  # header line, e.g. 'memory.total [MiB]'
            continue
        if len(cells) > len(fields):  # a comma inside the name: keep the middle together
            extra = len(cells) - len(fields)
            i = fields.index("name") if "name" in fields else 0
            cells[i:i + extra + 1] = [", ".join(cells[i:i + extra + 1])]
        rows.append({f: _value(c) for f, c in zip(fields, cells)})
    return rows


def _num(v, kind=int):
    try:
        return kind(v) if v is not None else None
    except ValueError:
        return None


@safe
def parse_gpus(stdout: str, rc: int) -> dict:
    """{"count", "gpus": [{index, name, memory_mib, driver_version, compute_cap, uuid}], "error"}."""
    err = nvidia_smi_error(stdout, rc)
    if err:
        return {"count": 0, "gpus": [], "error": err}
    gpus = []
    for r in parse_query_csv(stdout):
        gpus.append({"index": _num(r.get("index")), "name": r.get("name"),
                     "memory_mib": _num(r.get("memory.total")),
                     "driver_version": r.get("driver_version"),
                     "compute_cap": r.get("compute_cap"), "uuid": r.get("uuid")})
    return {"count": len(gpus), "gpus": gpus, "error": None}


@safe
def parse_topology(stdout: str, rc: int) -> dict:
    """{"interconnect": "nvlink"|"pcie"|None, "links": {"GPU0-GPU1": "NV18"}, "matrix", "error"}.

    "nvlink" when any GPU pair shows NV#, "pcie" when 2+ GPUs and none does,
    None when fewer than two GPUs (nothing to connect).
    """
    err = nvidia_smi_error(stdout, rc)
    if err:
        return {"interconnect": None, "links": {}, "matrix": {}, "error": err}
    lines = [strip_ansi(l).rstrip() for l in stdout.splitlines()]
    header = None
    matrix: dict[str, dict[str, str]] = {}
    for line in lines:
        if not line.strip():
            if header and matrix:
                break  # the legend follows a blank line
            continue
        cells = [c.strip() for c in line.split("\t")]
        if header is None:
            if any(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = cells
            continue
        row = cells[0]
        if not re.fullmatch(r"(GPU|NIC)\d+", row):
            break
        matrix[row] = {col: cells[i] for i, col in enumerate(header) if i > 0 and col and i < len(cells)}
    gpus = sorted((k for k in matrix if k.startswith("GPU")), key=lambda s: int(s[3:]))
    links = {f"{a}-{b}": matrix[a].get(b, "") for i, a in enumerate(gpus) for b in gpus[i + 1:]}
    if len(gpus) < 2:
        kind = None
    else:
        kind = "nvlink" if any(re.fullmatch(r"NV\d+", v) for v in links.values()) else "pcie"
    return {"interconnect": kind, "gpus": gpus, "links": links, "matrix": matrix, "error": None}


_HEADER_RES = {
    "smi_version": r"NVIDIA-SMI\s+([\w.\-]+)",
    "driver_version": r"(?:Driver|KMD) Version:\s*([\w.\-]+)",
    "cuda_version": r"CUDA (?:UMD )?Version:\s*([\w.\-/]+)",
}


@safe
def parse_smi_header(stdout: str, rc: int) -> dict:
    """Driver and CUDA version from the plain `nvidia-smi` table header.

    Before driver 610: `Driver Version:` / `CUDA Version:`; from 610:
    `KMD Version:` / `CUDA UMD Version:`. Also the GPU names the table shows.
    """
    err = nvidia_smi_error(stdout, rc)
    if err:
        return {"driver_version": None, "cuda_version": None, "smi_version": None, "error": err}
    out = {"error": None}
    for key, pat in _HEADER_RES.items():
        m = re.search(pat, stdout)
        out[key] = m.group(1) if m and m.group(1) not in ("N/A",) else None
    out["header_style"] = "kmd" if "KMD Version" in stdout else "driver"
    out["gpu_names"] = re.findall(r"^\|\s+\d+\s+(.+?)\s{2,}\S+\s*\|", stdout, re.M)
    if out["driver_version"] is None:
        out["error"] = "no driver version in nvidia-smi output: " + first_line(stdout)[:200]
    return out


GPU_QUERY = "nvidia-smi --query-gpu=" + ",".join(GPU_FIELDS) + " --format=csv,noheader,nounits 2>&1"
FACTS = {
    "gpus": Fact("gpus", GPU_QUERY, parse_gpus),
    "gpu_topology": Fact("gpu_topology", "nvidia-smi topo -m 2>&1", parse_topology),
    "nvidia_smi": Fact("nvidia_smi", "nvidia-smi 2>&1", parse_smi_header),
}
