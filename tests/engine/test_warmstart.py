"""Warm starts (issue 43), the pure half: the release's engine cache dir and the variables
the unit sets for it, and a start's time to first good token read from what the real
engine logged and served (tests/data/rehearsal: sglang 0.5.17 on an H200).

The lab stand-in's start phases: read from one recorded file (tests/data/standin/
start-phases.json), each figure checked against the recording it names, replayed cold or
warm by what the cache dir holds. The real-GPU cold/warm pair (tests/data/warmstart/*.json,
recorded by bench/device/h200_warmstart.sh) is checked when present: its fields, its
MANIFEST, 0 new kernels warm, the targets or the phase that holds them; and the stand-in
must then replay it.

The lab half (deploy --rehearse fills the new release's cache before the switch, the
deploy reports its TTFGT, prune removes a release's cache) is in tests/deploy/test_rehearse.py;
the rollback's TTFGT and a cold start's verdict in tests/baselines/test_baselines.py.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from pathlib import Path

import pytest

from k26ops.engine import launch, units
from k26ops.facts import engine_cache
from k26ops.facts.gpu import parse_gpus
from k26ops.lab.fixtures import engine_standin
from k26ops.steps import warmstart

DATA = Path(__file__).resolve().parent.parent / "data"
H200 = parse_gpus((DATA / "facts/h200x2-smi-query-noheader-nounits.txt").read_text(), 0)["gpus"]
RTX = parse_gpus((DATA / "facts/constructed-rtxpro6000x8-query-noheader-nounits.txt").read_text(), 0)["gpus"]
ARGV = launch.engine_argv(
    {
        "python": "/opt/k26ops/releases/current/venv/bin/python",
        "model_path": "/m",
        "draft_model_path": "/d",
        "speculative_algorithm": "DDTREE",
        "tp_size": 8,
        "speculative_ddtree_budget": 32,
        "speculative_dflash_block_size": 8,
    }
)


def test_the_cache_dir_is_keyed_by_release_gpu_tp_and_speculative_profile():
    d = engine_cache.cache_dir("/opt/k26ops", "rel-a", ARGV, H200)
    assert d == "/opt/k26ops/engine-cache/rel-a/h200-sm90-tp8-ddtree-bs8-budget32"
    assert engine_cache.cache_dir("/opt/k26ops", "rel-b", ARGV, H200) != d  # two releases never share one
    assert engine_cache.key(ARGV, RTX) == "rtx-pro-6000-blackwell-server-edition-sm120-tp8-ddtree-bs8-budget32"
    tp4 = [w if w != "8" or ARGV[i - 1] != "--tp-size" else "4" for i, w in enumerate(ARGV)]
    assert engine_cache.key(tp4, H200).endswith("-tp4-ddtree-bs8-budget32")
    dflash = launch.engine_argv(
        {
            "python": "/p",
            "model_path": "/m",
            "speculative_algorithm": "DFLASH",
            "speculative_dflash_block_size": 8,
            "tp_size": 1,
        }
    )
    assert engine_cache.key(dflash, None) == "gpu-unknown-tp1-dflash-bs8"
    assert engine_cache.release_cache("/r", "rel-a") == "/r/engine-cache/rel-a"
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            engine_cache.cache_dir("/opt/k26ops", bad, ARGV, H200)


def test_a_rehearsal_at_another_tp_size_says_it_does_not_warm_the_units_start():
    from k26ops.rehearsal import plan

    same, _ = plan.rehearsal_argv(ARGV, plan.Options(), port=1, has_draft=True)
    assert engine_cache.other_key_note(same, ARGV, H200) is None  # port, dummy weights: the same dir
    tp1, _ = plan.rehearsal_argv(ARGV, plan.Options(tp_size=1), port=1, has_draft=True)
    note = engine_cache.other_key_note(tp1, ARGV, H200)
    assert "h200-sm90-tp1-ddtree-bs8-budget32" in note and "h200-sm90-tp8-ddtree-bs8-budget32" in note
    assert note.endswith("the unit's start stays cold")


def test_the_variables_follow_the_releases_engine_version():
    d = "/c"
    assert engine_cache.variables("0.5.23", d) == {"SGLANG_CACHE_DIR": "/c"}
    assert engine_cache.variables("0.5.23+lab", d) == {"SGLANG_CACHE_DIR": "/c"}
    old = engine_cache.variables("0.5.17", d)
    assert old == {
        "TRITON_CACHE_DIR": "/c/triton",
        "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer",
        "TVM_FFI_CACHE_DIR": "/c/tvm-ffi",
        "CUDA_CACHE_PATH": "/c/nv-compute",
        "TORCHINDUCTOR_CACHE_DIR": "/c/inductor",
        "XDG_CACHE_HOME": "/c/xdg",
    }
    assert engine_cache.variables(None, d) == old and engine_cache.variables("0.5.22.dev3", d) == old


def test_an_engine_env_setting_of_a_cache_variable_wins_and_is_named():
    env, kept = engine_cache.apply(
        {"TRITON_CACHE_DIR": "/shared/triton", "HF_HUB_OFFLINE": "1"}, engine_cache.variables("0.5.17", "/c")
    )
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
    t = warmstart.timeline(
        stop_at=None,
        started_at=at,
        ready_at=at + 126,
        greedy_at=at + 126.3,
        sampled_at=at + 126.3 + rep["smoke"]["sampled"]["latency_s"],
        log=log,
        tz_offset=0,
        metrics=rep["metrics"],
        started_source="k26ops",
    )
    ms = {m["name"]: (m["at_s"], m["source"]) for m in t["milestones"]}
    assert list(ms) == list(warmstart.MILESTONES[1:])
    assert ms["weights loaded"] == (35.0, "log") and ms["graphs captured"] == (119.0, "log")
    assert ms["ready"] == (123.0, "log")
    assert t["ready_s"] == 123.0 and t["first_sampled_s"] == pytest.approx(3.3 + 88.49, abs=0.01)
    assert (t["capture_s"], t["capture_source"]) == (82.54, "metrics")  # startup_cuda_graph_time_seconds
    assert (t["weights_s"], t["weights_source"]) == (0.22, "log")  # target 0.21 + drafter 0.01
    assert t["stop_s"] is None and t["startup_s"] is None  # no stop in a rehearsal; 0.5.17 has no startup_time
    # without the metrics, the log's capture lines
    assert (
        warmstart.timeline(stop_at=None, started_at=at, ready_at=None, greedy_at=None, sampled_at=None, log=log)[
            "capture_source"
        ]
        == "log"
    )


def test_start_up_metrics_and_a_stop_are_used_where_the_engine_has_them():
    m = warmstart.parse_metrics(
        '# HELP x\nsglang:startup_time_seconds{engine_type="unified"} 51.5\n'
        'sglang:weight_load_duration_seconds_sum{model_name="m"} 12.25\n'
        'sglang:startup_cuda_graph_time_seconds{phase="prefill"} 1.7\n'
        'sglang:startup_cuda_graph_time_seconds{phase="decode"} 0.3\nother 1\n'
    )
    t = warmstart.timeline(
        stop_at=100.0, started_at=108.0, ready_at=160.0, greedy_at=160.5, sampled_at=161.0, metrics=m
    )
    assert [x["name"] for x in t["milestones"]] == [
        "stop",
        "process started",
        "ready",
        "first greedy answer",
        "first sampled answer",
    ]
    assert t["stop_s"] == 8.0 and t["ready_s"] == 52.0 and t["first_sampled_s"] == 1.0 and t["total_s"] == 61.0
    assert (t["capture_s"], t["capture_source"], t["weights_s"], t["weights_source"], t["startup_s"]) == (
        2.0,
        "metrics",
        12.25,
        "metrics",
        51.5,
    )
    assert "ready 52.0 s after start" in warmstart.summary(t) and "61.0 s from stop" in warmstart.summary(t)


def test_a_start_that_compiles_is_named_with_its_phase():
    before = {"files": 10, "kernels": 4, "bytes": 1000}
    warm = warmstart.compiled(
        before, [("start", before), ("first greedy answer", before), ("first sampled answer", before)]
    )
    assert warm["compiled_new"] == 0 and warm["verdict"] == "warm start: no new kernel compiled"
    cold = warmstart.compiled(
        before,
        [
            ("start", before),
            ("first greedy answer", before),
            ("first sampled answer", {"files": 14, "kernels": 6, "bytes": 9000}),
        ],
    )
    assert cold["compiled_new"] == 2 and cold["by_phase"]["first sampled answer"] == 2
    assert cold["verdict"] == "cold start: 2 new kernels compiled (first sampled answer: 2)"
    assert cold["files_new"] == 4 and cold["bytes_new"] == 8000
    assert warmstart.compiled(None, [("start", {"files": 1, "kernels": 1, "bytes": 5})])["compiled_new"] == 1


PHASES_FILE = DATA / "standin/start-phases.json"
WARMSTART = DATA / "warmstart"
RECORD_FIELDS = ("gpu", "engine", "ready_s", "capture_s", "first_greedy_s", "first_sampled_s", "compiled_new")


def _as_record(path: Path) -> dict:
    """A recording as a warm-start record: a tests/data/warmstart record as it is, or a recorded
    `rehearse --json` answer (tests/data/rehearsal) read the way its MANIFEST says: ready_s its
    report's, capture_s from its /metrics (else its log), first_greedy_s the smoke's greedy latency,
    first_sampled_s greedy + sampled latency (sent one after the other, counted from ready)."""
    doc = json.loads(path.read_text())
    if "hosts" not in doc:
        return doc
    rep = next(iter(doc["hosts"].values()))["rehearsal"]
    log = path.with_suffix(".log").read_text() if path.with_suffix(".log").exists() else ""
    greedy, sampled = rep["smoke"]["greedy"]["latency_s"], rep["smoke"]["sampled"]["latency_s"]
    how = json.loads((path.parent / "MANIFEST.json").read_text())["_how"]
    return {
        "gpu": "NVIDIA H200" if "NVIDIA H200" in how else None,
        "engine": "sglang 0.5.17" if "sglang 0.5.17" in how else None,
        "ready_s": rep["ready_s"],
        "capture_s": warmstart.capture_seconds(log, rep.get("metrics") or {})[0],
        "first_greedy_s": round(greedy, 2),
        "first_sampled_s": round(greedy + sampled, 2),
        "compiled_new": None,
    }


def _warmstart_pair() -> dict:
    """tests/data/warmstart's recorded cold and warm starts (bench/device/h200_warmstart.sh), by
    their `label` (else their file name); {} while none is recorded."""
    pair = {}
    for f in sorted(WARMSTART.glob("*.json")) if WARMSTART.is_dir() else []:
        if f.name == "MANIFEST.json":
            continue
        doc = json.loads(f.read_text())
        side = doc.get("label") or next((s for s in ("cold", "warm") if s in f.stem), None)
        if side in ("cold", "warm"):
            assert side not in pair, f"two {side} records in {WARMSTART}: {pair[side][0].name}, {f.name}"
            pair[side] = (f, doc)
    return pair


def test_the_stand_ins_start_phases_are_the_real_engines_recorded_figures():
    """tests/data/standin/start-phases.json holds no number of its own: each of its cold and warm
    figures is read again here from the recording its `from` names (a real-engine rehearsal, or a
    tests/data/warmstart record) and must match; a cold start is slower than a warm one in it."""
    doc = json.loads(PHASES_FILE.read_text())
    assert set(doc["from"]) == {"cold", "warm"}
    for side, name in doc["from"].items():
        rec = _as_record(DATA / name)
        for k in RECORD_FIELDS:
            got, want = doc[side].get(k), rec.get(k)
            assert got == (pytest.approx(want, abs=0.01) if isinstance(want, float) else want), (side, k, got, want)
    cold, warm = doc["cold"], doc["warm"]
    assert cold["ready_s"] > warm["ready_s"] and cold["capture_s"] > warm["capture_s"]
    assert cold["first_sampled_s"] > warm["first_sampled_s"]
    assert (DATA / "standin/MANIFEST.json").exists()


def test_the_stand_in_follows_the_recorded_real_gpu_pair_once_there_is_one():
    """Once the real-GPU cold/warm pair is in tests/data/warmstart, the stand-in replays it:
    start-phases.json's `from` must name those two records (and the test above then checks every
    figure against them). Skipped while the pair is not recorded."""
    pair = _warmstart_pair()
    if set(pair) != {"cold", "warm"}:
        pytest.skip("no recorded cold/warm pair in tests/data/warmstart yet (bench/device/h200_warmstart.sh)")
    doc = json.loads(PHASES_FILE.read_text())
    assert {s: DATA / n for s, n in doc["from"].items()} == {s: f for s, (f, _d) in pair.items()}, (
        "point tests/data/standin/start-phases.json at tests/data/warmstart's pair and copy its figures"
    )


def test_the_recorded_real_gpu_pair_meets_the_targets_or_says_which_phase_holds_it():
    """Issue 43's proof, checked on the recording itself (skipped until it is recorded): both starts
    ran on one GPU with one engine, each record has the issue's fields, the MANIFEST says how it
    was run; the cold start compiled, the warm one compiled nothing and its ready and capture were
    faster. The targets (warm ready <= 40 % of cold ready, first sampled answer <= 2 s after ready)
    hold, or the MANIFEST's `missed` names each missed target with the phase that holds it and why."""
    pair = _warmstart_pair()
    if set(pair) != {"cold", "warm"}:
        pytest.skip("no recorded cold/warm pair in tests/data/warmstart yet (bench/device/h200_warmstart.sh)")
    manifest = json.loads((WARMSTART / "MANIFEST.json").read_text())
    cold, warm = pair["cold"][1], pair["warm"][1]
    for side, rec in (("cold", cold), ("warm", warm)):
        missing = [k for k in RECORD_FIELDS if rec.get(k) is None]
        assert not missing, f"{pair[side][0].name} lacks {missing}"
        assert pair[side][0].name in manifest, f"MANIFEST.json says nothing of {pair[side][0].name}"
    assert (cold["gpu"], cold["engine"]) == (warm["gpu"], warm["engine"])
    how = json.dumps(manifest)
    assert cold["gpu"] in how and str(cold["engine"]).split()[-1] in how  # the MANIFEST names GPU and engine
    assert cold["compiled_new"] > 0 and warm["compiled_new"] == 0
    assert warm["ready_s"] < cold["ready_s"] and warm["capture_s"] < cold["capture_s"]
    missed = manifest.get("missed") or {}
    for target, ok in (
        ("warm ready <= 40 % of cold ready", warm["ready_s"] <= 0.4 * cold["ready_s"]),
        ("warm first sampled answer <= 2 s after ready", warm["first_sampled_s"] <= 2.0),
    ):
        assert ok or len(str(missed.get(target) or "")) > 20, (
            f"target missed: {target}; the MANIFEST's missed[{target!r}] must name the phase that holds it and why"
        )


