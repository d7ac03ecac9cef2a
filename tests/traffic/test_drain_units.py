"""systemd never SIGKILLs a drain k26ops started (issue 41, item 2.3): every engine unit k26ops
writes has a TimeoutStopSec larger than the host's drain_timeout, whether the deploy renders it
(templates/sglang.service.j2 through the service step's settings) or a rollback writes a tag's
recorded unit (k26ops.baselines.rollback: the tag's TimeoutStopSec is raised where it is not)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from k26ops.engine import units
from k26ops.inventory.model import Host
from k26ops.steps import StepFailed, traffic

GW = {"model_gateway": "http://127.0.0.1:30080"}


def ctx(**v) -> SimpleNamespace:
    return SimpleNamespace(host=Host(name="lab1", address="127.0.0.1", vars=v), vars=v)


def stop_sec(unit_text: str) -> int:
    service = unit_text.split("[Service]", 1)[1].split("\n[", 1)[0]
    vals = [ln.split("=", 1)[1] for ln in service.splitlines() if ln.startswith("TimeoutStopSec=")]
    assert vals, unit_text
    return int(vals[-1])  # systemd: the last assignment wins


def rendered(c, inventory_settings: dict | None = None) -> str:
    """The engine unit as the service step renders it (k26ops.steps.engine.ServiceStep.plan)."""
    settings = traffic.unit_settings(c, units.unit_settings(inventory_settings or {}))
    return units.render_unit({**settings, "argv": ["/usr/bin/python3", "-m", "sglang.launch_server"]})


@pytest.mark.parametrize(
    "hv",
    [
        {**GW},
        {**GW, "drain_timeout": 900},
        {**GW, "drain_timeout": 0.5},
        {"drain_hook": "/bin/true"},
        {"drain": "plain", "drain_timeout": 1800},
    ],
    ids=["gateway-default", "gateway-900", "gateway-0.5", "hook", "plain-1800"],
)
def test_a_rendered_engine_unit_stops_later_than_the_drain(hv):
    c = ctx(**hv)
    cfg = traffic.config(c)
    assert stop_sec(rendered(c)) > cfg.drain_timeout
    assert stop_sec(rendered(c)) == cfg.timeout_stop_sec()


def test_without_traffic_the_unit_keeps_its_default():
    assert stop_sec(rendered(ctx())) == 120


def test_an_inventory_timeout_stop_sec_not_above_the_drain_is_refused_in_one_line():
    c = ctx(**GW, drain_timeout=300)
    with pytest.raises(StepFailed) as exc:
        rendered(c, {"TimeoutStopSec": 300})
    msg = str(exc.value)
    assert "\n" not in msg and "300" in msg and "drain_timeout" in msg and "nothing was changed" in msg
    assert stop_sec(rendered(c, {"TimeoutStopSec": 301})) == 301  # a larger one is the user's to set


TAG_UNIT = (
    "[Unit]\nDescription=engine\n\n[Service]\nType=exec\nExecStart=/bin/true\n{stop}KillMode=mixed\n\n"
    "[Install]\nWantedBy=multi-user.target\n"
)


@pytest.mark.parametrize(
    "recorded,want,changed",
    [
        ("TimeoutStopSec=120\n", 360, True),  # a tag from before the drain: raised
        ("TimeoutStopSec=2min\n", 360, True),
        ("", 360, True),  # systemd's default (90 s): one added
        ("TimeoutStopSec=301\n", 301, False),  # already larger: verbatim
        ("TimeoutStopSec=10min\n", None, False),
        ("TimeoutStopSec=infinity\n", None, False),
    ],
)
def test_a_rollbacks_recorded_unit_gets_a_stop_timeout_above_the_drain(recorded, want, changed):
    text = TAG_UNIT.format(stop=recorded)
    out, note = traffic.unit_text_stop_timeout(ctx(**GW), text)
    assert (note is not None) == changed and (out != text) == changed
    if want is not None:
        assert stop_sec(out) == want
    if changed:
        assert "drain_timeout" in note
        assert out.replace(f"TimeoutStopSec={want}\n", "", 1) == text.replace(recorded, "", 1)  # nothing else
    assert traffic.unit_text_stop_timeout(ctx(), text) == (text, None)  # no traffic: verbatim


def _snapshot(repo, tag: str, hosts: dict) -> None:
    """A tag whose hosts stored a bench with these p99 end-to-end latencies (ms per cell), or none."""
    files = {"baseline.json": json.dumps({"hosts": {h: {"release_id": "r1"} for h in hosts}}).encode()}
    for h, p99s in hosts.items():
        if p99s:
            cells = [
                {
                    "concurrency": c,
                    "temperature": 0.0,
                    "figures": {"e2e_p99_ms": {"median": v, "min": v, "max": v, "n": 3}},
                }
                for c, v in enumerate(p99s, 1)
            ]
            files[f"hosts/{h}/bench.json"] = json.dumps({"spec": {}, "cells": cells}).encode()
    repo.commit_snapshot(files, f"test {tag}", tag, f"test {tag}")


def test_the_default_drain_timeout_is_the_p99_of_the_hosts_newest_stored_bench(tmp_path, monkeypatch):
    from k26ops.baselines import Baselines
    from k26ops.traffic.drain import TrafficConfig

    monkeypatch.setenv("K26OPS_BASELINES", str(tmp_path / "b"))
    h = ctx(**GW).host
    assert TrafficConfig.of(h).drain_timeout_from == "default"  # no repository yet
    repo = Baselines(tmp_path / "b")
    _snapshot(repo, "a-old", {"lab1": [1000.0], "lab2": [5000.0]})
    _snapshot(repo, "b-new", {"lab1": [2500.0, 41250.0], "lab2": None})
    cfg = TrafficConfig.of(h)
    assert cfg.drain_timeout == 41.25 and "b-new" in cfg.drain_timeout_from  # the largest cell of the newest
    assert cfg.timeout_stop_sec() > cfg.drain_timeout
    lab2 = Host(name="lab2", address="127.0.0.1", vars=GW)
    assert TrafficConfig.of(lab2).drain_timeout == 5.0  # its newest tag stored no bench: the one before
    assert TrafficConfig.of(Host(name="lab3", address="127.0.0.1", vars=GW)).drain_timeout == 300
    assert TrafficConfig.of(Host(name="lab1", address="127.0.0.1", vars={**GW, "drain_timeout": 9})).drain_timeout == 9
    assert "41.25s (p99 end-to-end latency in baseline b-new)" in cfg.summary()


def test_rolling_is_the_default_where_traffic_is_set_and_the_config_file_can_set_the_batch(tmp_path, monkeypatch):
    from k26ops.cli.batchopts import default_batch
    from k26ops.errors import UserError
    from k26ops.orchestrate.rollout import parse_batches

    conf = tmp_path / "config.toml"
    monkeypatch.setenv("K26OPS_CONFIG", str(conf))
    conf.write_text("")
    plain = [Host(name=n, address="127.0.0.1", vars={}) for n in ("lab1", "lab2")]
    routed = [*plain, Host(name="lab3", address="127.0.0.1", vars=dict(GW))]
    settings = lambda hosts: SimpleNamespace(selected_hosts=lambda: hosts)  # noqa: E731
    assert default_batch(settings(plain), None) is None  # as before: the rest at once
    assert default_batch(settings(routed), None) == parse_batches("1")  # one host at a time
    assert default_batch(settings(routed), parse_batches("2")) == parse_batches("2")  # --batch wins
    hooked = [Host(name="h", address="127.0.0.1", vars={"drain_hook": "/bin/true"})]
    assert default_batch(settings(hooked), None) == parse_batches("1")
    conf.write_text('batch = "1,25%"\n')
    assert default_batch(settings(plain), None) == parse_batches("1,25%")  # the config file's
    conf.write_text("batch = 2\n")
    assert default_batch(settings(routed), None) == parse_batches("2")
    conf.write_text('batch = "0"\n')
    with pytest.raises(UserError) as exc:
        default_batch(settings(plain), None)
    assert str(exc.value).startswith(f"{conf}: batch") and "\n" not in str(exc.value)


def test_the_table_says_per_host_what_the_drain_did():
    from k26ops.cli.rollout import traffic_cell

    back = {
        "mode": "gateway",
        "drain_s": 20.7,
        "requests": 18,
        "out_of_rotation_s": 36.1,
        "stop_to_serving_s": 15.4,
        "put_back": True,
    }
    assert traffic_cell(back) == "drained 21s (18 req), out 36s, stop->serving 15s"
    failed = {**back, "out_of_rotation_s": None, "stop_to_serving_s": None, "put_back": False}
    assert traffic_cell(failed) == "drained 21s (18 req), left out of rotation"
    assert (
        traffic_cell({"mode": "plain", "drain_s": None, "requests": 2, "stop_to_serving_s": 9.0}) == "stop->serving 9s"
    )
