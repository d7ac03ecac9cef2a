"""`k26ops monitoring`: the Prometheus files checked by Prometheus' own promtool (config,
rules, and the alerts' behaviour with `promtool test rules`), the Grafana dashboard
round-tripped through Grafana's Foundation SDK models (generated from Grafana's schema),
and every engine metric the dashboard uses served by the lab's engine stand-in, whose
names come from the real engine's recorded /metrics (or are listed as read, not recorded)."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess

import pytest
import yaml

from k26ops.engine import launch, profile
from k26ops.monitoring import check, grafana, metrics, prometheus
from k26ops.release import recipe as recipe_mod
from labtools import REPO
from labtools.fixtures import Standin
from labtools.invoke import cli

INVENTORY = """\
all:
  vars:
    monitoring: true
    extra_flags: [--api-key, sekrit-key-123]
  children:
    gpu:
      hosts:
        rtx01: {ansible_host: 10.0.0.11, engine_profile: {host: 0.0.0.0}}
        rtx02: {ansible_host: 10.0.0.12, engine_port: 30001,
                monitoring: {dcgm_port: 9401, gateway: "10.0.0.5:29000"}}
"""


@pytest.fixture
def written(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(INVENTORY)
    out = tmp_path / "mon"
    proc = cli("-i", str(inv), "monitoring", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def promtool() -> str:
    exe = shutil.which("promtool")
    if not exe:
        pytest.skip("promtool is not installed (Debian package `prometheus`; `make system-deps` installs it)")
    return exe


def test_writes_targets_config_rules_and_dashboard(written):
    out, proc = written
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert names == [
        "grafana/k26ops-dashboard.json",
        "k26ops-rules.yml",
        "prometheus.yml",
        "secrets/k26-engine-api-key",
        "targets/k26-dcgm.json",
        "targets/k26-engine.json",
        "targets/k26-gateway.json",
    ]
    engine = json.loads((out / "targets/k26-engine.json").read_text())
    assert engine == [
        {"targets": ["10.0.0.11:30000"], "labels": {"host": "rtx01"}},
        {"targets": ["10.0.0.12:30001"], "labels": {"host": "rtx02"}},
    ]
    dcgm = json.loads((out / "targets/k26-dcgm.json").read_text())
    assert [d["targets"][0] for d in dcgm] == ["10.0.0.11:9400", "10.0.0.12:9401"]
    assert json.loads((out / "targets/k26-gateway.json").read_text())[0]["targets"] == ["10.0.0.5:29000"]
    # rtx02's engine binds loopback (the default): said, with what to do
    assert "rtx02: the engine listens on 127.0.0.1 only" in proc.stderr and "rtx01" not in proc.stderr


def test_the_api_key_is_a_credentials_file_never_in_the_config(written, tmp_path):
    out, proc = written
    for p in out.rglob("*"):
        if p.is_file() and p.parent.name != "secrets":
            assert "sekrit-key-123" not in p.read_text(), p
    assert "sekrit-key-123" not in proc.stdout + proc.stderr
    key = out / "secrets/k26-engine-api-key"
    assert key.read_text() == "sekrit-key-123\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    job = yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"][0]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "secrets/k26-engine-api-key"}
    # --api-key-file: the operator's own file is named, and no key is written
    inv = tmp_path / "inv.yml"
    other = tmp_path / "other"
    proc = cli("-i", str(inv), "monitoring", "--out", str(other), "--api-key-file", "/etc/prometheus/k26-key")
    assert proc.returncode == 0 and not (other / "secrets").exists()
    job = yaml.safe_load((other / "prometheus.yml").read_text())["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/etc/prometheus/k26-key"


def test_promtool_accepts_the_config_and_the_rules(written):
    out, _ = written
    exe = promtool()
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "k26ops-rules.yml"]):
        proc = subprocess.run([exe, *args], cwd=out, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and it is a real check: a bad expression or a missing key file is refused
    (out / "secrets/k26-engine-api-key").unlink()
    proc = subprocess.run([exe, "check", "config", "prometheus.yml"], cwd=out, capture_output=True, text=True)
    assert proc.returncode != 0 and "k26-engine-api-key" in proc.stdout + proc.stderr
    bad = out / "bad.yml"
    bad.write_text((out / "k26ops-rules.yml").read_text().replace("== 0", "== = 0", 1))
    assert subprocess.run([exe, "check", "rules", str(bad)], capture_output=True).returncode != 0


RULES_TEST = """\
rule_files: [k26ops-rules.yml]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
  # rtx01: 3.0 tokens per verify step (baseline 3.2, 10 % margin: 2.88): no alert
  - series: 'sglang:generation_tokens_total{job="k26-engine",host="rtx01",is_streaming="true"}'
    values: '0+300x60'
  - series: 'sglang:spec_verify_calls_total{job="k26-engine",host="rtx01"}'
    values: '0+100x60'
  # rtx02: 2.0 per step against its baseline 3.2: fires after 15 min of a 15 min average
  - series: 'sglang:generation_tokens_total{job="k26-engine",host="rtx02",is_streaming="true"}'
    values: '0+200x60'
  - series: 'sglang:spec_verify_calls_total{job="k26-engine",host="rtx02"}'
    values: '0+100x60'
  - series: 'up{job="k26-engine",host="rtx01",instance="10.0.0.11:30000"}'
    values: '1x10 0x10'
  - series: 'DCGM_FI_DEV_XID_ERRORS{job="k26-dcgm",host="rtx01",gpu="3"}'
    values: '0x10 79x10'
  alert_rule_test:
  - eval_time: 40m
    alertname: K26AcceptLengthBelowBaseline
    exp_alerts:
    - exp_labels: {host: rtx02, severity: warning}
      exp_annotations:
        summary: "rtx02: accept length 2.00 is over 10% below the baseline's"
        description: "The drafter accepts fewer tokens than at the baseline: a changed drafter, engine or traffic mix (temperature, prompts)."
  - eval_time: 15m
    alertname: K26EngineNotServing
    exp_alerts:
    - exp_labels: {job: k26-engine, host: rtx01, instance: "10.0.0.11:30000", severity: critical}
      exp_annotations:
        summary: "rtx01: the engine's /metrics does not answer"
        description: "Prometheus cannot scrape 10.0.0.11:30000 for 2 minutes: the engine is down, restarting or not started with --enable-metrics."
  - eval_time: 9m
    alertname: K26EngineNotServing
    exp_alerts: []
  - eval_time: 12m
    alertname: K26GpuNewXid
    exp_alerts:
    - exp_labels: {job: k26-dcgm, host: rtx01, gpu: "3", severity: critical}
      exp_annotations:
        summary: "rtx01 GPU 3: a new Xid"
        description: "DCGM_FI_DEV_XID_ERRORS changed (its value is the last Xid's code); `k26ops facts` and `k26ops diagnose` name it."
