"""Bounded input: an alias bomb and an oversized inventory are refused with one
line, fast; a large legitimate inventory (10,000 hosts) still loads."""

from __future__ import annotations

import sys
import time

from k26ops.inventory import yamlsrc
from labtools.inventories import BOMB, alias_values, big_inventory, many_hosts
from labtools.invoke import cli


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


def timed_cli(*args: str, timeout: float = 600):
    """Run the CLI as a subprocess; (process, CPU seconds that process used). CPU time,
    not wall time: this machine is shared, and a wall clock there measures the
    neighbours. The child's own rusage (wait4), not RUSAGE_CHILDREN: that also
    counts whatever else this test process reaps meanwhile (a lab's nspawn tree)."""
    import os
    import subprocess
    import tempfile

    from labtools import REPO

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(
            [sys.executable, "-m", "k26ops", *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO
        )
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                p.wait()
                raise subprocess.TimeoutExpired(p.args, timeout)
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        proc = subprocess.CompletedProcess(p.args, p.returncode, out.read().decode(), err.read().decode())
    return proc, usage.ru_utime + usage.ru_stime


def test_aliases_just_under_the_value_limit_list_and_show_in_seconds(tmp_path, full_size):
    """Before: a list.pop(0) walk over every aliased copy, past 300 s."""
    text = alias_values()
    p = tmp_path / "aliases.yml"
    p.write_text(text)
    assert len(text) < 450
    assert 1_900_000 < yamlsrc.expanded_size(__import__("yaml").compose(text)) < yamlsrc.MAX_EXPANDED_NODES
    for args in (["inventory", "list"], ["inventory", "show", "x"], ["inventory", "list", "--json"]):
        proc, took = timed_cli("-i", str(p), *args, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert took < 15, (args, took)  # 1 to 3.5 CPU-s once redact_vars walks each alias once (was 2.4 to 6.3)
        if "--json" not in args:
            assert "--json shows all" in proc.stdout  # the table cuts a value of megabytes
            assert "is a !vault value" in proc.stdout  # the walk still finds what it must note


def test_hosts_just_under_the_size_limit_list_in_seconds(tmp_path, full_size):
    """Before: add_host's list membership made loading quadratic (past 200 s, 1.2 GB)."""
    p = tmp_path / "fleet.yml"
    p.write_text(many_hosts())
    assert yamlsrc.MAX_BYTES - 1000 < p.stat().st_size <= yamlsrc.MAX_BYTES
    proc, took = timed_cli("-i", str(p), "inventory", "list", timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert took < 60, took  # 34 CPU-s measured here at the last merge (was > 200 s wall, quadratic)
    assert "gpu214000" in proc.stdout