def _phases(**over) -> dict:
    doc = json.loads(PHASES_FILE.read_text())
    for k, v in over.items():
        side, field = k.split("__")
        doc[side][field] = v
    return doc


def test_the_stand_ins_phase_costs_are_the_recording_times_its_scale():
    doc = json.loads(PHASES_FILE.read_text())
    ph = engine_standin.Phases(doc)
    c, w, s = doc["cold"], doc["warm"], doc["scale"]
    assert ph.seconds("pre_capture", warm=False) == pytest.approx((c["ready_s"] - c["capture_s"]) * s)
    assert ph.seconds("capture", warm=False) == pytest.approx(c["capture_s"] * s)
    assert ph.seconds("capture", warm=True) == pytest.approx(w["capture_s"] * s)
    assert ph.seconds("sampling", warm=False) == pytest.approx((c["first_sampled_s"] - c["first_greedy_s"]) * s)
    assert ph.seconds("sampling", warm=True) == pytest.approx((w["first_sampled_s"] - w["first_greedy_s"]) * s)
    assert engine_standin.Phases(doc, scale=0).seconds("capture", warm=False) == 0
    assert engine_standin.Phases(_phases(cold__first_greedy_s=None)).seconds("sampling", warm=False) == pytest.approx(
        c["first_sampled_s"] * s
    )
    for bad in ({"warm__capture_s": None}, {"cold__ready_s": "fast"}, {"cold__first_sampled_s": -1}):
        with pytest.raises(ValueError, match=next(iter(bad)).replace("__", ".")):
            engine_standin.Phases(_phases(**bad))


