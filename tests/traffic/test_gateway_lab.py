"""The managed gateway on real lab hosts: `k26ops gateway deploy` installs the real
sglang-router (PyPI wheels, hash-checked) as a release on a lab host, runs it under
systemd, registers the lab engines (stand-ins) of the hosts that name it, and routes
/generate to them; a changed pin rolls the release, a failed one rolls back."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml

from labtools import REPO
from labtools.invoke import k26ops, k26ops_json
from labtools.ports import free_port_block

KEY = "gw-admin-Secret-9f3k"
UNIT = "k26-gateway.service"
LOCK_031 = REPO / "tests/data/gateway/sglang-router-0.3.1.lock"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from labtools.labs import private_lab

    d = tmp_path_factory.mktemp("gateway")
    with private_lab(2, "gateway", deployed=True) as lab:
        # the lab hosts share the loopback with other labs: the gateway's own port block
        port = free_port_block(2, start=31000, stop=33000)
        yield {"lab": lab, "dir": d, "gw": lab.hosts[1].name, "port": port}


def inventory(g, tag: str, **gw_vars) -> str:
    inv = yaml.safe_load(g["lab"].inventory.read_text())
    inv["vars"]["gateways"] = [g["gw"]]  # both engines name it (by host name)
    inv["hosts"][g["gw"]]["vars"].update(
        {
            "gateway_port": g["port"],
            "gateway_metrics_port": g["port"] + 1,
            "gateway_bind": "127.0.0.1",
            "gateway_admin_key": KEY,
            **gw_vars,
        }
    )
    inv["groups"]["gateway"] = {"hosts": [g["gw"]]}
    path = g["dir"] / f"inv-{tag}.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def remote(g, cmd: str) -> str:
    return g["lab"].ssh(g["gw"], cmd).strip()


def generate(g) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{g['port']}/generate",
        method="POST",
        data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 3}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def status(g, inv: str) -> dict:
    rc, data = k26ops_json("-i", inv, "gateway", "status")
    assert rc == 0, data
    return data["hosts"][g["gw"]]


def test_check_shows_the_plan_and_changes_nothing(gw):
    inv = inventory(gw, "base")
    p = k26ops("-i", inv, "gateway", "deploy", "--check", "--diff")
    assert p.returncode == 0, p.stderr
    for what in (
        "build gateway release sglang-router-0.3.2-",
        f"install /etc/systemd/system/{UNIT}",
        "install /etc/k26ops/gateway.env (mode 0600)",
        f"register worker http://127.0.0.1:{gw['lab'].hosts[0].port + 20000}",
    ):
        assert what in p.stdout, p.stdout
    assert KEY not in p.stdout + p.stderr
    assert (
        remote(gw, f"ls /opt/k26ops/gateway 2>&1; systemctl cat {UNIT} 2>&1 >/dev/null; ls /etc/k26ops")
        .splitlines()[0]
        .startswith("ls: cannot access")
    )
    assert "gateway.env" not in remote(gw, "ls /etc/k26ops")


def test_deploy_runs_the_router_registers_the_engines_and_routes_generate(gw):
    inv = inventory(gw, "base")
    p = k26ops("-i", inv, "gateway", "deploy")
    assert p.returncode == 0, p.stdout + p.stderr
    assert KEY not in p.stdout + p.stderr
    body = generate(gw)  # through the gateway to a lab engine stand-in
    assert body["text"].strip() and body["meta_info"]["completion_tokens"] == 3
    st = status(gw, inv)
    assert (st["state"], st["health"], st["ready"], st["workers"]) == ("active", "healthy", "ready", "2/2 healthy")
    assert st["release"].startswith("sglang-router-0.3.2-") and st["missing"] == []
    # the admin key: in the 0600 env file only; never in the router's argv nor its journal
    pid = remote(gw, f"systemctl show -p MainPID --value {UNIT}")
    assert KEY not in remote(
        gw,
        f"tr '\\0' ' ' < /proc/{pid}/cmdline; systemctl show -p ExecStart {UNIT}; "
        f"journalctl -u {UNIT} --no-pager; cat /etc/systemd/system/{UNIT}",
    )
    assert remote(gw, "stat -c %a /etc/k26ops/gateway.env") == "600"
    assert remote(gw, f"systemd-analyze verify /etc/systemd/system/{UNIT} && echo ok") == "ok"
    # the admin API refuses a caller without the key
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{gw['port']}/workers", timeout=10)
        raise AssertionError("GET /workers without the key was answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
    rc, data = k26ops_json("-i", inv, "gateway", "deploy")  # converged: nothing changes, nothing restarts
    assert rc == 0 and data["hosts"][gw["gw"]]["status"] == "ok", data  # ok, not changed
    assert remote(gw, f"systemctl show -p MainPID --value {UNIT}") == pid


def test_a_restarted_router_is_shown_unregistered_and_registered_again_by_deploy(gw):
    inv = inventory(gw, "base")
    remote(gw, f"systemctl restart {UNIT}")  # the router keeps its workers in memory
    for _ in range(50):
        p = k26ops("--json", "-i", inv, "gateway", "status")
        st = json.loads(p.stdout)["hosts"][gw["gw"]]
        if st["health"] == "healthy":
            break
    assert st["workers"] == "0/0 healthy" and sorted(st["missing"]) == sorted(h.name for h in gw["lab"].hosts)
    rc, data = k26ops_json("-i", inv, "gateway", "deploy")
    assert rc == 0, data
    assert data["hosts"][gw["gw"]]["gateway"]["registered"] == [h.name for h in gw["lab"].hosts]
    assert status(gw, inv)["workers"] == "2/2 healthy"


def test_a_changed_pin_rolls_the_release_and_a_failed_one_rolls_back(gw):
    inv = inventory(gw, "pin031", gateway_lock=str(LOCK_031))
    before = remote(gw, "readlink /opt/k26ops/gateway/current")
    rc, data = k26ops_json("-i", inv, "gateway", "deploy")
    assert rc == 0, data
    now = remote(gw, "readlink /opt/k26ops/gateway/current")
    assert now.startswith("sglang-router-0.3.1-") and now != before
    assert (
        remote(gw, "ls /opt/k26ops/gateway/current/venv/lib/python3.11/site-packages | grep '^sglang_router-'")
        == "sglang_router-0.3.1.dist-info"
    )
    assert status(gw, inv)["workers"] == "2/2 healthy" and generate(gw)["text"].strip()
    # the 0.3.2 pin again, with a flag the router refuses: it never serves; the 0.3.1 release is back
    bad = inventory(gw, "bad", gateway_flags={"--policy": "no-such-policy"})
    p = k26ops("-i", bad, "gateway", "deploy")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "invalid choice: 'no-such-policy'" in p.stdout and f"rolled the gateway back to {now}" in p.stdout
    assert KEY not in p.stdout + p.stderr
    assert remote(gw, "readlink /opt/k26ops/gateway/current") == now
    assert "no-such-policy" not in remote(gw, f"cat /etc/systemd/system/{UNIT}")
    st = status(gw, inv)
    assert (st["health"], st["workers"], st["release"]) == ("healthy", "2/2 healthy", now)
    assert generate(gw)["text"].strip()


def test_rollback_returns_to_the_previous_release(gw):
    inv = inventory(gw, "pin031", gateway_lock=str(LOCK_031))
    cur = remote(gw, "readlink /opt/k26ops/gateway/current")
    p = k26ops("-i", inv, "gateway", "rollback", "--check")
    assert p.returncode == 0 and "(rollback)" in p.stdout, p.stdout + p.stderr
    assert remote(gw, "readlink /opt/k26ops/gateway/current") == cur
    rc, data = k26ops_json("-i", inv, "gateway", "rollback")
    assert rc == 0, data
    back = remote(gw, "readlink /opt/k26ops/gateway/current")
    assert back.startswith("sglang-router-0.3.2-") and back != cur
    st = status(gw, inv)
    assert (st["health"], st["workers"], st["release"]) == ("healthy", "2/2 healthy", back)
    assert generate(gw)["text"].strip()
