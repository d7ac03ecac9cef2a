"""The managed gateway, worked out on the control node (k26ops/steps/gateway_spec.py,
templates/sglang-router.service.j2, templates/gateway_launch.py): no host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k26ops.errors import UserError
from k26ops.inventory import Host
from k26ops.steps import gateway_spec as spec
from k26ops.steps.gateway import check_engines
from labtools import REPO
from labtools.invoke import cli, cli_json

KEY = "adm:n-Secret-4711"


def gw_host(**vars) -> Host:
    return Host(name="gw1", address="10.0.0.9", vars={"gateway_admin_key": KEY, **vars})


def test_the_admin_key_is_in_the_env_file_only_never_in_the_unit_or_argv():
    gw = spec.GatewayHost.of(gw_host(gateway_port=8080, gateway_flags={"--policy": "round_robin"}))
    argv, unit = gw.argv(), gw.render_unit("sglang-router-0.3.2-abc")
    assert not any(KEY in a for a in argv) and KEY not in unit
    assert "--port 8080" in unit and "--policy round_robin" in unit
    assert f"{spec.KEY_ENV}=" in gw.render_env() and KEY in gw.render_env()
    assert (
        spec.GatewayHost.of(Host(name="gw1", address="h", vars={}))
        .render_env()
        .strip()
        .splitlines()[-1]
        .startswith("#")
    )


def test_the_unit_verifies_and_systemd_never_cuts_the_routers_drain(tmp_path):
    gw = spec.GatewayHost.of(gw_host())
    text = gw.render_unit("sglang-router-0.3.2-abc")
    stop = int(next(line for line in text.splitlines() if line.startswith("TimeoutStopSec=")).split("=")[1])
    assert f"--shutdown-grace-period-secs {spec.STOP_GRACE}" in text and stop > spec.STOP_GRACE
    assert text.startswith("# Managed by k26ops")
    unit = tmp_path / "k26-gateway.service"
    # verify resolves ExecStart's program: a stand-in python where the release's will be
    exe = Path(gw.argv()[0])
    unit.write_text(text.replace(str(exe), sys.executable))
    (tmp_path / "env").write_text(gw.render_env())
    unit.write_text(unit.read_text().replace(spec.ENV_FILE, str(tmp_path / "env")))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize(
    "flags,word",
    [
        ({"--port": 1}, "--port"),
        (["--host=0.0.0.0"], "--host"),
        ({"control-plane-api-keys": "a:b:admin:c"}, "--control-plane-api-keys"),
        ({"--worker-urls": ["http://x:1"]}, "--worker-urls"),
    ],
)
def test_flags_k26ops_sets_are_refused_in_one_line(flags, word):
    with pytest.raises(UserError, match=rf"^gw1: inventory var gateway_flags may not set {word}: k26ops sets it"):
        spec.GatewayHost.of(gw_host(gateway_flags=flags))


@pytest.mark.parametrize(
    "var,value", [("gateway_port", 0), ("gateway_port", "80"), ("gateway_metrics_port", 70000), ("gateway_port", True)]
)
def test_bad_ports_name_the_host_and_variable(var, value):
    with pytest.raises(UserError, match=rf"^gw1: inventory var {var}: expected a port 1-65535, got"):
        spec.GatewayHost.of(gw_host(**{var: value}))


def test_a_bad_admin_key_is_refused_without_showing_it():
    with pytest.raises(UserError) as e:
        spec.GatewayHost.of(gw_host(gateway_admin_key="two words"))
    assert "two words" not in str(e.value) and "gateway_admin_key" in str(e.value)


def test_the_shipped_lock_pins_0_3_2_with_its_dependencies_and_hashes():
    lock = spec.load_lock(spec.lock_path({}))
    names = {n.lower() for n, _, _ in lock.entries}
    assert lock.version == "0.3.2" and lock.python == "3.11"
    # sglang-router 0.3.2's Requires-Dist (its METADATA): setproctitle, aiohttp, orjson, uvicorn, fastapi
    assert {"sglang-router", "setproctitle", "aiohttp", "orjson", "uvicorn", "fastapi"} <= names
    assert all(len(sha) == 64 for _, _, sha in lock.entries)
    other = spec.load_lock(REPO / "tests/data/gateway/sglang-router-0.3.1.lock")
    assert spec.release_id(other) != spec.release_id(lock) and spec.release_id(lock).startswith("sglang-router-0.3.2-")


def test_a_lock_that_is_not_a_gateway_lock_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"gateway lock not found"):
        spec.load_lock(tmp_path / "nope.lock")
    with pytest.raises(UserError, match=r"not a gateway lock"):
        spec.load_lock(REPO / "playbooks/recipes/lab-registry.lock")


def test_engines_name_their_gateway_by_host_name_or_url():
    gw = spec.GatewayHost.of(gw_host(gateway_port=8080))
    engines = [
        {"name": "a", "url": "http://a:1", "gateways": ["gw1"]},
        {"name": "b", "url": "http://b:1", "gateways": ["http://10.0.0.9:8080/"]},
        {"name": "c", "url": "http://c:1", "gateways": ["http://elsewhere:8080"]},
    ]
    assert [e["name"] for e in spec.engines_of(gw, engines)] == ["a", "b"]
    with pytest.raises(UserError, match=r"^c: inventory var gateways: 'gw2' is no inventory host"):
        check_engines([{"name": "c", "gateways": ["gw2"]}], [gw_host()], {"gw1", "c"})
    with pytest.raises(UserError, match=r"^c: inventory var gateways: 'c' is not in the group `gateway`"):
        check_engines([{"name": "c", "gateways": ["c"]}], [gw_host()], {"gw1", "c"})


def test_launcher_hands_the_key_to_the_router_in_memory_only(tmp_path):
    """templates/gateway_launch.py with a recording sglang_router in place of the real one:
    the router's parser gets the control-plane key; the process's argv and environment do not."""
    pkg = tmp_path / "sglang_router"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_router.py").write_text(
        "import json, os, sys\n"
        "def parse_router_args(args):\n    return args\n"
        "def launch_router(args):\n"
        "    cmdline = open('/proc/self/cmdline', 'rb').read().decode()\n"
        "    print(json.dumps({'args': args, 'cmdline': cmdline, 'argv': sys.argv,\n"
        "                      'env': os.environ.get('K26OPS_GATEWAY_ADMIN_KEY')}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), spec.KEY_ENV: KEY}
    p = subprocess.run([sys.executable, str(spec.LAUNCHER), "--port", "1"], capture_output=True, text=True, env=env)
    got = yaml.safe_load(p.stdout)
    assert got["args"] == ["--port", "1", "--control-plane-api-keys", f"k26ops:k26ops:admin:{KEY}"]
    assert KEY not in got["cmdline"] and KEY not in " ".join(got["argv"]) and got["env"] is None
    env.pop(spec.KEY_ENV)
    p = subprocess.run([sys.executable, str(spec.LAUNCHER)], capture_output=True, text=True, env=env)
    assert yaml.safe_load(p.stdout)["args"] == []


def test_gateway_commands_without_a_gateway_group_say_so(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text("hosts:\n  a: {address: 127.0.0.1}\n")
    r = cli("-i", str(inv), "gateway", "deploy", "--check")
    assert r.returncode == 2 and "no group `gateway`" in r.stderr and "Traceback" not in r.stderr
    inv.write_text(
        "hosts:\n  a: {address: 127.0.0.1, vars: {gateways: [gw9]}}\n  g: {address: 127.0.0.1}\n"
        "groups:\n  gateway: {hosts: [g]}\n"
    )
    r = cli("-i", str(inv), "gateway", "deploy", "--check")
    assert r.returncode == 2 and "a: inventory var gateways: 'gw9' is no inventory host" in r.stderr


def test_gateway_lock_writes_a_lock_the_deploy_reads(tmp_path, monkeypatch):
    """`gateway lock` (the resolver answered from the shipped lock's entries: the index moves on)."""
    from k26ops.release import enginelock

    shipped = spec.load_lock(spec.lock_path({}))
    monkeypatch.setattr(enginelock, "resolve_requirements", lambda reqs, python, idx=(): list(shipped.entries))
    out = tmp_path / "gw.lock"
    rc, doc = cli_json("gateway", "lock", "0.3.2", "--python", "3.11", "-o", str(out))
    assert rc == 0 and doc["output"] == str(out) and doc["lock"] == out.read_text()
    got = spec.load_lock(out)
    assert (got.version, got.python, got.entries) == ("0.3.2", "3.11", shipped.entries)
    assert out.read_text() == spec.lock_path({}).read_text()  # the shipped lock is what the command makes
    r = cli("gateway", "lock", "0.3.2", "-o", str(tmp_path / "no/such/dir/x.lock"))
    assert r.returncode == 2 and "cannot write the lock" in r.stderr and "Traceback" not in r.stderr
    r = cli("gateway", "lock", "latest")
    assert r.returncode == 2 and "expected VERSION like 0.3.2" in r.stderr


def test_engines_that_name_a_managed_gateway_drain_through_it(tmp_path):
    """`gateways: [gw1]` is enough for the drain (issue 41 item 4: the managed gateway works as an
    existing one): the selected hosts' model_gateway and admin key come from the gateway host."""
    from k26ops import inventory
    from k26ops.steps.gateway import drain_targets
    from k26ops.traffic.drain import TrafficConfig

    inv_path = tmp_path / "inventory.yml"
    inv_path.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "gw1": {"address": "10.0.0.9", "vars": {"gateway_port": 8080, "gateway_admin_key": KEY}},
                    "gw2": {"address": "10.0.0.10", "vars": {"gateway_admin_key": "other-key"}},
                    "e1": {"address": "10.0.0.1", "vars": {"gateways": ["gw1"]}},
                    "e2": {"address": "10.0.0.2", "vars": {"gateways": ["gw1", "http://lb.example:9000"]}},
                    "e3": {"address": "10.0.0.3", "vars": {"gateways": ["gw1"], "model_gateway": "http://mine:1"}},
                    "e4": {"address": "10.0.0.4"},
                },
                "groups": {"gateway": {"hosts": ["gw1", "gw2"]}},
            }
        )
    )
    inv = inventory.load(inv_path, ssh_config=None)
    hosts = [inv.host(n) for n in ("e1", "e2", "e3", "e4")]
    drain_targets(inv, hosts)
    cfg = {h.name: TrafficConfig.of(h, bench_p99=None) for h in hosts}
    assert cfg["e1"].mode == "gateway" and cfg["e1"].gateways == ("http://10.0.0.9:8080",)
    assert cfg["e1"].api_key == KEY and KEY not in repr(cfg["e1"])
    assert cfg["e2"].gateways == ("http://10.0.0.9:8080", "http://lb.example:9000")
    assert cfg["e3"].gateways == ("http://mine:1",) and cfg["e3"].api_key is None  # the inventory's own wins
    assert cfg["e4"].mode == "none"
    drain_targets(inv, hosts)  # again (the CLI selects more than once): the same
    assert TrafficConfig.of(hosts[0], bench_p99=None) == cfg["e1"]
    bad = inventory.load(inv_path, ssh_config=None)
    bad.host("e1").vars["gateways"] = ["gw1", "gw2"]
    with pytest.raises(UserError, match=r"^e1: inventory var gateways: gw1, gw2 have different admin keys"):
        drain_targets(bad, [bad.host("e1")])
    bad.host("e1").vars["gateways"] = ["e4"]
    with pytest.raises(UserError, match=r"^e1: inventory var gateways: 'e4' is not in the group `gateway`"):
        drain_targets(bad, [bad.host("e1")])
