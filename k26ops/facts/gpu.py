"""GPU facts from nvidia-smi: the GPU list, the interconnect, the table header.

Why: preflight compares GPU count, compute capability and driver with the
inventory, and TP8 on PCIe-only hosts (RTX PRO 6000) is bandwidth-bound, so
the interconnect is a fact of its own. Formats vary by driver (header/units,
[N/A], driver 610's KMD/UMD header); NVML errors become values.
"""

from __future__ import annotations

import re

from k26ops.facts import compute_cap
from k26ops.facts.base import Fact, command_missing, first_line, safe, split_marked, strip_ansi
from k26ops.facts.smi_table import parse_list, parse_table

GPU_FIELDS = ("index", "name", "memory.total", "driver_version", "compute_cap", "uuid")
NA_VALUES = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", ""}
_UNIT_RE = re.compile(r"^(-?[\d.]+)\s*(MiB|W|MHz|%|C|KiB|GiB)$")


def nvidia_smi_error(stdout: str, rc: int) -> str | None:
    """A one-line reason when nvidia-smi did not answer, else None."""
    if command_missing(stdout, rc):
        return "nvidia-smi: command not found"
    for pat in (
        r"Failed to initialize NVML[^\n]*",
        r"No devices were found[^\n]*",
        r"NVIDIA-SMI has failed[^\n]*",
        r"Unable to determine the device handle[^\n]*",
    ):
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


def _query_rows(stdout: str, fields):
    """(row dict, raw cells) per data line of a --query-gpu CSV."""
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if cells[0].split(" [")[0] == fields[0]:  # header line, e.g. 'memory.total [MiB]'
            continue
        if len(cells) > len(fields):  # a comma inside the name: keep the middle together
            extra = len(cells) - len(fields)
            i = fields.index("name") if "name" in fields else 0
            cells[i : i + extra + 1] = [", ".join(cells[i : i + extra + 1])]
        yield {f: _value(c) for f, c in zip(fields, cells)}, cells


def parse_query_csv(stdout: str, fields=GPU_FIELDS) -> list[dict]:
    """Rows of `--query-gpu=... --format=csv[,noheader][,nounits]` as dicts keyed by field."""
    return [row for row, _ in _query_rows(stdout, fields)]


def _num(v, kind=int):
    try:
        return kind(v) if v is not None else None
    except ValueError:
        return None


QUERY_FIELDS = GPU_FIELDS + ("pci.bus_id",)  # bus id last: older recordings parse positionally
FALLBACK_FIELDS = tuple(f for f in QUERY_FIELDS if f != "compute_cap")
SECTION = "== k26ops: "
FALLBACK_SECTION, TABLE_SECTION = "query without compute_cap", "table"
_REFUSED = re.compile(r'Field "([^"]+)" is not a valid field to query')
_QUERY_ERRORS = ("[Unknown Error]", "[GPU requires reset]", "ERR!")


def refused_field(stdout: str) -> str | None:
    """The field an older nvidia-smi refused (whatever its exit code), else None."""
    m = _REFUSED.search(stdout)
    return m.group(1) if m else None


def split_sections(stdout: str) -> dict[str, str]:
    """The gpus command's output by section: "query" first, then "== k26ops: <title>" ones."""
    return split_marked(stdout, SECTION, "query")


def _from_query(text: str, fields, source: str) -> list[dict]:
    gpus = []
    for row, raw in _query_rows(text, fields):
        g = {
            "index": _num(row.get("index")),
            "name": row.get("name"),
            "memory_mib": _num(row.get("memory.total")),
            "driver_version": row.get("driver_version"),
            "compute_cap": row.get("compute_cap"),
            "uuid": row.get("uuid"),
            "bus_id": row.get("pci.bus_id"),
        }
        g["sources"] = {k: source for k, v in g.items() if v is not None}
        bad = sorted({e for e in _QUERY_ERRORS for c in raw if c == e})
        g["error"] = f"{', '.join(bad)} in the GPU query" if bad else None
        gpus.append(g)
    return gpus


