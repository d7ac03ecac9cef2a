"""Warm starts (issue 43), the pure half: the release's engine cache dir and the variables
the unit sets for it, and a start's time to first good token read from what the real
engine logged and served (tests/data/rehearsal: sglang 0.5.17 on an H200).

The lab half (deploy --rehearse fills the new release's cache before the switch, the
deploy reports its TTFGT, prune removes a release's cache) is in tests/test_rehearse.py.
"""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path

import pytest

from k26ops import units
from k26ops.facts import engine_cache
from k26ops.facts.gpu import parse_gpus
from k26ops.lab.fixtures import engine_standin
from k26ops.steps import warmstart

DATA = Path(__file__).resolve().parent / "data"
H200 = parse_gpus((DATA / "facts/h200x2-smi-query-noheader-nounits.txt").read_text(), 0)["gpus"]
RTX = parse_gpus((DATA / "facts/constructed-rtxpro6000x8-query-noheader-nounits.txt").read_text(), 0)["gpus"]
ARGV = units.engine_argv({"python": "/opt/k26ops/releases/current/venv/bin/python", "model_path": "/m",
                          "draft_model_path": "/d", "speculative_algorithm": "DDTREE", "tp_size": 8,
                          "speculative_ddtree_budget": 32, "speculative_dflash_block_size": 8})


def test_the_cache_dir_is_keyed_by_release_gpu_tp_and_speculative_profile():
    d = engine_cache.cache_dir("/opt/k26ops", "rel-a", ARGV, H200)
    assert d == "/opt/k26ops/engine-cache/rel-a/h200-sm90-tp8-ddtree-bs8-budget32"
    assert engine_cache.cache_dir("/opt/k26ops", "rel-b", ARGV, H200) != d  # two releases never share one
    assert engine_cache.key(ARGV, RTX) == "rtx-pro-6000-blackwell-server-edition-sm120-tp8-ddtree-bs8-budget32"
    tp4 = [w if w != "8" or ARGV[i - 1] != "--tp-size" else "4" for i, w in enumerate(ARGV)]
    assert engine_cache.key(tp4, H200).endswith("-tp4-ddtree-bs8-budget32")
    dflash = units.engine_argv({"python": "/p", "model_path": "/m", "speculative_algorithm": "DFLASH",
                                "speculative_dflash_block_size": 8, "tp_size": 1})
    assert engine_cache.key(dflash, None) == "gpu-unknown-tp1-dflash-bs8"
    assert engine_cache.release_cache("/r", "rel-a") == "/r/engine-cache/rel-a"
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            engine_cache.cache_dir("/opt/k26ops", bad, ARGV, H200)


def test_the_variables_follow_the_releases_engine_version():
    d = "/c"
    assert engine_cache.variables("0.5.23", d) == {"SGLANG_CACHE_DIR": "/c"}
    assert engine_cache.variables("0.5.23+lab", d) == {"SGLANG_CACHE_DIR": "/c"}
    old = engine_cache.variables("0.5.17", d)
    assert old == {"TRITON_CACHE_DIR": "/c/triton", "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer",
                   "TVM_FFI_CACHE_DIR": "/c/tvm-ffi", "CUDA_CACHE_PATH": "/c/nv-compute",
                   "TORCHINDUCTOR_CACHE_DIR": "/c/inductor", "XDG_CACHE_HOME": "/c/xdg"}
    assert engine_cache.variables(None, d) == old and engine_cache.variables("0.5.22.dev3", d) == old


def test_an_engine_env_setting_of_a_cache_variable_wins_and_is_named():
    env, kept = engine_cache.apply({"TRITON_CACHE_DIR": "/shared/triton", "HF_HUB_OFFLINE": "1"},
                                   engine_cache.variables("0.5.17", "/c"))
    assert env["TRITON_CACHE_DIR"] == "/shared/triton" and env["TVM_FFI_CACHE_DIR"] == "/c/tvm-ffi"
    assert kept == ["TRITON_CACHE_DIR"] and "TRITON_CACHE_DIR" in engine_cache.kept_note(kept)
    assert engine_cache.kept_note([]) is None
    # the env file the unit reads carries them (quoted as every value)
    text = units.render_env({"env": env})
    assert 'TVM_FFI_CACHE_DIR="/c/tvm-ffi"' in text


