"""Acceptance per draft position from the engine's own histogram: pure functions.

SGLang's /generate meta_info carries `spec_accept_histogram` (tokenizer_manager.py: how
many verify steps accepted exactly 0, 1, 2, ... draft tokens; recorded on the real engine,
tests/data/serving/h200-generate.json). k26ops' load generator sums it over a cell's
requests; SGLang's own benchmark writes no per-request meta_info, so its cells have none.

Draft position k (1-based) is accepted in every step that accepted k or more drafts:
rate(k) = sum(hist[k:]) / sum(hist), as vLLM's per-position acceptance counts it.
"""

from __future__ import annotations


def summed(hists) -> list[int]:
    """Histograms added bin by bin (None and empty ones skipped)."""
    out: list[int] = []
    for h in hists:
        for i, n in enumerate(h or []):
            out += [0] * (i + 1 - len(out))
            out[i] += int(n)
    return out


def histogram_field(hists) -> dict:
    """{"accept_histogram": summed} for a bench cell, or {} when no run had one."""
    total = summed(hists)
    return {"accept_histogram": total} if sum(total) else {}


def by_position(hist) -> list[float]:
    """Acceptance rate of draft positions 1..len(hist)-1 (4 digits); [0.0] when no step
    accepted a draft (the histogram does not say how many positions were drafted)."""
    steps = sum(hist or [])
    if not steps:
        return []
    return [round(sum(hist[k:]) / steps, 4) for k in range(1, max(2, len(hist)))]
