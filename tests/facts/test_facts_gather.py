"""gather(): one remote call, run for real through a local shell runner."""

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from k26ops import facts
from k26ops.facts import Fact, GatherError, disk_free_fact
from k26ops.transport import agents

FIXTURES = Path(__file__).resolve().parent.parents[1] / "k26ops" / "lab" / "fixtures"


class LocalRunner:
    """The host_runner protocol, executed with /bin/sh on this machine."""

    def __init__(self, env=None):
        self.env = env
        self.calls = []

    def run(self, command, *, stdin=None, timeout=None):
        self.calls.append(command)
        p = subprocess.run(
            ["/bin/sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout, env=self.env
        )
        return SimpleNamespace(exited=p.returncode, stdout=p.stdout, stderr=p.stderr)


def test_gather_everything_in_one_call():
    r = LocalRunner()
    v = facts.gather(r)
    assert len(r.calls) == 1
    assert set(v) == set(facts.FACTS)
    assert v["python3"]["error"] is None and v["python3"]["tuple"][0] == 3
    assert v["os_release"]["id"] and v["os_release"]["error"] is None
    assert v["disk_free"]["/"]["available"] > 0
    if not any(Path(d, "nvidia-smi").exists() for d in os.environ["PATH"].split(os.pathsep)):
        assert v["gpus"] == {"count": 0, "gpus": [], "error": "nvidia-smi: command not found"}
        assert v["gpu_topology"]["error"] == "nvidia-smi: command not found"


def test_gather_with_the_lab_fixture_on_path():
    env = dict(os.environ, PATH=f"{FIXTURES}{os.pathsep}{os.environ['PATH']}")
    r = LocalRunner(env)
    v = facts.gather(r, ["gpus", "gpu_topology", "nvidia_smi"])
    assert len(r.calls) == 1 and list(v) == ["gpus", "gpu_topology", "nvidia_smi"]
    assert v["gpus"]["count"] == 8 and {g["compute_cap"] for g in v["gpus"]["gpus"]} == {"12.0"}
    assert v["gpu_topology"]["interconnect"] == "pcie"
    assert v["nvidia_smi"]["driver_version"].startswith("580.")
    env["K26OPS_LAB_NVIDIA_SMI"] = "nvml-mismatch"
    v = facts.gather(LocalRunner(env), ["gpus"])
    assert v["gpus"]["error"] == "Failed to initialize NVML: Driver/library version mismatch"


def test_the_python3_fact_starts_no_second_python3(tmp_path):
    """The facts gather runs in the host's python3, which answers the python3 fact itself: one
    python3 start (a counting python3 first on PATH sees them), the value `python3 --version` gives."""
    log = tmp_path / "starts"
    (tmp_path / "python3").write_text(f'#!/bin/sh\necho "$1" >> {log}\nexec {sys.executable} "$@"\n')
    (tmp_path / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    v = facts.gather(LocalRunner(env), ["python3", "os_release"])
    assert log.read_text().splitlines() == ["-S"]  # the agent only (python3 -S -c)
    version = subprocess.run([sys.executable, "--version"], capture_output=True, text=True).stdout
    assert v["python3"] == facts.FACTS["python3"].parse(version, 0) and v["python3"]["error"] is None
    # under another interpreter than `python3` the agent's own version is not python3's: the command runs
    assert "own" not in facts.command_list(["python3"], python="/usr/bin/python3.11")[0]


def test_each_nvcc_runs_once_though_two_patterns_name_it(tmp_path):
    """<root>/toolchain/cuda-13.0/bin/nvcc matches both cuda-*/ and */: one `nvcc --version`
    (each is a process start on the host), the same installs parsed."""
    from k26ops.facts.cuda import cuda_toolkit_fact

    log = tmp_path / "calls"
    recorded = (Path(__file__).resolve().parent.parent / "data" / "facts" / "h200x2-nvcc-version.txt").read_text()
    (tmp_path / "recorded").write_text(recorded)
    for d in ("cuda-13.0", "other"):
        nvcc = tmp_path / "toolchain" / d / "bin" / "nvcc"
        nvcc.parent.mkdir(parents=True)
        nvcc.write_text(f'#!/bin/sh\necho "$0" >> {log}\ncat {tmp_path}/recorded\n')
        nvcc.chmod(0o755)
    fact = cuda_toolkit_fact(str(tmp_path / "toolchain"))
    v = facts.gather(LocalRunner(), [], extra=[fact])["cuda_toolkit"]
    assert sorted(log.read_text().splitlines()) == sorted(
        str(tmp_path / "toolchain" / d / "bin" / "nvcc") for d in ("cuda-13.0", "other")
    )
    ours = [i for i in v["installs"] if i["path"].startswith(str(tmp_path))]
    assert [i["path"] for i in ours] == [
        str(tmp_path / "toolchain" / d / "bin" / "nvcc") for d in ("cuda-13.0", "other")
    ]
    assert {i["release"] for i in ours} == {"13.0"}


def test_per_command_timeout_and_closed_stdin():
    slow = Fact("slow", "sleep 20; echo late", lambda out, rc: (out, rc), timeout=0.5)
    reader = Fact("reader", "cat; echo done", lambda out, rc: (out, rc))
    t0 = time.monotonic()
    v = facts.gather(LocalRunner(), ["python3"], extra=[slow, reader])
    assert time.monotonic() - t0 < 10
    assert v["slow"] == {"error": "timed out after 0.5 s: sleep 20; echo late"}
    assert v["reader"] == ("done\n", 0)  # stdin is closed: cat did not wait


def test_hostile_disk_paths_are_quoted(tmp_path):
    marker = tmp_path / "pwned"
    hostile = [
        f"{tmp_path}/a b; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"{tmp_path}/x'\"; touch {marker}\n",
    ]
    v = facts.gather(LocalRunner(), ["python3"], extra=[disk_free_fact(hostile)])
    assert not marker.exists()
    for h in hostile[:3]:  # (a newline inside a path is only proven harmless, not reported)
        assert v["disk_free"][h]["available"] > 0
    first = v["disk_free"][hostile[0]]
    assert first["path"] == str(tmp_path) and first["available"] > 0


def test_missing_directory_is_measured_at_its_parent(tmp_path):
    want = str(tmp_path / "models" / "k26")
    v = facts.gather(LocalRunner(), [], extra=[disk_free_fact([want, "/"])])
    assert v["disk_free"][want]["path"] == str(tmp_path) and v["disk_free"][want]["error"] is None


def test_gather_failure_raises_gather_error():
    with pytest.raises(GatherError, match="exited 127"):
        facts.gather(LocalRunner(), ["python3"], python="/nonexistent/python3")


def test_unknown_fact_name():
    with pytest.raises(KeyError, match="nope"):
        facts.command_list(["nope"])


def test_remote_script_is_stdlib_only_and_standalone(tmp_path):
    # Run it as the host would, from an empty directory with no k26ops on sys.path.
    p = subprocess.run(
        [sys.executable, "-I", "-c", agents.source("gather")],
        input='{"op": "gather", "commands": [{"name": "x", "command": "echo hi; echo err >&2; exit 3"}]}',
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == '{"x": {"rc": 3, "stdout": "hi\\n", "stderr": "err\\n"}}'
