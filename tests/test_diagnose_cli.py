"""`k26ops diagnose log FILE|-` through the real CLI (CliRunner and `python -m`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from k26ops.cli import cli

LOGS = Path(__file__).parent / "data/logs"
ROOT = Path(__file__).resolve().parents[1]


def test_json_output_for_file():
    result = CliRunner().invoke(cli, ["--json", "diagnose", "log",
                                      str(LOGS / "shape_mismatch_ddtree_tp8.log")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["signature"] == "cuda-graph-shape-mismatch"
    assert data["phase"] == "replay" and data["rank"] == "TP5"
    assert "tensor a (8)" in data["evidence"] and "budget+1" in data["suggestion"]
    assert data["detail"] == {"got": 8, "expected": 33, "dim": 0}


def test_stdin_and_human_output():
    text = (LOGS / "none_field_probe_journald.log").read_text()
    result = CliRunner().invoke(cli, ["diagnose", "log", "-"], input=text)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "cuda-graph-none-field" in out and "out_cache_loc" in out
    assert "evidence" in out and "where:" in out and "rank TP0" in out and "suggestion:" in out


def test_unclassified_exits_zero():
    result = CliRunner().invoke(cli, ["--json", "diagnose", "log",
                                      str(LOGS / "unrelated_import_error.log")])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["signature"] == "unclassified" and data["evidence"].startswith("ImportError:")


def test_missing_and_unreadable_files_are_one_line_errors(tmp_path):
    for target, says in ((tmp_path / "nope.log", "no such file"), (tmp_path, "directory")):
        proc = subprocess.run([sys.executable, "-m", "k26ops", "diagnose", "log", str(target)],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and str(target) in proc.stderr and says in proc.stderr
        assert "Traceback" not in proc.stderr


def test_python_m_json_from_stdin():
    proc = subprocess.run([sys.executable, "-m", "k26ops", "--json", "diagnose", "log", "-"],
                          input=(LOGS / "capture_oom_tp8.log").read_text(),
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["signature"] == "cuda-graph-capture-oom" and data["phase"] == "capture"