def test_the_lab_installs_the_stand_in_with_the_recording_filled_in(tmp_path):
    """The shipped file carries the recorded phases: loaded from a dir with no checkout beside
    it (as on a lab host), it has the same figures and reads no file for them."""
    import importlib.util

    from k26ops.engine.host import lab_standin_text

    shipped = tmp_path / "lab" / "k26ops_lab_engine.py"
    shipped.parent.mkdir()
    shipped.write_text(lab_standin_text())
    spec = importlib.util.spec_from_file_location("k26ops_lab_engine_shipped", shipped)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not Path(mod.PHASES_IN_CHECKOUT).exists()
    doc = json.loads(PHASES_FILE.read_text())
    assert json.loads(mod.RECORDED_PHASES) == doc and engine_standin.RECORDED_PHASES is None
    assert mod.Phases.load({}).cost == engine_standin.Phases(doc).cost


def test_a_stand_in_without_its_recording_says_so_and_stops(tmp_path):
    from labtools.fixtures import Standin

    bad = tmp_path / "phases.json"
    bad.write_text(json.dumps({"cold": {"ready_s": 1}, "warm": {}}))
    for path, why in ((tmp_path / "none.json", "No such file"), (bad, "cold.capture_s is None, not seconds")):
        s = Standin(tmp_path, env={"K26OPS_STANDIN_PHASES": str(path)})
        try:
            assert s.wait_exit(15) == 2
        finally:
            s.stop()
        err = s.err.read_text().strip()
        assert err.startswith("stand-in: its recorded start phases are unreadable: ") and why in err, err
        assert len(err.splitlines()) == 1


