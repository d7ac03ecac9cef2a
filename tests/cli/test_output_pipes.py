"""Output that is not a fleet table (issue 34.9): piped, `inventory show` and the
bench tables are never wrapped at 80 columns; bench figures are never in
e-notation; `bench --compare` says per figure which way is better and whether
it got better or worse; `--diff` is coloured on a terminal (a real pty) and
verbatim in a pipe."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from k26ops.enginebench import figures as figs
from labtools import REPO
from labtools.invoke import k26ops

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _bench(toks: float, ttft: float, accept: float) -> dict:
    stat = lambda v: {"median": v, "min": v * 0.99, "max": v * 1.01, "n": 5}  # noqa: E731
    return {
        "generator": "k26ops loadgen",
        "generator_why": "lab",
        "spec": {"input_len": 16, "output_len": 16, "seed": 1, "runs": 5},
        "cells": [
            {
                "concurrency": 64,
                "temperature": 0.0,
                "figures": {"tok/s": stat(toks), "ttft_p50_ms": stat(ttft), "accept": stat(accept)},
            }
        ],
    }


def test_figures_are_never_in_e_notation():
    assert figs.plain_number(20833.3) == "20830"
    assert figs.plain_number(2.083e4) == "20830"
    assert figs.plain_number(3.2) == "3.2" and figs.plain_number(0.01234567) == "0.01235"
    assert figs.plain_number(100) == "100" and figs.plain_number(0) == "0"
    for x in (1e-5, 123456.7, 9.99e6, 0.5):
        assert "e" not in figs.plain_number(x), x


def test_compare_says_which_way_is_better(capsys):
    from k26ops.cli.benchopts import render_bench, render_compare

    now, base = _bench(20833.3, 48.0, 3.2), _bench(25000.0, 40.0, 3.2)
    rows = {r["figure"]: r for r in figs.compare(now, base)}
    assert rows["tok/s@c64/t0"]["verdict"] == "worse" and rows["tok/s@c64/t0"]["better"] == "higher"
    assert rows["ttft_p50_ms@c64/t0"]["verdict"] == "worse" and rows["ttft_p50_ms@c64/t0"]["better"] == "lower"
    assert rows["accept@c64/t0"]["verdict"] == "within noise"
    faster = {r["figure"]: r["verdict"] for r in figs.compare(base, now)}
    assert faster["tok/s@c64/t0"] == "better" and faster["ttft_p50_ms@c64/t0"] == "better"
    render_compare("gpu-rtx01.dc1", "gpu-rtx01.dc1", "prod-2026-11-30", now, base)
    render_bench("gpu-rtx01.dc1", now)
    out = capsys.readouterr().out  # not a terminal: the piped path
    lines = out.splitlines()
    assert "e+0" not in out and "20830" in out and "25000" in out, out
    tok = [ln for ln in lines if ln.strip().startswith("tok/s@c64/t0")]
    assert len(tok) == 1 and "output tok/s" in tok[0] and "worse (higher is better)" in tok[0], out
    assert "20830 (20620-21040)" in tok[0] and "ranges apart, p 0.008" in tok[0], out  # the spread beside the verdict
    ttft = [ln for ln in lines if ln.strip().startswith("ttft_p50_ms@c64/t0")]
    assert len(ttft) == 1 and "worse (lower is better)" in ttft[0], out
    assert any(ln.strip().startswith("accept@c64/t0") and "within noise" in ln for ln in lines), out


def test_inventory_show_piped_keeps_long_values_whole(tmp_path):
    long = "/models/" + "Kimi-K2.6-Instruct-FP8-" * 5 + "tp8"
    inv = tmp_path / "inv.yml"
    inv.write_text(f"hosts:\n  gpu-rtx01.dc1:\n    connection: local\n    vars:\n      model_path: {long}\n")
    proc = k26ops("-i", str(inv), "inventory", "show", "gpu-rtx01.dc1", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert any(long in line and "vars.model_path" in line for line in proc.stdout.splitlines()), proc.stdout
    assert "\x1b[" not in proc.stdout


DIFF_SCRIPT = """
from k26ops.cli.changes import render_changes
from k26ops.transport.fleet import HostResult
d = "--- a/etc/k26ops/sglang.env\\n+++ b/etc/k26ops/sglang.env\\n@@ -1 +1 @@\\n-A=1\\n+A=2\\n"
render_changes([HostResult("h", "changed", data={"steps": [{"step": "service", "changes": ["env"],
                "diffs": [d]}]})], check=True, diff=True)
"""


def _diff_output(tty: bool) -> str:
    env = {**os.environ, "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    if not tty:
        return subprocess.run(
            [sys.executable, "-c", DIFF_SCRIPT], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
        ).stdout
    primary, secondary = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", DIFF_SCRIPT], stdout=secondary, stderr=secondary, cwd=REPO, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(primary)
    return b"".join(chunks).decode()


def test_diff_is_coloured_on_a_terminal_only():
    term = _diff_output(tty=True)
    assert "\x1b[32m+A=2" in term and "\x1b[31m-A=1" in term, repr(term)
    piped = _diff_output(tty=False)
    assert "\x1b[" not in piped and "-A=1\n+A=2" in piped, repr(piped)
