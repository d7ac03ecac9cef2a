"""`diagnose log` on the issue 42 inputs at their full size: 200 MB of random bytes and one
1 GB line (no newline). Prints, per input, the CLI's wall seconds and peak RSS (the child's,
from the kernel), and what the answer says it left out. Target: one line within 60 s, under
1 GB of memory.

    python bench/diagnose_log.py [--dir DIR]   (writes 1.2 GB of inputs there, removed after)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make(d: Path) -> dict[str, Path]:
    rnd, one = d / "random-200MB.bin", d / "one-line-1GB.log"
    with open(rnd, "wb") as fh:
        for _ in range(200):
            fh.write(os.urandom(1_000_000))
    block = b"x" * (1 << 20)
    with open(one, "wb") as fh:
        for _ in range(1024):
            fh.write(block)
    return {"200 MB random bytes": rnd, "1 GB single line": one}


def run(path: Path) -> tuple[float, float, dict]:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "k26ops", "--json", "diagnose", "log", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    el = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # MiB, largest child so far
    doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"error": p.stderr.strip()[-200:]}
    return el, peak, doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="k26ops-bench-log-", dir=a.dir))
    try:
        for name, path in make(d).items():
            el, peak, doc = run(path)
            print(
                f"{name:22s} {el:6.1f} s  peak RSS <= {peak:6.0f} MiB  signature={doc.get('signature')!r}  "
                f"read: {(doc.get('read') or {}).get('note') or doc.get('error')}"
            )
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
