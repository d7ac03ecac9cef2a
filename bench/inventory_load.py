"""Inventory loading at fleet scale: 1,000 and 10,000 hosts, inputs just under
each bound (1.97 M aliased values; ~215,000 hosts in 10 MB: loaded, and listed
by the CLI, CPU seconds and peak memory), and the time an alias bomb and an
oversized file take to be refused.

    python bench/inventory_load.py [--reps 5]

Prints the median and max wall time per case (no hosts are contacted)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from k26ops.errors import UserError  # noqa: E402
from k26ops.inventory import load  # noqa: E402
from labtools.inventories import BOMB, alias_values, big_inventory, many_hosts  # noqa: E402


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        cases = {}
        for n in (1_000, 10_000):
            p = d / f"{n}.yml"
            p.write_text(big_inventory(n))
            cases[f"load {n:,} hosts ({p.stat().st_size / 1e6:.1f} MB)"] = lambda p=p: load(p)
        bomb = d / "bomb.yml"
        bomb.write_text(BOMB)
        big = d / "big.yml"
        with open(big, "w") as fh:  # 50 MB of valid YAML
            fh.write("hosts: {x: {address: 127.0.0.1}}\nvars:\n  pad:\n")
            fh.write(f"    - {'a' * 44}\n" * (50 * 1024 * 1024 // 51))

        def refused(p):
            try:
                load(p)
            except UserError:
                return
            raise SystemExit(f"{p} was not refused")

        cases[f"refuse alias bomb ({len(BOMB)} bytes)"] = lambda: refused(bomb)
        cases["refuse 50 MB file"] = lambda: refused(big)
        aliases = d / "aliases.yml"
        aliases.write_text(alias_values())
        fleet = d / "fleet.yml"
        fleet.write_text(many_hosts())
        cases[f"load 1.97M aliased values ({aliases.stat().st_size} bytes)"] = lambda: load(aliases)
        cases[f"load ~215,000 hosts ({fleet.stat().st_size / 1e6:.1f} MB)"] = lambda: load(fleet)
        # first: a child forked from a parent holding 215k loaded hosts reports their memory as its peak
        for what, path in (("aliases", aliases), ("215k hosts", fleet)):
            for args in (["inventory", "list"], ["inventory", "list", "--json"]):
                cpu, peak = cli_cost(path, args)
                print(f"CLI {what}: {' '.join(args):24s} {cpu:7.2f} CPU s   peak {peak / 1024:6.0f} MB")
        for name, fn in cases.items():
            t = timed(fn, a.reps)
            print(f"{name:40s} median {statistics.median(t):7.3f} s   max {max(t):7.3f} s   (n={a.reps})")


def cli_cost(path: Path, args: list[str]) -> tuple[float, int]:
    """CPU seconds and peak RSS (KB) of one CLI run, output discarded (a shared
    machine's wall clock measures the neighbours, CPU time measures k26ops)."""
    import os
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-i", str(path), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[1],
    )
    _pid, status, usage = os.wait4(proc.pid, 0)  # this child's own usage, not all children's
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} on {path}: exit {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


if __name__ == "__main__":
    main()