"""


def test_the_alerts_fire_when_they_should_promtool_test_rules(tmp_path):
    """Prometheus' own rule evaluator on made-up series: accept length below the baseline's
    (from the counters, as the bench reads it), an engine that stops answering, a new Xid."""
    exe = promtool()
    targets = [
        prometheus.HostTarget("rtx01", "10.0.0.11:30000", dcgm="10.0.0.11:9400", baseline_accept=3.2),
        prometheus.HostTarget("rtx02", "10.0.0.12:30000", baseline_accept=3.2),
    ]
    files = prometheus.files(targets)
    (tmp_path / "k26ops-rules.yml").write_text(files.texts["k26ops-rules.yml"])
    (tmp_path / "test.yml").write_text(RULES_TEST)
    proc = subprocess.run([exe, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_baseline_accept_is_the_lowest_stored_cell():
    from k26ops.monitoring.targets import baseline_accepts

    bench = json.loads((REPO / "tests/data/serving/h200-bench-sglang.json").read_text())["hosts"]["h200"]["bench"]
    assert baseline_accepts({"h200": bench}) == {"h200": 1.0159}


def standin_metric_names(tmp_path) -> set[str]:
    s = Standin(tmp_path, "--enable-metrics")
    try:
        s.wait_ready()
        s.request("POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 8}})
        code, text = s.request("GET", "/metrics")
        assert code == 200
        return check.family_names(text)
    finally:
        s.stop()


def test_the_dashboard_uses_only_metrics_the_engine_standin_serves(tmp_path):
    """A renamed engine metric fails here, not as an empty panel: every sglang: name of the
    dashboard is served by the lab's stand-in, and the stand-in serves only names of the
    metric table (which says, per name, where the real engine showed it)."""
    served = standin_metric_names(tmp_path)
    used = grafana.used_names(grafana.dashboard())
    assert check.missing(used, served) == []
    assert {n for n in served if n.startswith("sglang:")} == set(metrics.ENGINE)
    # the alert rules' engine names too
    rules = prometheus.rules([prometheus.HostTarget("h", "a:1", baseline_accept=3.0)])
    assert check.missing(set(re.findall(r"sglang:[a-z_]+", rules)), served) == []
    # and the check itself sees a rename
    assert check.missing(used, {n.replace("num_queue_reqs", "num_waiting_reqs") for n in served}) == [
        "sglang:num_queue_reqs"
    ]


def test_names_said_recorded_are_in_the_recordings():
    """Each `recorded` name appears in the real engine's recorded /metrics it names; the rest
    are listed as read from SGLang's source, for the lead to record on the GPU (none left since
    the H100's whole /metrics was recorded)."""
    for m in metrics.ENGINE.values():
        if m.source in (metrics.RECORDED_SPEC, metrics.RECORDED_STARTUP, metrics.RECORDED_FULL):
            text = (REPO / m.source.split(" ", 1)[0]).read_text()
            assert m.name in text, (m.name, m.source)
    assert metrics.RECORD_NEXT == []
    full = check.family_names((REPO / metrics.RECORDED_FULL.split(" ", 1)[0]).read_text())
    assert set(metrics.ENGINE) <= full, set(metrics.ENGINE) - full  # every dashboard name, served by 0.5.17


