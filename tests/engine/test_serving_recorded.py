"""What a real engine answered on the lent H200 when served as the unit serves it
(tests/data/serving, bench/device/h200_serve.sh): the parsers and the crash
classifier on those real outputs."""

from __future__ import annotations

import json
from pathlib import Path

from jsonshape import validate

from k26ops.agents import loadgen
from k26ops.diagnose.classify import classify

DATA = Path(__file__).parent.parent / "data/serving"
SERVED = (DATA / "h200-serve-redacted.log").read_text()


def test_an_engine_stopped_by_sigterm_is_no_crash():
    d = classify(SERVED)
    assert d.error_found is False and d.signature is None, d.to_json()


def test_the_same_tail_without_a_requested_stop_is_still_an_error():
    # a scheduler dying of signal 15 that no stop asked for (an OOM killer, a stray kill)
    unasked = "\n".join(l for l in SERVED.splitlines() if "SIGTERM received" not in l)
    d = classify(unasked)
    assert d.error_found is True and "SIGQUIT" in d.evidence + json.dumps(d.to_json())


def test_an_error_before_the_stop_is_still_named():
    lines = SERVED.splitlines()
    stop = next(i for i, l in enumerate(lines) if "SIGTERM received" in l)
    crash = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    d = classify("\n".join(lines[:stop] + crash + lines[stop:]))
    assert d.signature == "illegal-memory-access"


def test_spec_counters_sum_every_label_set_of_the_real_metrics():
    c = loadgen.parse_counters((DATA / "h200-metrics-end.txt").read_text())
    assert c == {"sglang:generation_tokens_total": 24.0 + 6528.0, "sglang:spec_verify_calls_total": 6441.0}
    assert loadgen.cell_accept((24.0, 41.0), (6552.0, 6441.0)) == (6552.0 - 24.0) / (6441.0 - 41.0)


def test_recorded_bench_answers_keep_the_json_shape_and_per_cell_accept():
    for gen, source in (("sglang", loadgen.PER_CELL), ("k26ops", "meta_info.spec_accept_length")):
        doc = json.loads((DATA / f"h200-bench-{gen}.json").read_text())
        validate(doc)
        cells = (
            doc["hosts"][0]["bench"]["cells"]
            if isinstance(doc["hosts"], list)
            else doc["hosts"]["h200"]["bench"]["cells"]
        )
        assert [c["accept_source"] for c in cells] == [source] * 4


def test_the_real_startup_log_leaks_the_key_only_without_the_redaction_patch():
    assert "api_key='<KEY>'" in (DATA / "h200-serve-unpatched-startup.log").read_text()
    assert "server_args=ServerArgs(" in SERVED and "api_key" not in SERVED and "<KEY>" not in SERVED


def _engine_agent():
    """The host agent as hosts run it (a stdlib script): loaded from its file."""
    import importlib.util

    import k26ops.agents

    spec = importlib.util.spec_from_file_location("engine_agent", Path(k26ops.agents.__file__).parent / "engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_deploys_smoke_on_the_real_engine_is_answered_with_the_key_and_refused_without():
    from k26ops.steps.engine import SmokeStep, smoke_outcome, smoke_summary

    doc = json.loads((DATA / "h200-deploy-smoke.json").read_text())
    body, _ = SmokeStep({}).request()
    assert doc["request"] == body  # recorded with the requests the deploy sends today
    agent = _engine_agent()
    with_key, without = doc["with_key"]["results"], doc["without_key"]["results"]
    assert [agent.answered(r) for r in with_key] == [True, True]
    assert [agent.answered(r) for r in without] == [False] and without[0]["status"] == 401
    s = smoke_outcome(with_key)
    assert s["spec_accept_length"] == with_key[0]["body"]["meta_info"]["spec_accept_length"] > 1.0
    assert s["sampled"]["spec_accept_length"] > 1.0
    assert smoke_summary(s).startswith("330 ms, accept 1.066") and "T=0.7: 89367 ms" in smoke_summary(s)