def _from_table(table: dict, text: str) -> list[dict]:
    m = re.search(_HEADER_RES["driver_version"], text)
    driver = m.group(1) if m else None
    return [
        {
            "index": t["index"],
            "name": t["name"],
            "memory_mib": t["memory_mib"],
            "driver_version": driver,
            "compute_cap": None,
            "uuid": None,
            "bus_id": t["bus_id"],
            "sources": {k: "table" for k in ("index", "name", "memory_mib", "bus_id") if t[k] is not None}
            | ({"driver_version": "table"} if driver else {}),
            "error": None,
        }
        for t in table["gpus"]
    ]


def _merge_table(gpus: list[dict], table: dict) -> None:
    """Bus ids the query lacked, and the table's error markers, onto the GPUs by index."""
    by_index = {t["index"]: t for t in table["gpus"]}
    for g in gpus:
        t = by_index.get(g["index"])
        if not t:
            continue
        if g.get("bus_id") is None and t["bus_id"]:
            g["bus_id"], g["sources"]["bus_id"] = t["bus_id"], "table"
        if t["errors"]:
            why = f"{', '.join(t['errors'])} in nvidia-smi's table"
            g["error"] = f"{g['error']}; {why}" if g["error"] else why


def gpu_errors(gpus: list[dict]) -> list[str]:
    """One line per failed GPU, naming its index and bus id."""
    return [
        f"GPU {g.get('index')} ({g.get('bus_id') or 'bus id unknown'}): {g['error']}" for g in gpus if g.get("error")
    ]


_HANDLE = re.compile(
    r"Unable to determine the device handle for GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-7]): ([^\n]*)"
)


def handle_failures(stdout: str) -> list[dict]:
    """GPUs nvidia-smi could not open ("Unable to determine the device handle for GPU
    0000:03:00.0: Unknown Error"): a fault of that GPU, named by its bus id."""
    return [
        {"bus_id": m.group(1), "error": f"nvidia-smi cannot open it: {m.group(2).strip()}"}
        for m in _HANDLE.finditer(stdout or "")
    ]


@safe
def parse_gpus(stdout: str, rc: int) -> dict:
    """{"count", "gpus": [{index, name, memory_mib, driver_version, compute_cap, uuid, bus_id,
    error, sources}], "source", "query_refused", "gpu_errors", "error"}.

    `stdout` is the gpus command's: the query, and where it was refused or
    showed an error, a query without compute_cap and the plain table
    (sections). `sources` says which of "query", "query_no_cc", "table" or
    "name" (compute capability from a known GPU name) gave each value.
    """
    secs = split_sections(stdout)
    refused = refused_field(secs["query"])
    err = None if refused else nvidia_smi_error(secs["query"], rc)
    if failed := handle_failures(stdout):  # one GPU nvidia-smi cannot open: its fault, not "no GPUs"
        return {
            "count": 0,
            "gpus": [],
            "error": err,
            "gpu_errors": [f"GPU ({f['bus_id']}): {f['error']}" for f in failed],
            "failed_gpus": failed,
        }
    if err:
        return {"count": 0, "gpus": [], "error": err}
    table = parse_table(secs[TABLE_SECTION]) if TABLE_SECTION in secs else None
    gpus, source = ([], None) if refused else (_from_query(secs["query"], QUERY_FIELDS, "query"), "query")
    fallback = secs.get(FALLBACK_SECTION, "")
    if refused and fallback and not refused_field(fallback) and not nvidia_smi_error(fallback, 0):
        gpus, source = _from_query(fallback, FALLBACK_FIELDS, "query_no_cc"), "query_no_cc"
    if not gpus and table and table["gpus"]:
        gpus, source = _from_table(table, secs[TABLE_SECTION]), "table"
    if table:
        _merge_table(gpus, table)
    for g in gpus:
        if g["compute_cap"] is None and source != "query":
            g["compute_cap"] = compute_cap.from_name(g["name"])
            if g["compute_cap"]:
                g["sources"]["compute_cap"] = "name"
    error = None
    if refused and not gpus:
        error = (
            f"nvidia-smi exited {rc}: " if rc else "nvidia-smi: "
        ) + f'Field "{refused}" is not a valid field to query, and no fallback listed GPUs'
    return {
        "count": len(gpus),
        "gpus": gpus,
        "source": source,
        "query_refused": refused,
        "gpu_errors": gpu_errors(gpus),
        "error": error,
    }


