"""Read the self-test payload's JSON (schema in payload.py's docstring).

Runs on the control node: `summarize` turns one host's document into table
rows for `k26ops selftest`, `headline` into the few figures a fleet table
shows per host, `validate` names what is wrong with a document that did not
come from a known payload version (no exception for a merely failing host).
"""

from __future__ import annotations

from k26ops.selftest.payload import CHECKS, EXIT_FAIL, EXIT_NO_GPU, EXIT_OK, SCHEMA

STATUSES = {"pass", "fail", "skip", "timeout", "error"}
EXIT_CODES = {"pass": EXIT_OK, "fail": EXIT_FAIL, "no-gpu": EXIT_NO_GPU}


def validate(doc) -> list[str]:
    """Problems with the document's shape; [] when it is a valid self-test result."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    if doc.get("status") not in EXIT_CODES:
        problems.append(f"status {doc.get('status')!r} is not one of {sorted(EXIT_CODES)}")
    checks = doc.get("checks")
    if not isinstance(checks, list):
        return problems + ["checks is not a list"]
    for i, c in enumerate(checks):
        if not isinstance(c, dict):
            problems.append(f"checks[{i}] is not an object")
            continue
        if c.get("name") not in CHECKS:
            problems.append(f"checks[{i}].name {c.get('name')!r} is unknown")
        if c.get("status") not in STATUSES:
            problems.append(f"checks[{i}].status {c.get('status')!r} is unknown")
        for key in ("figure", "unit", "expected", "detail", "duration_s", "data"):
            if key not in c:
                problems.append(f"checks[{i}] has no {key!r}")
    return problems


def _fmt_num(x) -> str:
    if x is None:
        return ""
    return f"{x:g}" if isinstance(x, int) or abs(x) >= 100 or x == int(x) else f"{x:.2f}".rstrip("0").rstrip(".")


def _fmt_expected(e) -> str:
    if not e:
        return ""
    lo, hi, text = e.get("min"), e.get("max"), e.get("text")
    if lo is not None and hi is not None:
        rng = _fmt_num(lo) if lo == hi else f"{_fmt_num(lo)}..{_fmt_num(hi)}"
    elif lo is not None:
        rng = f">= {_fmt_num(lo)}"
    elif hi is not None:
        rng = f"<= {_fmt_num(hi)}"
    else:
        rng = ""
    return "; ".join(p for p in (rng, text) if p)


def summarize(doc: dict) -> list[dict]:
    """One row per check: {"check", "status", "figure", "expected", "detail", "seconds"} (strings)."""
    rows = []
    for c in doc.get("checks", []):
        fig = _fmt_num(c.get("figure"))
        if fig and c.get("unit"):
            fig = f"{fig} {c['unit']}"
        rows.append(
            {
                "check": c.get("name", "?"),
                "status": c.get("status", "?"),
                "figure": fig,
                "expected": _fmt_expected(c.get("expected")),
                "detail": c.get("detail", ""),
                "seconds": _fmt_num(c.get("duration_s")),
            }
        )
    if doc.get("status") == "no-gpu":
        rows = [dict(r, status="no-gpu") if r["check"] == "gpus" else r for r in rows]
    return rows


def headline(doc: dict) -> dict:
    """Per-host figures for a fleet table: status, reason, GPUs, worst TFLOP/s, bus GB/s, versions."""
    by = {c.get("name"): c for c in doc.get("checks", [])}

    def fig(name):
        c = by.get(name)
        return c.get("figure") if c and c.get("status") in ("pass", "fail") else None

    versions = (by.get("versions") or {}).get("data", {})
    return {
        "status": doc.get("status"),
        "reason": doc.get("reason"),
        "host": doc.get("host"),
        "gpus": fig("gpus"),
        "min_tflops": fig("matmul"),
        "allreduce_busbw_gbps": fig("allreduce"),
        "driver": versions.get("driver"),
        "cuda_runtime": versions.get("cuda_runtime"),
        "torch": versions.get("torch"),
        "exit_code": EXIT_CODES.get(doc.get("status"), EXIT_FAIL),
    }
