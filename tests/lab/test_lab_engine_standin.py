"""The lab's engine stand-in, run for real as a subprocess on 127.0.0.1.

Every wait is bounded; each process is killed at the end of its test.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from k26ops.engine import launch, units
from labtools.fixtures import STANDIN, Standin

PYTHONS = [sys.executable] + (["/usr/bin/python3"] if os.path.exists("/usr/bin/python3") else [])
LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP\d+\] ", re.M)


@pytest.fixture
def standins(tmp_path):
    started = []

    def start(*flags, **kw):
        s = Standin(tmp_path, *flags, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.mark.parametrize("python", PYTHONS)
def test_serves_sglang_api_when_ready(standins, python):
    s = standins("--mem-fraction-static", "0.85", "--unknown-flag", "x", "--enable-metrics", python=python)
    s.wait_ready()
    assert s.status("/health_generate") == 200 and s.status("/ready") == 200
    code, info = s.request("GET", "/server_info")
    assert code == 200 and info["version"] and info["internal_states"][0]["avg_spec_accept_length"] > 1
    code, models = s.request("GET", "/v1/models")
    assert models["data"][0]["id"] == "/models/Kimi-K2.6"
    code, res = s.request("POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 8}})
    assert code == 200 and res["text"]
    meta = res["meta_info"]
    assert meta["completion_tokens"] == 8 and meta["prompt_tokens"] >= 1
    assert meta["spec_accept_length"] > 1 and meta["e2e_latency"] > 0
    code, chat = s.request(
        "POST", "/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert code == 200 and chat["choices"][0]["message"]["content"]
    assert chat["usage"]["completion_tokens"] == 4
    assert s.request("POST", "/generate", None)[0] in (200, 400)
    s.stop()
    log = s.out.read_text()
    assert "server_args=ServerArgs(" in log and "speculative_algorithm='DDTREE'" in log
    for line in [
        "Load weight begin",
        "Capture target verify CUDA graph begin",
        "Capture target verify CUDA graph end. elapsed=",
        "The server is fired up and ready to roll!",
    ]:
        assert line in log
    assert re.search(r"Loading safetensors checkpoint shards:\s+\d+% Completed \| \d+/64 \[", log)
    assert {f"TP{r}" for r in range(8)} <= set(re.findall(r"TP\d+", log))  # --tp-size 8
    assert LOG_PREFIX.search(log)


def test_slow_load_reports_503_then_200(standins):
    s = standins(env={"K26OPS_STANDIN_LOAD_SECONDS": "1"})  # 20 polls of 503 at least
    seen = s.wait_ready(deadline=20)
    assert 503 in seen and seen[-1] == 200
    assert seen.index(503) < len(seen) - 1


def test_disable_cuda_graph_skips_capture(standins):
    s = standins(disable_cuda_graph=True)
    s.wait_ready()
    s.stop()
    assert "CUDA graph" not in s.out.read_text()


def _crash(standins, env, *flags, request=False):
    s = standins(*flags, env=env)
    if request:
        s.wait_ready()
        with pytest.raises((OSError, http.client.HTTPException)):
            s.request("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    rc = s.wait_exit()
    return s, rc, s.err.read_text()


def test_crash_during_load_with_a_given_log(standins, tmp_path):
    log = tmp_path / "crash.txt"
    log.write_text("[2026-05-20 08:02:44 TP0] Scheduler hit an exception: boom\n")
    s, rc, err = _crash(standins, {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_CRASH_LOG": str(log)})
    assert rc != 0 and err == log.read_text()
    assert "Load weight begin" in s.out.read_text()
    assert "ready to roll" not in s.out.read_text()


def test_crash_during_load_default_is_a_weight_load_error(standins):
    _s, rc, err = _crash(standins, {"K26OPS_STANDIN_CRASH": "load"})
    assert rc != 0 and "SafetensorError" in err and "Received sigquit" in err
    from k26ops.diagnose import classify

    assert classify(err).signature == "weight-file-corrupt"


def test_none_field_on_first_request_multi_rank(standins):
    _s, rc, err = _crash(
        standins,
        {
            "K26OPS_STANDIN_CRASH": "first-request",
            "K26OPS_STANDIN_CRASH_LOG": "none-field",
            "K26OPS_STANDIN_NONE_FIELD": "out_cache_loc",
        },
        request=True,
    )
    assert rc != 0
    assert err.count("AttributeError: 'NoneType' object has no attribute 'dtype'") == 4  # 4 of 8 ranks
    assert "gloo" in err and "_grouped_foreach_copy_" in err and "replay" in err
    assert "K26OPS-PROBE" not in err
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP7\] Scheduler hit an exception", err, re.M)


def test_none_field_with_probe_names_the_field(standins):
    _s, rc, err = _crash(
        standins,
        {
            "K26OPS_STANDIN_CRASH": "first-request",
            "K26OPS_STANDIN_CRASH_LOG": "none-field",
            "K26OPS_STANDIN_NONE_FIELD": "seq_lens",
            "K26OPS_STANDIN_PROBE": "1",
        },
        request=True,
    )
    assert rc != 0
    assert (
        "RuntimeError: K26OPS-PROBE cuda-graph-none-field: src[1] (seq_lens) is None "
        "in _grouped_foreach_copy_ (sglang.srt.model_executor.runner_utils.buffers)"
    ) in err


def test_shape_mismatch_during_capture(standins):
    _s, rc, err = _crash(standins, {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_CRASH_LOG": "shape-mismatch"})
    assert rc != 0
    assert "The size of tensor a (8) must match the size of tensor b (33)" in err
    assert "Capture cuda graph failed: The size of tensor a (8)" in err


def test_graph_only_crashes_do_not_happen_without_cuda_graphs(standins):
    s = standins(
        disable_cuda_graph=True, env={"K26OPS_STANDIN_CRASH": "first-request", "K26OPS_STANDIN_CRASH_LOG": "none-field"}
    )
    s.wait_ready()
    for _ in range(2):
        code, res = s.request("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert code == 200 and res["text"]
    assert s.proc.poll() is None


def test_signatures_classify_the_standin_logs(standins):
    """The diagnose classifier (another module) recognises these logs, where it exists."""
    diagnose = pytest.importorskip("k26ops.diagnose")
    for probe in ("0", "1"):
        _s, _rc, err = _crash(
            standins,
            {
                "K26OPS_STANDIN_CRASH": "first-request",
                "K26OPS_STANDIN_CRASH_LOG": "none-field",
                "K26OPS_STANDIN_NONE_FIELD": "seq_lens",
                "K26OPS_STANDIN_PROBE": probe,
            },
            request=True,
        )
        found = diagnose.classify(err)
        assert found.signature == "cuda-graph-none-field", found
        if probe == "1":
            assert found.detail.get("field") == "seq_lens", found.detail
    _s, _rc, err = _crash(standins, {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_CRASH_LOG": "shape-mismatch"})
    assert diagnose.classify(err).signature.startswith("cuda-graph-shape-mismatch")


def test_stdlib_only():
    src = STANDIN.read_text()
    assert src.splitlines()[1].startswith('"""LAB FIXTURE')
    mods = set(re.findall(r"^(?:import|from) (\w+)", src, re.M))
    assert mods <= set(sys.stdlib_module_names) | {"__future__"}, mods


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze")
def test_lab_unit_with_standin_module_verifies(tmp_path):
    unit = tmp_path / "k26ops-sglang.service"
    env_file = tmp_path / "env"
    env_file.write_text(units.render_env({"env": {"K26OPS_STANDIN_LOAD_SECONDS": 5}}))
    unit.write_text(
        units.render_unit(
            {
                "profile": {
                    "python": sys.executable,
                    "launch_module": "k26ops.lab.fixtures.engine_standin",
                    "model_path": "/models/Kimi-K2.6",
                    "draft_model_path": "/models/draft",
                },
                "env_file": str(env_file),
            }
        )
    )
    res = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("patched", [False, True])
