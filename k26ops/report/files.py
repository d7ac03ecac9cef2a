"""Where a report goes when no --report PATH says, and the GPUs per host it divides by."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path


def reports_dir() -> Path:
    """$XDG_DATA_HOME/k26ops/reports (~/.local/share by default), beside the baselines."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")
    return Path(base) / "k26ops" / "reports"


def default_path(kind: str, tag: str | None, now: datetime) -> Path:
    """reports_dir()/<kind>[-<tag>]-<UTC time>.html; a tag's `/` becomes `_`."""
    name = kind + (f"-{re.sub(r'[^A-Za-z0-9._+-]', '_', tag)}" if tag else "")
    return reports_dir() / f"{name}-{now.strftime('%Y%m%d-%H%M%S')}.html"


def gpus_per_host(profile: dict) -> int:
    """GPUs one host serves with: tp_size over the nodes it spans (8 when unsaid)."""
    try:
        tp, nodes = int(profile.get("tp_size") or 8), int(profile.get("nnodes") or 1)
    except (TypeError, ValueError):
        return 8
    return max(1, tp // max(1, nodes))