def test_the_ttfgt_of_the_recorded_real_cold_start():
    """The real 0.5.17 engine's cold rehearsal (tests/data/rehearsal/h200-qwen3-dflash-final):
    started about 23:56:57, weights 23:57:32, graphs 23:58:56, fired up 23:59:00, the first
    sampled answer 88.5 s after the greedy one (flashinfer's sampling JIT)."""
    log = (DATA / "rehearsal/h200-qwen3-dflash-final.log").read_text()
    rep = json.loads((DATA / "rehearsal/h200-qwen3-dflash-final.json").read_text())["hosts"]["h200"]["rehearsal"]
    at = calendar.timegm(time.strptime("2026-12-01 23:56:57", "%Y-%m-%d %H:%M:%S"))
    t = warmstart.timeline(stop_at=None, started_at=at, ready_at=at + 126, greedy_at=at + 126.3,
                           sampled_at=at + 126.3 + rep["smoke"]["sampled"]["latency_s"], log=log, tz_offset=0,
                           metrics=rep["metrics"], started_source="k26ops")
    ms = {m["name"]: (m["at_s"], m["source"]) for m in t["milestones"]}
    assert list(ms) == list(warmstart.MILESTONES[1:])
    assert ms["weights loaded"] == (35.0, "log") and ms["graphs captured"] == (119.0, "log")
    assert ms["ready"] == (123.0, "log")
    assert t["ready_s"] == 123.0 and t["first_sampled_s"] == pytest.approx(3.3 + 88.49, abs=0.01)
    assert (t["capture_s"], t["capture_source"]) == (82.54, "metrics")  # startup_cuda_graph_time_seconds
    assert (t["weights_s"], t["weights_source"]) == (0.22, "log")  # target 0.21 + drafter 0.01
    assert t["stop_s"] is None and t["startup_s"] is None  # no stop in a rehearsal; 0.5.17 has no startup_time
    # without the metrics, the log's capture lines
    assert warmstart.timeline(stop_at=None, started_at=at, ready_at=None, greedy_at=None, sampled_at=None,
                              log=log)["capture_source"] == "log"


def test_start_up_metrics_and_a_stop_are_used_where_the_engine_has_them():
    m = warmstart.parse_metrics('# HELP x\nsglang:startup_time_seconds{engine_type="unified"} 51.5\n'
                                'sglang:weight_load_duration_seconds_sum{model_name="m"} 12.25\n'
                                'sglang:startup_cuda_graph_time_seconds{phase="prefill"} 1.7\n'
                                'sglang:startup_cuda_graph_time_seconds{phase="decode"} 0.3\nother 1\n')
    t = warmstart.timeline(stop_at=100.0, started_at=108.0, ready_at=160.0, greedy_at=160.5, sampled_at=161.0,
                           metrics=m)
    assert [x["name"] for x in t["milestones"]] == ["stop", "process started", "ready", "first greedy answer",
                                                    "first sampled answer"]
    assert t["stop_s"] == 8.0 and t["ready_s"] == 52.0 and t["first_sampled_s"] == 1.0 and t["total_s"] == 61.0
    assert (t["capture_s"], t["capture_source"], t["weights_s"], t["weights_source"], t["startup_s"]) == \
        (2.0, "metrics", 12.25, "metrics", 51.5)
    assert "ready 52.0 s after start" in warmstart.summary(t) and "61.0 s from stop" in warmstart.summary(t)


def test_a_start_that_compiles_is_named_with_its_phase():
    before = {"files": 10, "kernels": 4, "bytes": 1000}
    warm = warmstart.compiled(before, [("start", before), ("first greedy answer", before),
                                       ("first sampled answer", before)])
    assert warm["compiled_new"] == 0 and warm["verdict"] == "warm start: no new kernel compiled"
    cold = warmstart.compiled(before, [("start", before), ("first greedy answer", before),
                                       ("first sampled answer", {"files": 14, "kernels": 6, "bytes": 9000})])
    assert cold["compiled_new"] == 2 and cold["by_phase"]["first sampled answer"] == 2
    assert cold["verdict"] == "cold start: 2 new kernels compiled (first sampled answer: 2)"
    assert cold["files_new"] == 4 and cold["bytes_new"] == 8000
    assert warmstart.compiled(None, [("start", {"files": 1, "kernels": 1, "bytes": 5})])["compiled_new"] == 1


