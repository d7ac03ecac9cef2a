"""Every interrupt of `rehearse` leaves a serving host (issue 42), on a deployed lab host:

- Ctrl-C (SIGINT) in `rehearse --stop-serving` while the rehearsal engine loads: exit 130,
  the serving engine started again and healthy (the cleanup's restart used to refuse once
  the run was interrupted: an outage from an interrupt);
- `rehearse` holds the host lock: a `deploy` meanwhile is refused, naming the rehearsal;
- SIGKILL of `rehearse`: its engine (a transient unit) and temp dir stay until their deadline;
  the next `status` shows them, the next `rehearse` removes them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from labtools.invoke import k26ops, k26ops_json
from labtools.ports import free_port_block

REPO = Path(__file__).resolve().parent.parents[1]


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    from labtools.labs import private_lab

    d = tmp_path_factory.mktemp("faults-rehearse")
    with private_lab(1, "faults-rehearse", deployed=True) as lab:
        yield {
            "lab": lab,
            "dir": d,
            "name": lab.hosts[0].name,
            "rport": str(free_port_block(1, start=35000, stop=39000)),
        }


def _inv(h, env: dict | None = None) -> str:
    inv = yaml.safe_load(h["lab"].inventory.read_text())
    if env:
        inv["vars"]["engine_env"] = env
    path = h["dir"] / f"inv-{len(list(h['dir'].iterdir()))}.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def _remote(h, cmd: str) -> str:
    return h["lab"].ssh(h["name"], cmd).strip()


def _wait_serving(h) -> None:
    """The serving engine healthy (a booted deployed host starts it, its load takes seconds)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rc, st = k26ops_json("-i", _inv(h), "status")
        if st["hosts"][h["name"]].get("health") == "healthy":
            return
        time.sleep(1)
    pytest.fail(f"the serving engine never got healthy: {st}")


STOPPED = ("inactive", "failed")


def _units(h) -> list[str]:
    return _remote(h, "systemctl list-units --all --plain --no-legend 'k26ops-rehearse-*' | awk '{print $1}'").split()


def _start_slow_rehearsal(h, *extra: str) -> subprocess.Popen:
    """`rehearse` whose engine takes 120 s to load its dummy weights; returns once that engine runs."""
    inv = _inv(h, {"K26OPS_STANDIN_DUMMY_SECONDS": "120"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-i", inv, "rehearse", "--rehearse-port", h["rport"], "--no-bench", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        cwd=REPO,
    )
    deadline = time.monotonic() + 300  # a bound for a hang only: a loaded machine is slow
    while not _units(h) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.3)
    if not _units(h):
        proc.kill()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"the rehearsal engine never started (rc {proc.returncode}):\n{out}\n{err}")
    return proc


def test_ctrl_c_in_rehearse_stop_serving_leaves_the_engine_serving_and_deploy_waits_for_the_lock(h):
    _wait_serving(h)
    proc = _start_slow_rehearsal(h, "--stop-serving")
    try:
        # stopped for it: inactive, or failed (result signal) as the real engine leaves a stop, ending by its
        # own SIGKILL after the drain (tests/data/drain; the stand-in does the same)
        assert _remote(h, "systemctl is-active k26-engine.service || true") in STOPPED
        # the rehearsal holds the host lock: a deploy now would start the serving engine on its GPUs
        p = k26ops("-i", _inv(h), "deploy", timeout=300)
        assert p.returncode == 1 and "rehearse" in p.stdout + p.stderr and "lock" in p.stdout + p.stderr, (
            p.stdout,
            p.stderr,
        )
        assert _remote(h, "systemctl is-active k26-engine.service || true") in STOPPED
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert _remote(h, "systemctl is-active k26-engine.service") == "active", (out, err)
    assert _units(h) == []
    rc, st = k26ops_json("-i", _inv(h), "status")
    assert rc == 0 and st["hosts"][h["name"]]["health"] == "healthy", st


def test_a_killed_rehearsal_is_shown_by_status_and_removed_by_the_next_rehearse(h):
    _wait_serving(h)
    proc = _start_slow_rehearsal(h, "--alongside")
    proc.kill()  # SIGKILL: no cleanup at all
    proc.communicate(timeout=30)
    unit = _units(h)
    assert len(unit) == 1
    tmp = _remote(h, "ls -d /tmp/k26ops-rehearse-*")
    rc, st = k26ops_json("-i", _inv(h), "status")
    left = st["hosts"][h["name"]]["rehearsal_left"]
    assert left == [unit[0], tmp], st
    p = k26ops("-i", _inv(h), "status")
    assert f"a rehearsal's engine or temp dir is there ({unit[0]}, {tmp})" in p.stderr, p.stderr
    rc, data = k26ops_json(
        "-i", _inv(h), "rehearse", "--alongside", "--rehearse-port", h["rport"], "--no-bench", timeout=600
    )
    assert rc == 0, data
    notes = data["hosts"][h["name"]]["rehearsal"]["notes"]
    assert any(n.startswith("removed what a killed rehearsal left: unit " + unit[0]) for n in notes), notes
    assert _units(h) == []
    assert _remote(h, "ls -d /tmp/k26ops-rehearse-* 2>/dev/null | wc -l") == "0"
    rc, st = k26ops_json("-i", _inv(h), "status")
    assert rc == 0 and st["hosts"][h["name"]].get("rehearsal_left") is None, st
