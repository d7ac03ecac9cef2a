"""The CLI's start-up imports what every command needs, not what a few do: each run pays
for every module imported at start (a converged deploy is ~0.6 s, half of it imports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parents[1]
# imported only where used (`# lazy:` beside the import says why)
LAZY = ("tomllib", "rich.live")


def test_start_up_leaves_out_what_only_some_runs_use(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("K26OPS_CONFIG", None)
    code = (
        "import sys, k26ops.cli, k26ops.config; assert k26ops.config.load() == {}; "
        f"print(' '.join(m for m in {LAZY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_a_deploy_reads_its_inventory_once_per_purpose(tmp_path, monkeypatch):
    """Every step's control-node checks and the run share one read of the inventory
    (was one per step: 6 reads per deploy; an inventory of 100,000 hosts takes seconds)."""
    import socket

    from k26ops import inventory
    from labtools import invoke

    with socket.socket() as s:  # a loopback port nobody listens on: the host is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        "vars:\n  recipe: lab\n  gpus_per_host: 8\n  model_path: /models/m\n"
        "  launch_module: k26ops_lab_engine\nhosts:\n  h1:\n    address: 127.0.0.1\n"
        f"    port: {port}\n    user: root\n    known_hosts: {tmp_path / 'known_hosts'}\n"
    )
    reads = []
    real = inventory.load
    monkeypatch.setattr(inventory, "load", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    proc = invoke.cli(
        "--json",
        "-i",
        str(inv),
        "--connect-timeout",
        "2",
        "deploy",
        env={"XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)},
    )
    assert proc.returncode != 0 and "unreachable" in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
    assert len(reads) <= 2, reads
