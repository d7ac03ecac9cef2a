"""`status` says what the engine is (serving, starting, stopped, failed, crash-looping)
and exits non-zero when an enabled engine does not serve; `diagnose service` names a
start-limit hit and the `systemctl reset-failed` it needs; a deploy resets it and says so.

The pure part classifies systemd properties as `systemctl show` prints them; the lab
test drives a real unit under real systemd into each state."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops.engine.state import engine_state  # noqa: E402
from labtools.invoke import k26ops, k26ops_json, lab_ssh

UNIT = "k26-engine.service"


def _show(**kw) -> dict:
    base = {
        "ActiveState": "active",
        "SubState": "running",
        "Result": "success",
        "UnitFileState": "enabled",
        "LoadState": "loaded",
        "NRestarts": 0,
        "ExecMainStatus": 0,
    }
    return {**base, **kw}


def test_states_from_systemd_properties():
    assert engine_state(_show(), 200, 30.0, UNIT).state == "serving"
    s = engine_state(_show(), 503, 30.0, UNIT)
    assert (s.state, s.ok) == ("starting", False)
    assert engine_state(_show(), 0, 4000.0, UNIT).state == "unhealthy"
    s = engine_state(_show(ActiveState="inactive", SubState="dead"), None, None, UNIT)
    assert (s.state, s.should_serve, s.ok) == ("stopped", True, False)
    s = engine_state(_show(ActiveState="inactive", SubState="dead", UnitFileState="disabled"), None, None, UNIT)
    assert (s.state, s.ok) == ("stopped", True)  # not enabled: nobody expects it to serve
    s = engine_state(
        _show(ActiveState="failed", SubState="failed", Result="start-limit-hit", NRestarts=3), None, None, UNIT
    )
    assert (s.state, s.ok) == ("failed", False)
    assert "start-limit-hit after 3 restart(s): `systemctl reset-failed k26-engine.service` is needed" in s.label()
    # systemd 252 (Debian 12, as seen on a lab host): the start limit keeps Result=exit-code; the
    # agents read its "Start request repeated too quickly" line into StartLimitHit
    s = engine_state(
        _show(ActiveState="failed", SubState="failed", Result="exit-code", NRestarts=2, StartLimitHit=True),
        None,
        None,
        UNIT,
    )
    assert s.state == "failed" and s.detail.startswith("start-limit-hit after 2 restart(s)")
    s = engine_state(
        _show(
            ActiveState="failed",
            SubState="failed",
            Result="exit-code",
            ExecMainStatus=1,
            NRestarts=1,
            StartLimitHit=False,
        ),
        None,
        None,
        UNIT,
    )
    assert s.label() == ("failed (result exit-code, exit status 1; `k26ops diagnose service` names the crash)")
    # a stop of the real engine: it drains, then SIGKILLs itself (tests/data/drain): a stop, not a crash
    s = engine_state(
        _show(ActiveState="failed", SubState="failed", Result="signal", ExecMainStatus=9), None, None, UNIT
    )
    assert (s.state, s.ok) == ("stopped", False) and "its own SIGKILL after its drain" in s.detail
    s = engine_state(
        _show(ActiveState="failed", SubState="failed", Result="signal", ExecMainStatus=11), None, None, UNIT
    )
    assert s.state == "failed"  # a segfault stays a crash
    s = engine_state(
        _show(ActiveState="activating", SubState="auto-restart", Result="exit-code", NRestarts=2), None, None, UNIT
    )
    assert s.state == "crash-looping" and not s.ok
    s = engine_state(_show(LoadState="not-found", ActiveState="inactive", UnitFileState=""), None, None, UNIT)
    assert (s.state, s.ok) == ("not-installed", True)


def _inv(lab, tmp_path) -> str:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"]["unit_settings"] = {"restart_sec": 1}  # a crash loop reaches the start limit (5) in seconds
    p = tmp_path / "inv.yml"
    p.write_text(yaml.safe_dump(inv))
    return str(p)


@pytest.fixture
def deployed_host():
    """A private 1-host lab booted deployed (the test breaks its engine; it needs no first deploy)."""
    from labtools.labs import private_lab

    with private_lab(1, "enginestate", deployed=True) as running:
        yield running


def test_status_says_stopped_and_start_limit_hit_and_deploy_resets_it(deployed_host, tmp_path):
    lab = deployed_host
    inv = _inv(lab, tmp_path)

    def ssh(cmd: str) -> str:
        p = lab_ssh(lab.dir, lab.hosts[0].port, cmd)
        assert p.returncode == 0, (cmd, p.stderr)
        return p.stdout.strip()

    rc, data = k26ops_json("-i", inv, "deploy", timeout=900)
    assert rc == 0, data
    rc, st = k26ops_json("-i", inv, "status")
    h = st["hosts"]["lab1"]
    assert rc == 0 and (h["engine_state"], h["serving_ok"]) == ("serving", True), h

    # two tags of the same content: status names the newest, until a rollback records its own on the host
    bl = {"K26OPS_BASELINES": str(tmp_path / "baselines")}
    for tag in ("t1", "t2"):
        rc, data = k26ops_json("-i", inv, "snapshot", "--tag", tag, env=bl, timeout=600)
        assert rc == 0, data
    rc, st = k26ops_json("-i", inv, "status", env=bl)
    assert st["hosts"]["lab1"]["baseline"] == "= t2", st
    rc, data = k26ops_json("-i", inv, "rollback", "--tag", "t1", env=bl, timeout=600)
    assert rc == 0, data
    rc, st = k26ops_json("-i", inv, "status", env=bl)
    assert st["hosts"]["lab1"]["baseline"] == "= t1", st

    # an operator's four restarts within a minute are not a crash loop: the unit stays up (issue 45
    # item 2: StartLimitBurst=3 in 7200 s left it failed at the fourth, manual ones counting too)
    t0 = time.monotonic()
    for _ in range(4):
        ssh(f"systemctl restart {UNIT}")
    assert time.monotonic() - t0 < 60
    assert ssh(f"systemctl show -p ActiveState --value {UNIT}") == "active"
    assert "Start request repeated too quickly" not in ssh(f"journalctl -u {UNIT} -n 20 -o cat --no-pager")

    ssh(f"systemctl stop {UNIT}")
    proc = k26ops("-i", inv, "status")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"k26ops: lab1: {UNIT} should serve but is stopped (unit inactive)", proc.stderr
    # the table's status column and the summary say it too (issue 45 item 3: they said `ok`, `1 ok`)
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("lab1 "))
    assert row[1:3] == ["stopped", "stopped"] and proc.stdout.splitlines()[-1] == "1 stopped", proc.stdout
    rc, st = k26ops_json("-i", inv, "status")
    h = st["hosts"]["lab1"]
    assert rc == 1 and not st["ok"] and h["engine_state"] == "stopped" and h["started"] is None, h
    assert h["status"] == "stopped", h

    # a crash at every start: systemd restarts it until its start limit, then gives up
    ssh(f"echo 'K26OPS_STANDIN_CRASH=\"load\"' >> /etc/k26ops/sglang.env && systemctl start {UNIT}; true")
    deadline = time.monotonic() + 90
    while "Start request repeated too quickly" not in ssh(f"journalctl -u {UNIT} -n 5 -o cat --no-pager"):
        assert time.monotonic() < deadline, ssh(f"systemctl show {UNIT} -p ActiveState,SubState,Result,NRestarts")
        time.sleep(1)
    assert ssh(f"systemctl is-failed {UNIT}; true") == "failed"
    rc, st = k26ops_json("-i", inv, "status")
    h = st["hosts"]["lab1"]
    assert rc == 1 and h["engine_state"] == "failed" and h["engine_detail"].startswith("start-limit-hit"), h
    proc = k26ops("-i", inv, "diagnose", "service")
    assert f"lab1: {UNIT} hit systemd's start limit (" in proc.stdout, proc.stdout
    assert f"`systemctl reset-failed {UNIT}` is needed" in " ".join(proc.stdout.split()), proc.stdout
    rc, dg = k26ops_json("-i", inv, "diagnose", "service")
    assert dg["hosts"]["lab1"]["start_limit_hit"] is True, dg

    proc = k26ops("-i", inv, "rollback", "--tag", "t1", "-C", "-D", env=bl, timeout=600)  # a diff, no change
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '-K26OPS_STANDIN_CRASH="load"' in proc.stdout.splitlines(), proc.stdout
    assert ssh(f"systemctl show -p ActiveState --value {UNIT}") == "failed"

    proc = k26ops("-i", inv, "deploy", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"start {UNIT} (was failed: it hit systemd's start limit; systemctl reset-failed first)" in " ".join(
        proc.stdout.split()
    ), proc.stdout
    rc, st = k26ops_json("-i", inv, "status")
    assert rc == 0 and st["hosts"]["lab1"]["engine_state"] == "serving", st