def test_family_names_of_the_recorded_real_metrics():
    text = (REPO / "tests/data/serving/h200-metrics-end.txt").read_text()
    assert check.family_names(text) == {
        "sglang:spec_accept_length",
        "sglang:generation_tokens_total",
        "sglang:spec_verify_calls_total",
    }
    hist = (
        "# TYPE sglang:time_to_first_token_seconds histogram\n"
        'sglang:time_to_first_token_seconds_bucket{le="0.1"} 1.0\n'
        "sglang:time_to_first_token_seconds_sum 0.3\nsglang:time_to_first_token_seconds_count 1.0\n"
    )
    assert check.family_names(hist) == {"sglang:time_to_first_token_seconds"}


def test_the_dashboard_fits_grafanas_own_schema():
    """Round-trip through Grafana's Foundation SDK (its models are generated from Grafana's
    dashboard schema): a field the schema does not know is dropped, so the trip changes it."""
    sdk = pytest.importorskip(
        "grafana_foundation_sdk.models.dashboard",
        reason="grafana-foundation-sdk is not installed (pip install '.[test]')",
    )

    def trip(board):
        return json.loads(
            json.dumps(sdk.Dashboard.from_json(json.loads(json.dumps(board))).to_json(), default=lambda o: o.to_json())
        )

    def pruned(a, b):  # a's keys that b lacks, recursively
        if isinstance(a, dict):
            return [k for k in a if k not in b] + [x for k in a if k in b for x in pruned(a[k], b[k])]
        if isinstance(a, list):
            return [x for i, j in zip(a, b) for x in pruned(i, j)]
        return []

    board = grafana.dashboard()
    assert pruned(board, trip(board)) == []
    board["panels"][1]["gridpos"] = board["panels"][1].pop("gridPos")  # a misspelt key
    assert pruned(board, trip(board)) == ["gridpos"]
    assert {p["type"] for p in grafana.dashboard()["panels"]} == {"row", "timeseries", "bargauge"}


def test_monitoring_runs_the_engine_with_metrics():
    r = recipe_mod.load(None)
    base = {"recipe": None, "model_path": "/models/k", "extra_flags": ["--api-key", "k"]}
    off = launch.engine_argv(profile.profile_for(base, r))
    on = launch.engine_argv(profile.profile_for({**base, "monitoring": True}, r))
    assert "--enable-metrics" not in off and on.count("--enable-metrics") == 1
    twice = profile.profile_for({**base, "monitoring": True, "extra_flags": ["--enable-metrics"]}, r)
    assert launch.engine_argv(twice).count("--enable-metrics") == 1
    assert profile.with_metrics({"--mem-fraction-static": 0.8}) == {
        "--mem-fraction-static": 0.8,
        "--enable-metrics": True,
    }


@pytest.mark.parametrize(
    "value, says",
    [
        ("yes", "must be true or a mapping"),
        ({"dcgm": 1}, "unknown key 'dcgm'"),
        ({"dcgm_port": 99999}, "must be a port number"),
        ({"gateway": "nohostport"}, "must be HOST:PORT"),
    ],
)
def test_a_bad_monitoring_var_is_one_line_and_writes_nothing(tmp_path, value, says):
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"h1": {"ansible_host": "10.0.0.1", "monitoring": value}}}}))
    out = tmp_path / "mon"
    proc = cli("-i", str(inv), "monitoring", "--out", str(out))
    assert proc.returncode == 2 and says in proc.stderr and "h1" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
