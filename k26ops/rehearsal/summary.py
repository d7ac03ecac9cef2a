"""A rehearsal report's figures as people read them, one format per figure, and the one line
a deploy prints per rehearsed host ("rehearsed: ready 31 s, capture 12 s, accept 3.1"). Pure."""

from __future__ import annotations


def figures(rep: dict) -> dict:
    """{"state", "ready", "capture", "accept", "tok/s"} as text (None when not measured): seconds
    as whole seconds, accept length to 2 significant digits after the point, tok/s whole."""
    cap = (rep.get("capture") or {}).get("total_s")
    ready = rep.get("ready_s")
    accept = rep.get("accept_length")
    toks = rep.get("tok_s")
    return {
        "state": rep.get("state"),
        "ready": f"{ready:.0f} s" if ready is not None else None,
        "capture": f"{cap:.0f} s" if cap is not None else ("off" if rep.get("cuda_graphs") is False else None),
        "accept": f"{accept:.2f}" if accept is not None else None,
        "tok/s": f"{toks:.0f}" if toks is not None else None,
    }


def line(rep: dict) -> str:
    """`rehearsed: ready 31 s, capture 12 s, accept 3.10` (what was measured), or the state when it
    did not serve: `rehearsal crashed`."""
    f = figures(rep)
    if f["state"] != "served":
        return f"rehearsal {f['state'] or 'did not run'}"
    parts = [
        f"{k} {f[k]}" if k != "capture" or f[k] != "off" else "CUDA graphs off"
        for k in ("ready", "capture", "accept")
        if f[k] is not None
    ]
    return "rehearsed: " + ", ".join(parts)
