"""`diagnose log` on huge or hostile input (issue 42): bounded memory (its time: bench/diagnose_log.py).

Before: 200 MB of random bytes died with MemoryError at 4.4 GB, and one 1 GB line gave no
answer in 300 s. Now the input is streamed (its first 1 MiB and last 3 MiB of lines kept, each
line cut at 4 KiB) and the answer says what was left out. Measured here on smaller sizes, in a
child process (its peak RSS from the kernel); bench/diagnose_log.py runs the full sizes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from k26ops.diagnose import logread

REPO = Path(__file__).resolve().parent.parents[1]
DATA = REPO / "tests" / "data"


def _run(path: Path) -> tuple[subprocess.CompletedProcess, float]:
    """k26ops --json diagnose log PATH in a child: (result, peak RSS of that child in MiB). The
    child runs under a fresh wrapper whose RUSAGE_CHILDREN is that child's alone (this worker's
    own counts every child it ever had: another test's larger one would hide ours)."""
    wrapper = (
        "import json, resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr,\n"
        "                  'peak': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
    )
    w = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "k26ops", "--json", "diagnose", "log", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    r = json.loads(w.stdout)
    return subprocess.CompletedProcess([], r["rc"], r["out"], r["err"]), r["peak"] / 1024  # KiB -> MiB


def test_random_bytes_and_one_huge_line_answer_in_bounded_memory(tmp_path):
    rnd = tmp_path / "random.bin"
    with open(rnd, "wb") as fh:
        for _ in range(64):
            fh.write(os.urandom(1 << 20))  # 64 MiB
    p, peak = _run(rnd)
    assert p.returncode in (0, 1), (p.stdout, p.stderr)
    doc = json.loads(p.stdout)
    assert doc["read"]["left_out"] > 0 and "left out" in doc["read"]["note"], doc["read"]
    assert peak < 400, peak  # MiB: the whole file decoded would be over 600

    one = tmp_path / "one-line.log"
    with open(one, "wb") as fh:
        for _ in range(256):
            fh.write(b"x" * (1 << 20))  # 256 MiB, no newline
    p, peak = _run(one)
    assert p.returncode == 0, (p.stdout, p.stderr)
    doc = json.loads(p.stdout)
    assert doc["error_found"] is False and doc["read"]["cut"] == 1, doc
    assert peak < 200, peak  # (the time it takes: bench/diagnose_log.py)


def test_the_crash_at_the_end_of_a_huge_log_is_named_at_its_own_line():
    crash = (DATA / "rehearsal").glob("*.log")
    crash_text = None
    for f in sorted(crash):
        from k26ops.diagnose.classify import classify

        d = classify(f.read_text(errors="replace"))
        if d.signature not in (None, "unclassified") and d.line:
            crash_text, want = f.read_bytes(), d
            break
    assert crash_text, "a recorded crash log"
    filler = b"".join(b"INFO filler line %d of a long healthy run\n" % i for i in range(200_000))  # ~8 MiB
    got = logread.read_bounded(io.BytesIO(filler + crash_text))
    assert got.left_out > 0
    from k26ops.diagnose.classify import classify

    d = classify(got.text)
    assert d.signature == want.signature
    assert got.input_line(d.line) == 200_000 + want.line


def test_small_logs_are_read_whole_and_lines_cut_only_past_the_bound():
    got = logread.read_bounded(io.BytesIO(b"a\nb\n" + b"y" * 5000 + b"\nz"))
    assert got.text == "a\nb\n" + "y" * 4096 + " [... 904 bytes cut]\nz"
    assert (got.lines, got.left_out, got.cut) == (4, 0, 1)
    assert got.input_line(3) == 3
    whole = logread.read_bounded(io.BytesIO(b"one\ntwo\n"))
    assert whole.text == "one\ntwo" and whole.note() is None