_MULTIWORD = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _topo_cells(line: str, is_header: bool) -> list[str]:
    """A matrix line's cells: split on tabs, or where tabs became spaces (logs,
    pasted reports) on runs of whitespace, keeping the header's multi-word
    column names whole. Rows then lose the empty cell before "GPU NUMA ID"
    just as the header has none, so header and row cells stay aligned."""
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    words = line.split()
    if not is_header:
        return words
    text = " ".join(words)
    for name in _MULTIWORD:
        text = text.replace(name, name.replace(" ", "\x00"))
    return [""] + [w.replace("\x00", " ") for w in text.split()]


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
        cells = _topo_cells(line, header is None)
        if header is None:
            if any(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = cells
            continue
        row = cells[0]
        if not re.fullmatch(r"(GPU|NIC)\d+", row):
            break
        matrix[row] = {col: cells[i] for i, col in enumerate(header) if i > 0 and col and i < len(cells)}
    gpus = sorted((k for k in matrix if k.startswith("GPU")), key=lambda s: int(s[3:]))
    links = {f"{a}-{b}": matrix[a].get(b, "") for i, a in enumerate(gpus) for b in gpus[i + 1 :]}
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
    `KMD Version:` / `CUDA UMD Version:`. Also the table's GPUs (with error
    markers), MIG devices and processes (smi_table.parse_table).
    """
    err = nvidia_smi_error(stdout, rc)
    if err:
        return {
            "driver_version": None,
            "cuda_version": None,
            "smi_version": None,
            "error": err,
            "gpu_errors": [f"GPU ({f['bus_id']}): {f['error']}" for f in handle_failures(stdout)],
        }
    out = {"error": None}
    for key, pat in _HEADER_RES.items():
        m = re.search(pat, stdout)
        out[key] = m.group(1) if m and m.group(1) not in ("N/A",) else None
    out["header_style"] = "kmd" if "KMD Version" in stdout else "driver"
    table = parse_table(stdout)
    out["gpu_names"] = [g["name"] for g in table["gpus"]]
    out.update(table)
    out["gpu_errors"] = gpu_errors(
        [dict(g, error=f"{', '.join(g['errors'])} in nvidia-smi's table") for g in table["gpus"] if g["errors"]]
    )
    if out["driver_version"] is None:
        out["error"] = "no driver version in nvidia-smi output: " + first_line(stdout)[:200]
    return out


def _query(fields) -> str:
    return "nvidia-smi --query-gpu=" + ",".join(fields) + " --format=csv,noheader,nounits 2>&1"


# The query; where nvidia-smi refused a field (older than compute_cap) also the
# query without it; where it refused or showed an error, also the plain table.
GPU_COMMAND = (
    f'q=$({_query(QUERY_FIELDS)}); rc=$?; printf "%s\\n" "$q"; '
    f'case "$q" in *"not a valid field"*) echo "{SECTION}{FALLBACK_SECTION}"; {_query(FALLBACK_FIELDS)};; esac; '
    'case "$q" in *"not a valid field"*|*"ERR!"*|*Error*|*"requires reset"*) '
    f'echo "{SECTION}{TABLE_SECTION}"; nvidia-smi 2>&1;; esac; exit $rc'
)


@safe
def parse_gpu_list(stdout: str, rc: int) -> dict:
    """`nvidia-smi -L`: {"gpus": [{index, name, uuid, mig: [...]}], "count", "mig_count", "error"}."""
    err = nvidia_smi_error(stdout, rc)
    if err:
        return {"gpus": [], "count": 0, "mig_count": 0, "error": err}
    out = parse_list(stdout)
    return {**out, "count": len(out["gpus"]), "error": None}


FACTS = {
    "gpus": Fact("gpus", GPU_COMMAND, parse_gpus),
    "gpu_list": Fact("gpu_list", "nvidia-smi -L 2>&1", parse_gpu_list),
    "gpu_topology": Fact("gpu_topology", "nvidia-smi topo -m 2>&1", parse_topology),
    "nvidia_smi": Fact("nvidia_smi", "nvidia-smi 2>&1", parse_smi_header),
}
