"""A closed output pipe during a deploy (issue 35.4 / 34.7), against a real lab host.

`k26ops deploy 2>&1 | head -1`, done with a real pipe: k26ops' stdout and
stderr go to one pipe whose reader closes it after a chosen line. Before the
fix the progress callback's BrokenPipeError (rich: SystemExit) ended the host's
worker thread in the middle of its step: `current` stayed on the new release
while the old engine ran, and the run hung until --deadline. Now the run ends
within seconds with exit 141 and the host runs its old or its new engine,
`current` naming the release that engine was started from.
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

from labtools import REPO
from labtools.invoke import k26ops_json
from labtools.labs import private_lab
from labtools.ports import free_port_block
from labtools.recipes import harmless_patch, lab_recipe_copy, write_series

RELEASES = "/opt/k26ops/releases"
UNIT = "k26-engine.service"
FULL = "name: full\nsteps:\n  - release: {keep: 3}\n  - service: {}\n  - health: {}\n  - smoke: {}\n"


def engine_state(lab) -> dict:
    """current's target, the engine's state and main PID, and the release its
    process was started from (its executable's venv, as /proc resolves it)."""
    cur = lab.ssh("lab1", f"readlink {RELEASES}/current").strip()
    active = lab.ssh("lab1", f"systemctl is-active {UNIT}; true").strip()
    pid = lab.ssh("lab1", f"systemctl show -p MainPID --value {UNIT}").strip()
    return {"current": cur, "active": active, "pid": pid}


def recipe_with_patch(tmp_path: Path, marker: str) -> Path:
    d = tmp_path / f"recipe-{marker}"
    (d / "patches").mkdir(parents=True)
    (d / "patches" / f"{marker}.patch").write_text(harmless_patch(f"closed pipe {marker}"))
    write_series(d / "patches" / "series", [f"{marker}.patch"])
    return lab_recipe_copy(d / "recipe.yml", d / "patches" / "series")


@pytest.fixture(scope="module")
def solo():
    with private_lab(1, "pipe1", deployed=True) as running:
        yield running


@pytest.fixture
def inv(solo, tmp_path):
    doc = yaml.safe_load(solo.inventory.read_text())
    doc["hosts"]["lab1"]["vars"]["engine_port"] = free_port_block(1, start=36000, stop=40000)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def deploy_into_closed_pipe(inv: Path, pb: Path, close_after: str) -> tuple[subprocess.Popen, float, list[str]]:
    """`k26ops deploy 2>&1 | reader`: the reader closes the pipe after the first line
    containing `close_after`; (process, seconds from the close to its exit, lines read)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-i", str(inv), "--deadline", "150", "deploy", "--playbook", str(pb)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines = []
    try:
        while True:
            line = proc.stdout.readline().decode(errors="replace")
            assert line, ("k26ops ended before the line to close after", lines, proc.wait(5))
            lines.append(line)
            if close_after in line:
                break
        proc.stdout.close()  # the reader is gone: every later write is EPIPE
        t0 = time.monotonic()
        try:
            proc.wait(timeout=200)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the old code: SIGTERM took minutes too
            proc.wait(timeout=300)
        return proc, time.monotonic() - t0, lines
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("close_after", ["lab1: start", "service"], ids=["first-line", "at-the-restart"])
def test_a_closed_pipe_ends_the_deploy_fast_with_the_host_on_one_engine(solo, inv, tmp_path, close_after):
    pb = tmp_path / "full.yml"
    pb.write_text(FULL)
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    before = engine_state(solo)
    assert before["active"] == "active", before

    doc = yaml.safe_load(inv.read_text())
    doc["vars"]["recipe"] = str(recipe_with_patch(tmp_path, "pipe-" + close_after.split()[-1]))
    new_inv = tmp_path / "new.yml"
    new_inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc, took, lines = deploy_into_closed_pipe(new_inv, pb, close_after)

    assert took <= 10, f"k26ops took {took:.1f}s after its output closed (rc {proc.returncode})"
    assert proc.returncode == 141, (proc.returncode, lines)
    time.sleep(1)
    after = engine_state(solo)
    print(
        f"closed after {close_after!r}: exit {proc.returncode} {took:.1f}s after the close; "
        f"current {'old' if after['current'] == before['current'] else 'new'}, engine pid "
        f"{'same' if after['pid'] == before['pid'] else 'new'}"
    )
    assert after["active"] == "active", after
    assert not solo.ssh("lab1", f"ls -a {RELEASES} | grep -c '^.current.tmp$'; true").strip().strip("0\n"), (
        "left .current.tmp"
    )
    if after["current"] == before["current"]:  # the old engine: untouched, or restored and restarted
        pass
    else:  # the new release is current: then the engine runs it (restarted after the switch)
        assert after["pid"] != before["pid"], (before, after)
    # the host is not half-changed: status sees the engine running from `current`
    rc, st = k26ops_json("-i", str(new_inv), "status")
    host = st["hosts"]["lab1"]
    assert host["state"] == "active" and host["health"] == "healthy", host
    assert host["release"] == after["current"], host
    assert host["drift"]["engine_release"] == after["current"] and not host["drift"].get("engine_not_current"), host
    # and a re-run converges on the new release
    rc, data = k26ops_json("-i", str(new_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    assert engine_state(solo)["current"] != before["current"]


def test_status_does_not_call_an_engine_canonical_that_current_no_longer_names(solo, inv, tmp_path):
    """The half-changed host of issue 35.4 made by hand: `current` switched to
    another complete release while the engine started from the first one runs."""
    pb = tmp_path / "full.yml"
    pb.write_text(FULL)
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    first = engine_state(solo)["current"]
    doc = yaml.safe_load(inv.read_text())
    doc["vars"]["recipe"] = str(recipe_with_patch(tmp_path, "status"))
    new_inv = tmp_path / "new.yml"
    new_inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    rc, data = k26ops_json("-i", str(new_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    second = engine_state(solo)["current"]
    assert second != first
    rc, st = k26ops_json("-i", str(new_inv), "status")
    assert st["hosts"]["lab1"]["drift"]["engine_release"] == second, st
    assert st["hosts"]["lab1"]["drift"]["canonical"] is True, st
    solo.ssh("lab1", f"cd {RELEASES} && ln -sfn {first} .current.tmp && mv -T .current.tmp current").strip()
    try:
        rc, st = k26ops_json("-i", str(new_inv), "status")
        host = st["hosts"]["lab1"]
        assert host["release"] == first and host["drift"]["engine_release"] == second, host
        assert host["drift"]["canonical"] is False and host["drift"]["engine_not_current"], host
        assert host["baseline"].startswith(f"ENGINE NOT FROM current: it runs {second}"), host
    finally:
        solo.ssh("lab1", f"cd {RELEASES} && ln -sfn {second} .current.tmp && mv -T .current.tmp current").strip()
