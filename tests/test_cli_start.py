"""The CLI's start-up imports what every command needs, not what a few do: each run pays
for every module imported at start (a converged deploy is ~0.6 s, half of it imports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# imported only where used (`# lazy:` beside the import says why)
LAZY = ("tomllib", "rich.live")


def test_start_up_leaves_out_what_only_some_runs_use(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("K26OPS_CONFIG", None)
    code = ("import sys, k26ops.cli, k26ops.config; assert k26ops.config.load() == {}; "
            f"print(' '.join(m for m in {LAZY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
