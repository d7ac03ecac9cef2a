"""Metric names in Prometheus' text format (what an engine's /metrics serves), and the
dashboard's names it lacks: pure functions, tested on the real engine's recorded lines."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)")
_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def family_names(text: str) -> set[str]:
    """Every metric family the text serves: `# TYPE` names and sample names (a histogram's
    _bucket/_sum/_count samples count as its family)."""
    typed, samples = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 3:
                typed.add(parts[2])
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            if m:
                samples.add(m.group(1))
    out = set(typed)
    for name in samples:
        family = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s) and name[: -len(s)] in typed), name)
        out.add(family)
    return out


def missing(used: set[str], served: set[str], prefix: str = "sglang:") -> list[str]:
    """The names under `prefix` the dashboard uses and the engine does not serve."""
    return sorted(n for n in used if n.startswith(prefix) and n not in served)
