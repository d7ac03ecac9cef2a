"""The self-test payload run for real here (no GPU: the no-gpu path and the
timeouts), and its recorded real H200 output read back through report.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k26ops.selftest import report
from k26ops.selftest.payload import CHECKS, SCHEMA

ROOT = Path(__file__).resolve().parent.parents[1]
PAYLOAD = ROOT / "k26ops" / "selftest" / "payload.py"
DATA = ROOT / "tests" / "data"


def run(*args, timeout=120):
    return subprocess.run([sys.executable, str(PAYLOAD), *args], capture_output=True, text=True, timeout=timeout)


def has_cuda():
    p = subprocess.run(
        [sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"], capture_output=True
    )
    return p.returncode == 0


def test_help_documents_the_options():
    p = run("--help")
    assert p.returncode == 0
    for opt in ("--expect-gpus", "--expect-cc", "--nvcc", "--min-tflops", "--min-busbw", "--checks", "--timeout-scale"):
        assert opt in p.stdout
    assert "_child" not in p.stdout


def test_module_docstring_documents_the_schema():
    import k26ops.selftest.payload as payload

    for word in ('"schema"', '"status"', '"checks"', '"figure"', '"expected"', "no-gpu", "Exit codes"):
        assert word in payload.__doc__


def test_usage_error_exit_2():
    p = run("--checks", "gpus,warp_drive")
    assert p.returncode == 2 and "warp_drive" in p.stderr


def test_no_gpu_here_is_reported_clearly_exit_3():
    p = run("--expect-gpus", "8", "--expect-cc", "12.0")
    if p.returncode != 3 and has_cuda():  # asked only then: not a torch import at every collection
        pytest.skip("this machine has a GPU")
    assert p.returncode == 3, p.stderr
    doc = json.loads(p.stdout)
    assert report.validate(doc) == []
    assert doc["status"] == "no-gpu" and doc["schema"] == SCHEMA
    assert "torch" in doc["reason"] and ("not importable" in doc["reason"] or "sees no CUDA device" in doc["reason"])
    assert [c["name"] for c in doc["checks"]] == ["gpus"]  # nothing else was attempted
    rows = report.summarize(doc)
    assert rows[0]["status"] == "no-gpu"
    assert report.headline(doc)["exit_code"] == 3


def test_a_check_that_overruns_its_timeout_is_killed_and_reported():
    p = run("--checks", "gpus", "--timeout-scale", "0.0005")  # 45 ms: python cannot even start torch
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["status"] == "fail"
    assert doc["checks"][0]["status"] == "timeout" and "no answer within" in doc["checks"][0]["detail"]
    assert doc["checks"][0]["duration_s"] < 5


@pytest.mark.parametrize("name", ["selftest-h200.json", "selftest-h200-x2.json"])
def test_recorded_real_h200_runs(name):
    doc = json.loads((DATA / name).read_text())
    assert report.validate(doc) == []
    assert doc["status"] == "pass" and [c["name"] for c in doc["checks"]] == CHECKS
    h = report.headline(doc)
    assert h["driver"].startswith("580.") and h["cuda_runtime"] == "13.0" and h["exit_code"] == 0
    assert 600 < h["min_tflops"] < 1000  # H200 dense bf16: ~790 measured, 990 datasheet
    rows = {r["check"]: r for r in report.summarize(doc)}
    assert rows["matmul"]["figure"].endswith("TFLOP/s")
    assert "The size of tensor a (8) must match the size of tensor b (33)" in rows["cuda_graph"]["detail"]
    assert rows["nvcc"]["status"] == "pass" and "sm_90" in rows["nvcc"]["detail"]
    if h["gpus"] == 1:
        assert rows["allreduce"]["status"] == "skip" and h["allreduce_busbw_gbps"] is None
    else:
        assert h["gpus"] == 2 and h["allreduce_busbw_gbps"] > 100  # NV18 between the two H200s


def test_recorded_wrong_expectations_fail_with_reasons():
    doc = json.loads((DATA / "selftest-h200-x2-wrong-expect.json").read_text())
    assert report.validate(doc) == [] and doc["status"] == "fail"
    assert "2 GPUs visible, expected 8" in doc["reason"] and "compute capability 9.0, expected 12.0" in doc["reason"]
    assert report.headline(doc)["exit_code"] == 1


def test_validate_names_problems():
    assert report.validate([]) == ["not a JSON object"]
    probs = report.validate({"schema": "x", "status": "meh", "checks": [{"name": "gpus", "status": "odd"}]})
    assert any("schema" in p for p in probs) and any("status 'meh'" in p for p in probs)
    assert any("checks[0].status" in p for p in probs) and any("'figure'" in p for p in probs)