def test_startup_log_shows_the_key_unless_the_release_carries_the_redaction_patch(standins, tmp_path, patched):
    """As the real engine (tests/data/serving): the released sglang logs api_key in clear;
    with patches/*/redact-api-key-in-startup-log.patch applied to the release it does not."""
    site = tmp_path / f"site-{patched}"
    engine_py = site / "sglang/srt/entrypoints/engine.py"
    engine_py.parent.mkdir(parents=True)
    (site / "sglang/__init__.py").write_text("")
    patch = Path(__file__).resolve().parent.parents[1] / "patches/sglang-0.5.23/redact-api-key-in-startup-log.patch"
    added = "\n".join(l[1:] for l in patch.read_text().splitlines() if l.startswith("+") and not l.startswith("+++"))
    engine_py.write_text("def _server_args_for_logging(server_args):\n" + (added if patched else "    pass\n"))
    secrets = tmp_path / f"secrets-{patched}.yaml"  # the key travels as a deploy sends it
    profile = {
        "model_path": "/m",
        "port": 1,
        "extra_args": ["--api-key", "sk-standin-0123456789"],
        "secrets_file": str(secrets),
    }
    secrets.write_text(launch.engine_launch(profile)[1])
    s = standins("--api-key", "sk-standin-0123456789", env={"PYTHONPATH": str(site)}, secrets_file=str(secrets))
    s.wait_ready()
    s.stop()
    log = s.out.read_text()
    assert "server_args=ServerArgs(" in log
    assert ("sk-standin-0123456789" in log) is (not patched)
    assert ("api_key='<redacted>'" in log) is patched
