"""Per-signature details (which field was None, which sizes mismatched, ...)
and the suggestion that fits them.

Why separate: signatures stay plain data; extracting numbers and field names
from a match and the frames around it is the only code each kind needs.
"""

from __future__ import annotations

import re

from k26ops.diagnose import chains
from k26ops.diagnose import signatures as S
from k26ops.diagnose.logtext import Line
from k26ops.release import launch_rules

_FB_FIELD = re.compile(r"\b(?:forward_batch|fb|batch)\.((?:spec_info\.)?\w+)")
_BUF_FIELD = re.compile(r"\bbuffers?\.(\w+)\s*\[")
_ALLOC = re.compile(r"Tried to allocate ([\d.]+ [KMGT]i?B)")
_FREE = re.compile(r"of which ([\d.]+ [KMGT]i?B) is free")
_BS = re.compile(r"Capturing batches \((?:bs=)?(\d+)")
_OPTYPE = re.compile(r"OpType=(\w+)")
_NCCL_VERSION = re.compile(r"NCCL version ([\d.]+\S*)")


def _int(value):
    if value is None:
        return None
    value = value.strip()
    return int(value) if value.isdigit() else value


def _innermost(lines: list[Line], i: int) -> tuple[str, str] | None:
    """(function, code) of the frame closest to the error at line i."""
    first, _last, _ = chains.chain(lines, i)
    found = chains.frames(lines, first, i)
    return (found[-1][1], found[-1][2]) if found else None


def _none_field(m: re.Match, lines: list[Line], i: int) -> dict:
    groups = m.groupdict()
    detail = {
        "field": groups.get("field"),
        "index": _int(groups.get("index")),
        "side": groups.get("side"),
        "graph": groups.get("graph"),
        "copy": groups.get("site"),
    }
    if groups.get("arg") is not None:  # torch._foreach_copy_(dsts, srcs)
        detail["side"] = "src" if groups["arg"] == "1" else "dst"
    if groups.get("arg_name") == "src":
        detail["side"] = "src"
    if groups.get("attr"):
        detail["attribute"] = groups["attr"]
    inner = _innermost(lines, i)
    if inner:
        detail["function"] = inner[0]
        if not detail["field"]:
            code = inner[1]
            if detail.get("side") != "dst" and "copy_(" in code and _FB_FIELD.search(code):
                detail["field"] = _FB_FIELD.findall(code)[-1]
            elif _BUF_FIELD.search(code) and groups.get("attr") is None:
                detail["field"] = _BUF_FIELD.search(code).group(1)
    return {k: v for k, v in detail.items() if v is not None}


def _shape(m: re.Match) -> dict:
    g = m.groupdict()
    detail = {
        "got": _int(g.get("a")),
        "expected": _int(g.get("b")),
        "dim": _int(g.get("dim")),
        "field": g.get("field"),
        "graph": g.get("graph"),
        "copy": g.get("site"),
    }
    return {k: v for k, v in detail.items() if v is not None}


def _oom(lines: list[Line], i: int, evidence: str) -> dict:
    detail = {}
    if m := _ALLOC.search(evidence):
        detail["tried_to_allocate"] = m.group(1)
    if m := _FREE.search(evidence):
        detail["free"] = m.group(1)
    for j in range(i, -1, -1):
        if m := _BS.search(lines[j].text):
            detail["batch_size"] = int(m.group(1))
            break
    return detail


def _config(evidence: str, sig: S.Signature) -> tuple[dict, str]:
    """The launch rule the refusal names, and that rule's fix."""
    if m := re.match(S.ARGPARSE_REFUSAL, evidence):
        args = (m.group("args") or "").split()
        flags = [a for a in args if a.startswith("-")] or ([m.group("arg")] if m.group("arg") else [])
        detail = {"argparse": m.group("argparse").split(":")[0], "flags": flags or args}
        what = m.group("argparse") + (f": {m.group('args')}" if m.group("args") else "")
        return detail, S.ARGPARSE_SUGGESTION.format(what=what)

    for name, rx in S.CONFIG_RULE_MESSAGES:
        if re.search(rx, evidence, re.IGNORECASE):
            rule = next(r for r in launch_rules.RULES if r.name == name)
            return (
                {"rule": name, "flag": rule.flag},
                S.CONFIG_RULE_SUGGESTION.format(rule=name, where=rule.where, fix=rule.fix),
            )
    exc = chains.EXC_LINE.match(evidence)
    return ({"exception": exc.group("type")} if exc else {}), sig.suggestion


def compute_capability(text: str) -> str | None:
    """The GPU's compute capability where the log shows it ("8.6"), else None."""
    for rx in S.COMPUTE_CAPABILITY:
        if m := rx.search(text):
            if m.groupdict().get("cc"):
                return m.group("cc")
            sm = m.group("sm")
            return f"{sm[:-1]}.{sm[-1]}"
    return None


