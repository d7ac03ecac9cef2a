"""`k26ops selftest` end to end: the real CLI against the real lab (no GPU: every
host reports "no GPU", exit 3), against this machine through `connection: local`,
and the recorded real H200 results shown through the same table code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from k26ops import inventory
from k26ops.cli.commands.selftest import checks_table
from k26ops.host.preflight import expectations
from k26ops.selftest.report import validate
from k26ops.selftest.run import default_host_timeout, payload_args
from labtools.invoke import cli, cli_json, k26ops, k26ops_json, lab_ssh

DATA = Path(__file__).parent.parent / "data"
H200_X2 = DATA / "selftest-h200-x2.json"
LOCAL = "hosts:\n  here:\n    connection: local\n"


def _local(tmp_path: Path, extra: str = "") -> Path:
    p = tmp_path / "local.yml"
    p.write_text(LOCAL + extra)
    return p


# ------------------------------------------------------------------ the lab


def test_lab_selftest_says_no_gpu_once_per_host(lab):
    proc = k26ops("selftest", env=lab.env(), timeout=300)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    names = [h.name for h in lab.hosts]
    for name in names:
        mine = [ln for ln in lines if ln.startswith(f"{name}:")]
        assert len(mine) == 1, lines
        assert mine[0].startswith(f"{name}: no GPU — ")
        assert re.search(r"torch .*(not importable|sees no CUDA device)", mine[0])
        assert "python " in mine[0]  # which python ran it
    assert lines[-1] == f"{len(names)} no GPU"
    assert len(lines) == len(names) + 1  # no tables for hosts without GPUs


def test_lab_selftest_json(lab):
    rc, doc = k26ops_json("selftest", env=lab.env(), timeout=300)
    assert rc == 3 and doc["exit_code"] == 3
    assert set(doc["hosts"]) == {h.name for h in lab.hosts}
    inv = {h.name: expectations(h.vars) for h in inventory.load(lab.inventory).select(None)}
    for name, h in doc["hosts"].items():
        assert h["status"] == "no-gpu" and h["error"].startswith("no GPU: "), h
        assert h["python_source"] in ("release", "python3")
        st = h["selftest"]
        assert validate(st) == [] and st["status"] == "no-gpu"
        want = inv[name]  # the inventory's expectations reached the payload
        cc = want["compute_capability"]
        cc = cc.split(",") if isinstance(cc, str) else [str(c) for c in cc]
        assert st["expected"] == {"gpus": want["gpus_per_host"], "compute_cap": cc}
        assert h["headline"]["exit_code"] == 3
    # The payload's temp dir is gone from every host.
    for h in lab.hosts:
        left = lab_ssh(lab.dir, h.port, "ls -d /tmp/k26ops-selftest.* /opt/k26ops/state/selftest.* 2>/dev/null; true")
        assert left.stdout.strip() == "", (h.name, left.stdout)


def test_lab_selftest_limit_and_bad_checks(lab):
    name = lab.hosts[0].name
    rc, doc = k26ops_json("-l", name, "selftest", env=lab.env(), timeout=300)
    assert rc == 3 and list(doc["hosts"]) == [name]
    proc = k26ops("selftest", "--checks", "gpus,warp", env=lab.env())
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "k26ops: error: --checks: unknown check(s) warp (known: gpus,versions,cuda_graph,triton,matmul,allreduce,nvcc)"
    )


# ------------------------------------------------------ connection: local


@pytest.fixture(scope="module")
def local_json(tmp_path_factory):
    """`--json selftest` here, once for the two tests that read it (each run imports torch
    in the payload: ~2 CPU-s), with host vars that set the expectations."""
    inv = _local(
        tmp_path_factory.mktemp("local"), "    vars: {gpus_per_host: 1, compute_capability: ['9.0'], min_driver: 570}\n"
    )
    return cli_json("-i", str(inv), "selftest", timeout=300)


def test_local_selftest_no_gpu(tmp_path, local_json):
    proc = cli("-i", str(_local(tmp_path)), "selftest", timeout=300)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("here: no GPU — ") and lines[-1] == "1 no GPU" and len(lines) == 2
    rc, doc = local_json
    h = doc["hosts"]["here"]
    assert rc == 3 and h["status"] == "no-gpu" and h["python_source"] == "python3"
    assert h["selftest"]["host"] == __import__("socket").gethostname()  # it ran here


def test_local_selftest_expectations_from_host_vars(local_json):
    rc, doc = local_json
    assert rc == 3
    assert doc["hosts"]["here"]["selftest"]["expected"] == {"gpus": 1, "compute_cap": ["9.0"]}


def test_host_deadline(tmp_path, monkeypatch):
    """A python that never answers: the host fails at its deadline, one line. The
    deadline is the default one made 1 s (the option's floor is 10 s: 10 s of waiting)."""
    from k26ops.selftest import run as selftest

    hung = tmp_path / "hung-python"
    hung.write_text("#!/bin/sh\nsleep 300\n")
    hung.chmod(0o755)
    monkeypatch.setattr(selftest, "default_host_timeout", lambda gpus, scale: 1.0)
    proc = cli("-i", str(_local(tmp_path)), "selftest", "--python", str(hung), timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    line = proc.stdout.strip().splitlines()[0]
    assert line.startswith("here: failed — host deadline of 1s exceeded")
    proc = cli("-i", str(_local(tmp_path)), "selftest", "--host-timeout", "9")
    assert proc.returncode == 2 and "--host-timeout" in proc.stderr, proc.stderr


def test_missing_python_is_one_line(tmp_path):
    proc = cli("-i", str(_local(tmp_path)), "selftest", "--python", "/nonexistent/python")
    assert proc.returncode == 1
    assert proc.stdout.startswith("here: failed — no python to run the self-test: /nonexistent/python not found")


# ------------------------------------------------ recorded real H200 results


def test_recorded_h200_x2_table():
    proc = cli("selftest", "--from-file", str(H200_X2))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first = out.splitlines()[0]
    assert first.startswith("vm: pass — 2 GPUs, min 793 TFLOP/s, all-reduce 302.25 GB/s, driver 580.159.04")
    for check in ("gpus", "versions", "cuda_graph", "triton", "matmul", "allreduce", "nvcc"):
        assert re.search(rf"│ {check} +│ pass ", out), check
    assert "793 TFLOP/s" in out and ">= 450" in out and "302.25 GB/s" in out and "1.4 s compile" in out
    assert out.strip().splitlines()[-1] == "1 pass"


def test_recorded_h200_table_code_directly():
    doc = json.loads(H200_X2.read_text())
    con = Console(width=200, record=True)
    con.print(checks_table(doc, title="h200"))
    text = con.export_text()
    row = next(ln for ln in text.splitlines() if "allreduce" in ln)
    assert "pass" in row and "302.25 GB/s" in row and ">= 10" in row


def test_recorded_wrong_expectation_fails():
    rc, doc = cli_json("selftest", "--from-file", str(DATA / "selftest-h200-x2-wrong-expect.json"))
    assert rc == 1 and doc["exit_code"] == 1
    h = next(iter(doc["hosts"].values()))
    assert h["status"] == "failed" and "2 GPUs visible, expected 8" in h["error"]


def test_from_file_rejects_other_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hosts": {}}')
    proc = cli("selftest", "--from-file", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"k26ops: error: {bad}: not a self-test result: schema is None")


# ----------------------------------------------------------------- pure parts


def test_payload_args_from_host_vars():
    args = payload_args(
        {"gpus_per_host": 8, "compute_capability": ["12.0", "10.x"], "min_driver": 580, "selftest_min_busbw": 40},
        "/opt/k26ops/toolchain/cuda-13.0/bin/nvcc",
        {"timeout_scale": 1.0},
    )
    assert args == [
        "--expect-gpus",
        "8",
        "--expect-cc",
        "12.0,10.x",
        "--min-driver",
        "580",
        "--timeout-scale",
        "1.0",
        "--nvcc",
        "/opt/k26ops/toolchain/cuda-13.0/bin/nvcc",
        "--min-busbw",
        "40.0",
    ]
    from k26ops.selftest.payload import parse_args

    a = parse_args(args)  # the payload accepts what the CLI sends
    assert a.expect_gpus == 8 and a.expect_cc == ["12.0", "10.x"] and a.min_busbw == 40.0


@pytest.mark.parametrize("gpus,at_least", [(1, 1000), (8, 1700)])
def test_default_host_deadline_covers_every_check(gpus, at_least):
    assert default_host_timeout(gpus, 1.0) >= at_least