def test_the_lab_stand_in_compiles_once_into_the_cache_it_is_pointed_at(tmp_path, monkeypatch):
    """Cold: the capture and sampling kernels are compiled (the recorded cost, scaled) and written;
    warm: loaded from the same dir at a fraction of it; another dir is cold again."""
    monkeypatch.setenv("K26OPS_STANDIN_CAPTURE_SECONDS", "0.2")
    for env, where in (({"SGLANG_CACHE_DIR": str(tmp_path / "a")}, tmp_path / "a" / "triton"),
                       ({"TRITON_CACHE_DIR": str(tmp_path / "t"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "f")},
                        tmp_path / "t")):
        k = engine_standin.KernelCache(env)
        t0 = time.monotonic()
        assert k.ensure("triton", "g", "capture") is True
        cold = time.monotonic() - t0
        t0 = time.monotonic()
        assert k.ensure("triton", "g", "capture") is False
        assert time.monotonic() - t0 < cold / 4 and (where / "g.cubin").exists()
    assert engine_standin.KernelCache({"SGLANG_CACHE_DIR": str(tmp_path / "b")}).ensure("triton", "g", "capture")


def test_bench_compare_and_the_gate_read_the_last_starts_ttfgt():
    """`bench` attaches the host's last start (Layout.last_start_file) to its result; its
    TTFGT figures are `METRIC@start`, lower is better, compared and gated like the cells'."""
    from k26ops.enginebench import figures as figs
    from k26ops.errors import UserError

    cell = {"concurrency": 1, "temperature": 0, "figures": {"tok/s": {"median": 100, "min": 99, "max": 101, "n": 3}}}
    base = {"cells": [cell], "spec": {"runs": 3}, "startup": {"ttfgt": {"total_s": 160.0, "ready_s": 140.0,
                                                                        "first_sampled_s": 88.0, "capture_s": 82.5}}}
    cur = {"cells": [cell], "spec": {"runs": 3}, "startup": {"ttfgt": {"total_s": 60.0, "ready_s": 51.0,
                                                                       "first_sampled_s": 0.4, "capture_s": None}}}
    assert figs.parse_figure("ready_s@start") == ("ready_s", None, None)
    for bad in ("tok/s@start", "ready_s@c1/t0", "nope@start"):
        with pytest.raises(UserError):
            figs.parse_figure(bad)
    assert figs.cells_for(["ready_s@start", "tok/s@c4/t0.7"]) == ([4], [0.7])
    rows = {r["figure"]: r for r in figs.compare(cur, base)}
    assert rows["ready_s@start"]["verdict"] == "better" and rows["ready_s@start"]["better"] == "lower"
    assert "capture_s@start" not in rows  # not measured this time: not compared
    assert figs.gate_verdict(cur, base, ["ttfgt_s@start", "first_sampled_s@start"], 5.0)["ok"]
    v = figs.gate_verdict(base, cur, ["ready_s@start"], 5.0)  # a cold start against a warm baseline
    assert not v["ok"] and v["failed"][0]["label"] == "start to ready s"
    assert "ready_s@start (start to ready s) measured 140 vs baseline 51" in figs.gate_line("h", v)


def test_a_baseline_env_file_names_its_release_cache():
    """A rollback restores a baseline's env file: the cache it points at is the one measured."""
    d = "/opt/k26ops/engine-cache/rel-a/h200-sm90-tp8-dflash-bs8"
    for version in ("0.5.17", "0.5.23"):
        text = units.render_env({"env": {"HF_HUB_OFFLINE": "1", **engine_cache.variables(version, d)}})
        c = warmstart.cache_in_env({}, text)
        assert c.dir == d and c.top == "/opt/k26ops/engine-cache" and c.kept == []
    assert warmstart.cache_in_env({}, 'TRITON_CACHE_DIR="/tmp/cache/triton"\n') is None  # the user's own
    assert warmstart.cache_in_env({"k26ops_root": "/srv/k"}, units.render_env(
        {"env": engine_cache.variables("0.5.23", d)})) is None  # another root's
    assert warmstart.cache_in_env({}, None) is None