def oom_detail(phase: str | None, fallback: str | None) -> tuple[dict, str]:
    """(detail, suggestion) of an OOM outside capture, by the phase the traceback shows."""
    for name, _rx, where, fix in S.OOM_PHASES:
        if name == phase:
            return {"phase": name}, S.GPU_OOM.suggestion.format(where=where, fix=fix[0].upper() + fix[1:] + ".")
    where = "while serving" if fallback == "replay" else "at start-up" if fallback is None else f"({fallback})"
    return (
        {"phase": "serving" if fallback == "replay" else "startup"},
        S.GPU_OOM.suggestion.format(
            where=where,
            fix="Lower --mem-fraction-static, --max-running-requests or "
            "--chunked-prefill-size, or use more GPUs; check `nvidia-smi` for other "
            "processes on these GPUs.",
        ),
    )


def detail_for(
    sig: S.Signature, m: re.Match, lines: list[Line], i: int, algorithm: str | None, base: str | None = None
) -> tuple[dict, str]:
    """(detail, suggestion) for a hit of `sig` at line i."""
    evidence = lines[i].text
    if sig is S.NONE_FIELD:
        detail = _none_field(m, lines, i)
        where = f"{detail.get('side', 'tensor')}[{detail['index']}]" if "index" in detail else ""
        if detail.get("graph"):
            where = f"{detail['graph']} graph, {detail.get('copy') or 'buffer copy'}"
        if "field" in detail:
            head = f"`{detail['field']}`" + (f" ({where})" if where else "") + " was None. "
            return detail, head + sig.suggestion + " " + S.NONE_FIELD_NAMED.format(**detail)
        head = f"{where} was None. " if where else ""
        return detail, head + sig.suggestion + " " + S.NONE_FIELD_UNNAMED
    if sig is S.SHAPE_MISMATCH:
        detail = _shape(m)
        sizes = (
            f" When copying into a graph buffer, tensor a ({detail['got']}) is the buffer and b "
            f"({detail['expected']}) the batch."
            if "got" in detail
            else ""
        )
        ddtree = (
            S.DDTREE_SHAPE_FIXED_BASE.format(where=S.VERIFY_AT_BUDGET_PLUS_1[base])
            if base in S.VERIFY_AT_BUDGET_PLUS_1
            else S.DDTREE_SHAPE_SUGGESTION
        )
        if algorithm == "DDTREE":
            return detail, ddtree + sizes
        if algorithm == "DFLASH":
            return detail, sig.suggestion + " If DDTree runs on the DFLASH worker: " + ddtree
        return detail, sig.suggestion
    if sig is S.CAPTURE_OOM:
        return _oom(lines, i, evidence), sig.suggestion
    if sig is S.ILLEGAL_MEMORY_ACCESS:
        carried = re.search(r"watchdog|ProcessGroupNCCL", evidence, re.IGNORECASE)
        return ({"reported_by": "nccl-watchdog"} if carried else {}), sig.suggestion
    if sig is S.NCCL_FAILURE:
        detail = {"kind": "timeout" if re.search(r"time(?:d)?\s*out", evidence, re.I) else "error"}
        if op := _OPTYPE.search(evidence):
            detail["op"] = op.group(1)
        if ver := _NCCL_VERSION.search(evidence):
            detail["nccl_version"] = ver.group(1).rstrip(",.")
        return detail, sig.suggestion
    if sig is S.WEIGHT_FILE_CORRUPT:
        return {"reason": m.group("reason").strip()}, sig.suggestion
    if sig is S.CONFIG_REFUSED:
        return _config(evidence, sig)
    if sig is S.BACKEND_UNSUPPORTED_GPU:
        exc = chains.EXC_LINE.match(evidence)
        detail = {"requirement": re.sub(r"\s+", " ", m.group("requirement")).strip()}
        if exc:
            detail["exception"] = exc.group("type")
        if cc := compute_capability("\n".join(line.text for line in lines)):
            detail["compute_capability"] = cc
        return detail, sig.suggestion + (f" This GPU's compute capability: {cc}." if cc else "")
    if sig is S.GPU_ERROR_TEXT:
        what = re.sub(r"\s+", " ", m.group("what")).strip()
        return {
            "error": "nvlink" if "nvlink" in what.lower() else "uncorrectable-ecc",
            "reported_by": "cuda",
            "action": "reset-gpu",
        }, sig.suggestion
    if sig is S.SPEC_REFUSED:
        return {"exception": m.group("exc").split(".")[-1]}, sig.suggestion
    return {}, sig.suggestion
