"""`k26ops diagnose log FILE|-` through the real CLI (CliRunner and `python -m`),
its output and its exit codes (0 named or no error, 1 unmatched error, 2 bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from k26ops.cli import cli
from labtools.invoke import cli as k26ops_cli

LOGS = Path(__file__).parent.parent / "data/logs"
ROOT = Path(__file__).resolve().parent.parents[1]


def test_json_output_for_file():
    result = CliRunner().invoke(cli, ["--json", "diagnose", "log", str(LOGS / "shape_mismatch_ddtree_tp8.log")])
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


def run_cli(*args, stdin=None):
    return k26ops_cli(*args, input=stdin)


@pytest.mark.parametrize(
    "name, signature",
    [
        ("shape_mismatch_ddtree_tp8.log", "cuda-graph-shape-mismatch"),
        ("vllm_worker_rank3_capture_oom.log", "cuda-graph-capture-oom"),
        ("ddtree_refused_triton_backend_journald.log", "engine-config-refused"),
    ],
)
def test_named_crash_exits_0(name, signature):
    for args in ([], ["--json"]):
        proc = run_cli(*args, "diagnose", "log", str(LOGS / name))
        assert proc.returncode == 0, proc.stderr
        assert signature in proc.stdout


def test_error_that_matched_nothing_exits_1():
    proc = run_cli("--json", "diagnose", "log", str(LOGS / "unrelated_import_error.log"))
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["signature"] == "unclassified" and data["evidence"].startswith("ImportError:")
    assert data["error_found"] is True
    proc = run_cli("diagnose", "log", str(LOGS / "unrelated_eager_shape.log"))
    assert proc.returncode == 1 and "unclassified" in proc.stdout and "RuntimeError: The size of tensor" in proc.stdout
    assert proc.stderr == ""


def test_clean_log_exits_0_no_crash_found(tmp_path):
    proc = run_cli("diagnose", "log", str(LOGS / "xinfer_compose_clean_startup.log"))
    assert proc.returncode == 0 and "no crash found" in proc.stdout
    assert "unclassified" not in proc.stdout and "evidence" not in proc.stdout
    proc = run_cli("--json", "diagnose", "log", "-", stdin="")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert data["error_found"] is False and data["evidence"] == "" and data["title"] == "no error found"
    assert data["signature"] is None


def test_healthy_log_with_request_errors_exits_0():
    """A vLLM server that answered requests with errors and lived: exit 0, signature null."""
    proc = run_cli("--json", "diagnose", "log", str(LOGS / "vllm_request_errors_kept_serving.log"))
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and data["signature"] is None and data["error_found"] is False
    assert data["detail"] == {"request_errors": 2}


def test_bad_base_is_bad_input():
    proc = run_cli("diagnose", "log", "--base", "nonsense", str(LOGS / "shape_mismatch_bare.log"))
    assert proc.returncode == 2 and "--base" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_missing_and_unreadable_files_are_one_line_errors(tmp_path):
    for target, says in ((tmp_path / "nope.log", "no such file"), (tmp_path, "directory")):
        proc = k26ops_cli("diagnose", "log", str(target))
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and str(target) in proc.stderr and says in proc.stderr
        assert "Traceback" not in proc.stderr


def test_python_m_json_from_stdin():
    proc = subprocess.run(
        [sys.executable, "-m", "k26ops", "--json", "diagnose", "log", "-"],
        input=(LOGS / "capture_oom_tp8.log").read_text(),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["signature"] == "cuda-graph-capture-oom" and data["phase"] == "capture"
