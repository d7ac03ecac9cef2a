"""Inventory loading at fleet scale: 1,000 and 10,000 hosts, and the time an
alias bomb and an oversized file take to be refused.

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
from test_inventory_bounds import BOMB, big_inventory  # noqa: E402


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
        for name, fn in cases.items():
            t = timed(fn, a.reps)
            print(f"{name:40s} median {statistics.median(t):7.3f} s   max {max(t):7.3f} s   (n={a.reps})")


if __name__ == "__main__":
    main()