def test_the_lab_stand_in_compiles_once_into_the_cache_it_is_pointed_at(tmp_path, monkeypatch):
    """Cold: a kernel missing from the cache dir costs the cold recording's seconds and is written;
    warm: one found there costs the warm recording's; another dir is cold again."""
    monkeypatch.setenv("K26OPS_STANDIN_PHASE_SCALE", "0.005")  # capture: 0.44 s cold, 0.017 s warm
    for env, where in (
        ({"SGLANG_CACHE_DIR": str(tmp_path / "a")}, tmp_path / "a" / "triton"),
        ({"TRITON_CACHE_DIR": str(tmp_path / "t"), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "f")}, tmp_path / "t"),
    ):
        k = engine_standin.KernelCache(env, engine_standin.Phases.load())
        cold_s = k.phases.seconds("capture", warm=False)
        t0 = time.monotonic()
        assert k.ensure("triton", "g", "capture") is True
        assert time.monotonic() - t0 >= cold_s  # a sleep never ends early
        assert k.ensure("triton", "g", "capture") is False and (where / "g.cubin").exists()
        assert k.compiled == 1
    assert engine_standin.KernelCache({"SGLANG_CACHE_DIR": str(tmp_path / "b")}, engine_standin.Phases.load()).ensure(
        "triton", "g", "capture"
    )


