"""Bounded input: an alias bomb and an oversized inventory are refused with one
line, fast; a large legitimate inventory (10,000 hosts) still loads."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from labtools import cli  # noqa: E402

from k26ops.inventory import yamlsrc  # noqa: E402

# The classic "billion laughs", inside vars where k26ops merges and walks it.
BOMB = "".join(f"  {c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
BOMB = 'vars:\n  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + BOMB + \
    "hosts: {x: {address: 127.0.0.1}}\n"


def big_inventory(n: int) -> str:
    lines = ["vars: {user: root, gpus_per_host: 8}", "hosts:"]
    lines += [f"  gpu{i:05d}: {{address: 127.0.{i // 250}.{i % 250 + 1}, vars: {{engine_port: {30000 + i % 100}}}}}"
              for i in range(n)]
    lines += ["groups:", "  fleet:", "    hosts: [" + ", ".join(f"gpu{i:05d}" for i in range(n)) + "]"]
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_in_under_a_second(tmp_path):
    p = tmp_path / "bomb.yml"
    p.write_text(BOMB)
    assert len(BOMB) < 600
    t0 = time.monotonic()
    proc = cli("-i", str(p), "inventory", "list", timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "aliases (*name) are expanded: refused" in proc.stderr and str(p) in proc.stderr
    assert took < 5, took  # the interpreter start is most of it; before this, >10 minutes
    t0 = time.monotonic()
    yamlsrc.expanded_size(__import__("yaml").compose(BOMB))  # linear, never expands
    assert time.monotonic() - t0 < 1


def test_oversized_inventory_is_refused_before_it_is_read(tmp_path):
    p = tmp_path / "big.yml"
    with open(p, "w") as fh:  # 50 MB of valid YAML (before: 1.76 GB of memory, not done after 300 s)
        fh.write("hosts: {x: {address: 127.0.0.1}}\nvars:\n  pad:\n")
        fh.write(f"    - {'a' * 44}\n" * (50 * 1024 * 1024 // 51))
    proc = cli("-i", str(p), "inventory", "list", timeout=30)
    assert proc.returncode == 2 and "over the 10,485,760-byte limit: refused" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_ten_thousand_hosts_load(tmp_path):
    p = tmp_path / "fleet.yml"
    p.write_text(big_inventory(10_000))
    from k26ops.inventory import load

    inv = load(p)
    assert len(inv.hosts) == 10_000 and inv.hosts["gpu09999"].vars["engine_port"] == 30099