def test_a_stand_in_start_is_warm_when_its_cache_holds_what_the_cold_start_wrote(tmp_path):
    """The stand-in process, started twice on one cache dir: the first start compiles its graphs'
    kernels and, at its first sampled request, the sampling kernels (the cold recording's seconds);
    the second compiles nothing, and its capture takes the warm recording's seconds."""
    from labtools.fixtures import Standin

    doc = json.loads(PHASES_FILE.read_text())
    cache = tmp_path / "engine-cache"
    env = {"SGLANG_CACHE_DIR": str(cache), "K26OPS_STANDIN_LOAD_SECONDS": "0"}
    runs = []
    for _ in ("cold", "warm"):
        s = Standin(tmp_path, env=env)
        try:
            t0 = time.monotonic()
            s.wait_ready(deadline=30)
            ready = time.monotonic() - t0
            sampled = {"text": "hi", "sampling_params": {"temperature": 0.7, "max_new_tokens": 4}}
            assert s.request("POST", "/generate", sampled)[0] == 200
        finally:
            s.stop()
        log = s.out.read_text()
        capture = sum(float(x) for x in re.findall(r"CUDA graph end\. elapsed=([0-9.]+) s", log))
        runs.append((ready, capture, sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file())))
    (cold_ready, cold_capture, cold_files), (_warm_ready, warm_capture, warm_files) = runs
    scale = doc["scale"]
    assert cold_ready >= doc["cold"]["ready_s"] * scale  # pre-capture + capture slept, cold
    assert cold_capture >= doc["cold"]["capture_s"] * scale * 0.99  # its log's rounded elapsed= figures
    assert len(cold_files) == 3 and any("sampling" in str(f) for f in cold_files)  # 2 graphs + sampling
    assert warm_files == cold_files  # the warm start compiled nothing
    assert warm_capture < doc["cold"]["capture_s"] * scale / 4  # loaded: the warm recording's 3.4 s, not 88 s


def test_bench_compare_and_the_gate_read_the_last_starts_ttfgt():
    """`bench` attaches the host's last start (Layout.last_start_file) to its result; its
    TTFGT figures are `METRIC@start`, lower is better, compared and gated like the cells'."""
    from k26ops.enginebench import figures as figs
    from k26ops.errors import UserError

    cell = {"concurrency": 1, "temperature": 0, "figures": {"tok/s": {"median": 100, "min": 99, "max": 101, "n": 3}}}
    base = {
        "cells": [cell],
        "spec": {"runs": 3},
        "startup": {"ttfgt": {"total_s": 160.0, "ready_s": 140.0, "first_sampled_s": 88.0, "capture_s": 82.5}},
    }
    cur = {
        "cells": [cell],
        "spec": {"runs": 3},
        "startup": {"ttfgt": {"total_s": 60.0, "ready_s": 51.0, "first_sampled_s": 0.4, "capture_s": None}},
    }
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
    assert (
        warmstart.cache_in_env(
            {"k26ops_root": "/srv/k"}, units.render_env({"env": engine_cache.variables("0.5.23", d)})
        )
        is None
    )  # another root's
    assert warmstart.cache_in_env({}, None) is None
