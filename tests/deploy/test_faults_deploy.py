"""Faults during a deploy, against real lab hosts (nspawn, systemd, sshd):
a host killed mid-build, a full disk under the releases root, two runs at
once and a run killed with SIGKILL, Ctrl-C (SIGINT) mid-build, a full disk
under the host lock's state directory.

The invariant checked on every host after every fault: `current` is absent
or points at a release whose manifest.json exists (complete), and no
`.current.tmp` is left behind.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from labtools import REPO
from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.labs import private_lab
from labtools.ports import free_port_block
from labtools.recipes import harmless_patch, lab_recipe_copy, write_series

RELEASES = "/opt/k26ops/releases"
UNIT = "k26-engine.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
TOKEN = "hf_FAULTSECRET_5a4b3c2d1e0f"
RELEASE_ONLY = "name: release-only\nsteps:\n  - release: {keep: 3}\n"
FULL = "name: full\nsteps:\n  - release: {keep: 3}\n  - service: {}\n  - health: {}\n  - smoke: {}\n"
# Takes the host lock and changes nothing: on node rank 1 health is rank 0's to check.
LOCK_ONLY = "name: lock-only\nsteps:\n  - health: {}\n"
STATE = "/opt/k26ops/state"


# ------------------------------------------------------------------ helpers


def release_state(lab, host: str) -> dict:
    """current's target, every release dir and whether it is complete, leftovers."""
    out = lab.ssh(
        host,
        f'mkdir -p {RELEASES}; cd {RELEASES}; echo "CURRENT $(readlink current)"; '
        'for d in */; do d=${d%/}; [ "$d" = current ] && continue; '
        '[ -d "$d" ] || continue; '
        'if [ -f "$d/manifest.json" ]; then echo "DIR $d complete"; '
        'else echo "DIR $d partial"; fi; done; '
        "ls -a | grep -c '^.current.tmp$' | sed 's/^/TMP /'; true",
    )
    state = {"current": None, "dirs": {}, "tmp": 0}
    for line in out.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "CURRENT":
            state["current"] = rest.strip() or None
        elif kind == "DIR":
            name, _, what = rest.rpartition(" ")
            state["dirs"][name] = what == "complete"
        elif kind == "TMP":
            state["tmp"] = int(rest)
    return state


def assert_consistent(lab, host: str) -> dict:
    s = release_state(lab, host)
    assert s["tmp"] == 0, f"{host}: .current.tmp left behind: {s}"
    if s["current"] is not None:
        assert s["dirs"].get(s["current"]) is True, f"{host}: current points at an incomplete release: {s}"
    return s


def extra_patch_text(marker: str) -> str:
    return harmless_patch(f"fault test {marker}")


def recipe_with_patch(tmp_path: Path, marker: str) -> Path:
    """The lab recipe plus one harmless patch: a different release id per marker."""
    d = tmp_path / f"recipe-{marker}"
    (d / "patches").mkdir(parents=True)
    (d / "patches" / f"{marker}.patch").write_text(extra_patch_text(marker))
    write_series(d / "patches" / "series", [f"{marker}.patch"])
    return lab_recipe_copy(d / "recipe.yml", d / "patches" / "series")


def inventory(lab, path: Path, engine_ports: dict, **all_vars) -> Path:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(all_vars)
    for name, port in engine_ports.items():
        inv["hosts"][name]["vars"]["engine_port"] = port
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def playbook(tmp_path: Path, text: str, name: str) -> Path:
    p = tmp_path / f"{name}.yml"
    p.write_text(text)
    return p


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "k26ops", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def wait_for_build(lab, host: str, proc: subprocess.Popen, timeout: float = 240) -> str:
    """Wait until `host` is building a release (its venv exists, no manifest yet); its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, ("k26ops ended before the build started", proc.communicate())
        res = lab_ssh(
            lab.dir,
            lab.port(host),
            f"cd {RELEASES} 2>/dev/null && for d in */; do d=${{d%/}}; "
            '[ -x "$d/venv/bin/python" ] && [ ! -f "$d/manifest.json" ] && echo "$d"; done; true',
        )
        building = [x for x in res.stdout.split() if x and x != "current"]
        if building:
            return building[0]
        time.sleep(0.3)
    raise AssertionError(f"{host}: no build started within {timeout}s")


def build_processes(lab, host: str) -> str:
    """Build processes (venv creation, pip, patchset) still running on the host."""
    res = lab_ssh(lab.dir, lab.port(host), "pgrep -af 'pip install|patchset.py|-m venv' | grep -v pgrep; true")
    return res.stdout.strip()


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def pair_lab():
    """A private 2-host lab (one of its hosts gets killed)."""
    with private_lab(2, "faults2") as running:
        yield running


@pytest.fixture(scope="module")
def solo():
    """A private 1-host lab shared by this module's single-host fault tests; each
    test starts by making sure the base release is current."""
    with private_lab(1, "faults1", deployed=True) as running:
        yield running


@pytest.fixture
def solo_inv(solo, tmp_path):
    port = free_port_block(1, start=36000, stop=40000)
    return inventory(solo, tmp_path / "inventory.yml", {"lab1": port}, hf_token=TOKEN)


# ------------------------------------------------------------------ 1: host killed mid-deploy


def test_host_killed_mid_build_others_finish_rerun_converges(pair_lab, tmp_path):
    lab = pair_lab
    ports = free_port_block(2, start=36000, stop=40000)
    inv = inventory(lab, tmp_path / "inv.yml", {"lab1": ports, "lab2": ports + 1})
    pb = playbook(tmp_path, RELEASE_ONLY, "release-only")
    proc = start("-i", str(inv), "deploy", "--playbook", str(pb), env={"COLUMNS": "200"})
    try:
        rid = wait_for_build(lab, "lab2", proc)
        # lab2 is mid-build: current (if any) must still be complete, right up to the kill
        assert_consistent(lab, "lab2")
        lab.lab.stop_host("lab2")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out + err
    assert proc.returncode == 1, text
    assert "Traceback" not in text
    # the summary names the failed host, the other host finished
    lines = [line for line in text.splitlines() if "lab2" in line and ("failed" in line or "unreachable" in line)]
    assert lines, text
    lab1_line = [line for line in text.splitlines() if "│ lab1" in line or line.startswith("lab1")]
    assert any("changed" in line for line in lab1_line), text
    s1 = assert_consistent(lab, "lab1")
    assert s1["current"] == rid

    # the killed host comes back (as a crashed machine would, here with a fresh
    # disk and a new host key, recorded as an operator would); a re-run converges
    from k26ops.lab import rootfs

    old = next(h for h in lab.lab.hosts() if h.name == "lab2")
    host, key_line = lab.lab._boot("lab2", old.port, old.engine_port, rootfs.ensure(log=lambda m: None))
    lab.lab._save([h for h in lab.lab.hosts() if h.name != "lab2"] + [host], rootfs.ensure(log=lambda m: None))
    kh = lab.dir / "known_hosts"
    kh.write_text(
        "".join(line + "\n" for line in kh.read_text().splitlines() if not line.startswith(f"[127.0.0.1]:{old.port} "))
        + key_line
    )
    lab.lab._wait_ssh([host])
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    assert data["hosts"]["lab1"]["status"] == "ok"  # nothing to redo on the survivor
    assert data["hosts"]["lab2"]["status"] == "changed"
    for h in ("lab1", "lab2"):
        s = assert_consistent(lab, h)
        assert s["current"] == rid and all(s["dirs"].values()), s
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb))
    assert rc == 0 and {r["status"] for r in data["hosts"].values()} == {"ok"}, data


# ------------------------------------------------------------------ 6: two runs; a killed run's lock


def test_second_run_refused_with_owner_and_killed_run_leaves_no_blocking_lock(solo, solo_inv, tmp_path):
    pb = playbook(tmp_path, RELEASE_ONLY, "release-only")
    inv = inventory(solo, tmp_path / "lock.yml", {}, recipe=str(recipe_with_patch(tmp_path, "lock")))
    first = start("-i", str(inv), "deploy", "--playbook", str(pb))
    try:
        wait_for_build(solo, "lab1", first)
        owner = json.loads(solo.ssh("lab1", "cat /opt/k26ops/state/lock.owner"))
        assert owner["pid"] == first.pid
        second = k26ops("-i", str(inv), "--json", "deploy", "--playbook", str(pb))
        assert second.returncode == 1, second.stdout + second.stderr
        err = json.loads(second.stdout)["hosts"]["lab1"]["error"]
        assert "locked by another k26ops run" in err
        assert f"pid {first.pid}" in err and owner["since"] in err
        assert f"{owner['user']}@{owner['control_node']}" in err
        # the refused run changed nothing and did not take over the owner record
        assert json.loads(solo.ssh("lab1", "cat /opt/k26ops/state/lock.owner"))["pid"] == first.pid
        os.killpg(first.pid, signal.SIGKILL)  # a run that dies without any cleanup
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert_consistent(solo, "lab1")
    # the next run is not blocked, builds the release and notes the dead run's lock
    third = k26ops("-i", str(inv), "deploy", "--playbook", str(pb), env={"COLUMNS": "200"})
    text = third.stdout + third.stderr
    assert third.returncode == 0, text
    assert "a run that died held this host" in text and f"pid {first.pid}" in text
    s = assert_consistent(solo, "lab1")
    assert all(s["dirs"].values()), s
    # nothing of the killed run's build is still running on the host
    assert build_processes(solo, "lab1") == ""


# ------------------------------------------------------------------ 7: SIGINT mid-build


def test_sigint_mid_build_leaves_previous_release_current(solo, solo_inv, tmp_path):
    pb = playbook(tmp_path, RELEASE_ONLY, "release-only")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    base = data["hosts"]["lab1"]["release"]
    inv = inventory(solo, tmp_path / "sigint.yml", {}, recipe=str(recipe_with_patch(tmp_path, "sigint")))
    proc = start("-i", str(inv), "deploy", "--playbook", str(pb))
    try:
        new = wait_for_build(solo, "lab1", proc)
        assert new != base
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C (to k26ops only, as a terminal would to its group)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "interrupted" in err and "Traceback" not in out + err
    time.sleep(1)
    s = assert_consistent(solo, "lab1")
    assert s["current"] == base
    # a re-run of the interrupted deploy converges on the new release
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    s = assert_consistent(solo, "lab1")
    assert s["current"] == new and all(s["dirs"].values()), s
    assert build_processes(solo, "lab1") == ""


# ------------------------------------------------------------------ 3: disk full during the build


def test_disk_full_during_build_keeps_previous_release_serving(solo, solo_inv, tmp_path):
    pb = playbook(tmp_path, FULL, "full")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    r = data["hosts"]["lab1"]
    assert r["health"]["state"] == "healthy"
    base = r["release"]
    port = yaml.safe_load(solo_inv.read_text())["hosts"]["lab1"]["vars"]["engine_port"]
    pid = solo.ssh("lab1", "systemctl show -p MainPID --value k26-engine.service").strip()
    # the releases root becomes a small filesystem holding the current release
    # and 40 MB more: a new build runs out of space
    solo.ssh(
        "lab1",
        f"set -e; cd {RELEASES}; cur=$(readlink current); for d in */; do d=${{d%/}}; "
        '[ "$d" = current ] || [ "$d" = "$cur" ] || rm -rf -- "$d"; done; '
        f"used=$(du -sm . | cut -f1); cd /; rm -rf /var/tmp/k26copy; cp -a {RELEASES} /var/tmp/k26copy; "
        f"mount -t tmpfs -o size=$((used + 40))m tmpfs {RELEASES}; cp -a /var/tmp/k26copy/. {RELEASES}/; "
        f"rm -rf /var/tmp/k26copy; findmnt -n {RELEASES}",
    )
    assert_consistent(solo, "lab1")
    try:
        recipe = str(recipe_with_patch(tmp_path, "diskfull"))
        # the deploy's preflight sees 40 MB free where a release needs release_size_gb (1 GB in the lab)
        inv = inventory(solo, tmp_path / "diskfull-inv.yml", {}, recipe=recipe)
        rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb), timeout=900)
        assert rc == 1 and data["hosts"]["lab1"]["error"].startswith(
            f"preflight: disk_releases: {RELEASES}: 0 GB free, needs 1 GB"
        ), data
        # told a release needs no room, the build starts and runs out of space
        inv = inventory(solo, tmp_path / "diskfull-inv.yml", {}, recipe=recipe, release_size_gb=0)
        rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb), timeout=900)
        r = data["hosts"]["lab1"]
        assert rc == 1 and r["status"] == "failed", data
        assert r["error"] and "\n" not in r["error"]
        # named as such: the room check before the build, or (issue 42) the build's own failure
        # (venv's ensurepip said only `exit status 1`)
        assert "not enough disk space" in r["error"] or f"MiB free on {RELEASES}" in r["error"], r["error"]
        assert TOKEN not in json.dumps(data)
        s = assert_consistent(solo, "lab1")
        assert s["current"] == base
        assert set(s["dirs"]) == {base}, f"the failed build was not removed: {s}"
        # the engine still serves, never restarted
        assert solo.ssh("lab1", "systemctl is-active k26-engine.service").strip() == "active"
        assert solo.ssh("lab1", "systemctl show -p MainPID --value k26-engine.service").strip() == pid
        code = solo.ssh(
            "lab1",
            f'python3 -c "import urllib.request as u; '
            f"print(u.urlopen('http://127.0.0.1:{port}/health', timeout=5).status)\"",
        )
        assert code.strip() == "200"
        assert build_processes(solo, "lab1") == ""
    finally:
        lab_ssh(solo.dir, solo.port("lab1"), f"systemctl stop k26-engine.service; umount -l {RELEASES}; true")


def test_full_etc_after_the_switch_puts_release_unit_and_env_back(solo, solo_inv, tmp_path):
    """A full /etc/k26ops when the service step writes the new env file, after
    `current` moved to the new release: the host must end on the old release,
    unit and env file together (before: current stayed on the new release while
    the old engine, unit and env file ran; the table said `release -`)."""
    pb = playbook(tmp_path, FULL, "full")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    before = {
        "env": solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env"),
        "unit": solo.ssh("lab1", f"sha256sum {UNIT_PATH}"),
        "current": solo.ssh("lab1", f"readlink {RELEASES}/current"),
    }
    # /etc/k26ops becomes a full 16k filesystem holding the current env file
    solo.ssh(
        "lab1",
        "set -e; cp -a /etc/k26ops /var/tmp/k26etc; mount -t tmpfs -o size=16k tmpfs /etc/k26ops; "
        "cp -a /var/tmp/k26etc/. /etc/k26ops/; rm -rf /var/tmp/k26etc; "
        "dd if=/dev/zero of=/etc/k26ops/fill bs=1k 2>/dev/null || true",
    )
    try:
        doc = yaml.safe_load(solo_inv.read_text())
        doc["vars"]["recipe"] = str(recipe_with_patch(tmp_path, "fulletc"))
        doc["vars"]["engine_env"] = {"K26OPS_FULL_ETC_TEST": "x" * 4000}
        inv = tmp_path / "fulletc.yml"
        inv.write_text(yaml.safe_dump(doc))
        rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(pb), timeout=900)
        r = data["hosts"]["lab1"]
        assert rc == 1 and r["status"] == "failed", data
        assert "\n" not in r["error"] and "rolled back" in r["error"], r["error"]
        assert solo.ssh("lab1", f"readlink {RELEASES}/current") == before["current"]
        assert solo.ssh("lab1", f"sha256sum {UNIT_PATH}") == before["unit"]
        assert solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env") == before["env"]
        assert solo.ssh("lab1", f"systemctl is-active {UNIT}").strip() == "active"
        assert_consistent(solo, "lab1")
    finally:
        lab_ssh(
            solo.dir,
            solo.port("lab1"),
            "cp -a /etc/k26ops/sglang.env /var/tmp/k26env; umount -l /etc/k26ops; "
            "cp -a /var/tmp/k26env /etc/k26ops/sglang.env; true",
        )


# ------------------------------------------------------------------ 8: disk full under the lock's state dir


def test_full_state_dir_refuses_the_lock_in_one_line_and_the_next_run_works(scratch_lab, tmp_path):
    lab = scratch_lab
    pb = playbook(tmp_path, LOCK_ONLY, "lock-only")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["hosts"]["lab1"]["vars"]["node_rank"] = 1
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))
    run = ("-i", str(tmp_path / "inv.yml"), "deploy", "--playbook", str(pb))
    where = f"cannot write the host lock's owner file in {STATE}: disk full"
    # the state dir becomes a small filesystem with no room left
    lab.ssh(
        "lab1",
        f"set -e; mkdir -p {STATE}; mount -t tmpfs -o size=64k tmpfs {STATE}; "
        f"dd if=/dev/zero of={STATE}/fill bs=4k 2>/dev/null || true; "
        f"[ \"$(df -Pk {STATE} | awk 'NR==2 {{print $4}}')\" = 0 ]",
    )
    try:
        rc, data = k26ops_json(*run)
        r = data["hosts"]["lab1"]
        assert rc == 1 and r["status"] == "failed", data
        assert re.fullmatch(rf"{where} \(needs \d+ bytes, 0 bytes free\)", r["error"]), r["error"]
        assert lab.ssh("lab1", f"ls -A {STATE}").split() == ["fill", "lock"]  # no lock.owner(.tmp)
        lab.ssh("lab1", f"flock -n {STATE}/lock true")  # not held: nothing blocks the next run
        # df saw room but the write fails (the disk filled in between): the same
        # line, and the 0-byte temp file the failed write made is removed
        lab.ssh(
            "lab1",
            "printf '#!/bin/sh\\necho Filesystem 1024-blocks Used Available Capacity Mounted on\\n"
            f"echo tmpfs 64 0 64 0%% {STATE}\\n' > /usr/local/bin/df; chmod 755 /usr/local/bin/df",
        )
        rc, data = k26ops_json(*run)
        r = data["hosts"]["lab1"]
        assert rc == 1 and re.fullmatch(rf"{where} \(needs \d+ bytes\)", r["error"]), data
        assert lab.ssh("lab1", f"ls -A {STATE}").split() == ["fill", "lock"]
        lab.ssh("lab1", f"rm /usr/local/bin/df {STATE}/fill")
        # room again: the next run takes the lock, runs, and releases it
        rc, data = k26ops_json(*run)
        assert rc == 0 and data["hosts"]["lab1"]["status"] in ("ok", "changed"), data
        assert "stale_lock" not in data["hosts"]["lab1"]
        assert lab.ssh("lab1", f"ls -A {STATE}").split() == ["lock"]
    finally:
        lab_ssh(lab.dir, lab.port("lab1"), f"rm -f /usr/local/bin/df; umount -l {STATE}; true")


def _wait_for_env(solo, proc, marker: str) -> float:
    """Wait (at most 180 s, while `proc` runs) until lab1's engine env file holds `marker`: the
    deploy's new env is on the host. Returns the deadline, for the caller's next wait."""
    deadline = time.monotonic() + 180
    while marker not in solo.ssh("lab1", "cat /etc/k26ops/sglang.env"):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    return deadline


def _deploy_stuck_in_the_health_wait(solo, solo_inv, tmp_path, pb):
    """`deploy --json` of an env whose new engine never gets ready, returned (still running) once the
    health step has begun: its new env file is on the host, the restart is done, and the progress
    line of the health step is out (stderr). Waiting a fixed time after the env file instead once
    found the restart's agent still running on a loaded machine (a full run: `host agent (apply)`)."""
    doc = yaml.safe_load(solo_inv.read_text())
    doc["vars"]["engine_env"] = {"K26OPS_STANDIN_LOAD_SECONDS": "600"}  # the new engine never gets ready
    slow = tmp_path / "slow.yml"
    slow.write_text(yaml.safe_dump(doc))
    proc = start("-i", str(slow), "--json", "deploy", "--playbook", str(pb))
    try:
        deadline = _wait_for_env(solo, proc, "K26OPS_STANDIN_LOAD_SECONDS")
        said = b""  # read raw from the pipe (no text buffer that select cannot see), until the health step
        while not re.search(rb"lab1: \d+/\d+ health\b", said):
            assert time.monotonic() < deadline and proc.poll() is None, (said, proc.communicate())
            if select.select([proc.stderr], [], [], 0.5)[0]:
                said += os.read(proc.stderr.fileno(), 65536)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc


# ------------------------------------------------------------------ 4: interrupted during the health wait


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_health_wait_restores_previous_unit_env_and_release(solo, solo_inv, tmp_path, sig):
    """Before: the new env file stayed and the unit kept restarting, and the next
    run said `nothing to roll back`. Now the interrupted step is handled like its
    failure: the previous unit, env file and release are back, the old engine healthy."""
    pb = playbook(tmp_path, FULL, "full")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    before = {
        "env": solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env"),
        "unit": solo.ssh("lab1", f"sha256sum {UNIT_PATH}"),
        "current": solo.ssh("lab1", f"readlink {RELEASES}/current"),
    }
    proc = _deploy_stuck_in_the_health_wait(solo, solo_inv, tmp_path, pb)
    try:
        time.sleep(3)  # well inside the health wait now
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in out + err
    host = json.loads(out)["hosts"]["lab1"]
    assert "interrupted" in host["error"] and "rolled back the unit, env file" in host["error"], host
    assert "healthy again" in host["error"]
    assert solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env") == before["env"]
    assert solo.ssh("lab1", f"sha256sum {UNIT_PATH}") == before["unit"]
    assert solo.ssh("lab1", f"readlink {RELEASES}/current") == before["current"]
    assert solo.ssh("lab1", f"systemctl is-active {UNIT}").strip() == "active"


# ------------------------------------------------------------------ 4b: the host agents killed in the health wait


def test_host_agents_killed_in_the_health_wait_restore_the_previous_env(solo, solo_inv, tmp_path):
    """Before: `host agent (poll) exited -1: no output` and the new env file stayed, the engine
    crash-looping on it (the health wait runs in the step's plan, outside the restore). Now a
    plan's failure after the host changed gets the same restore as a failed apply."""
    pb = playbook(tmp_path, FULL, "full")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    before = {
        "env": solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env"),
        "unit": solo.ssh("lab1", f"sha256sum {UNIT_PATH}"),
    }
    proc = _deploy_stuck_in_the_health_wait(solo, solo_inv, tmp_path, pb)
    try:
        time.sleep(3)  # inside the health wait: its poll agent runs (a long-poll window)
        for _ in range(50):  # SIGKILL the host agents (python3 -S -c ...) once one runs; then leave it
            if solo.ssh("lab1", "pkill -KILL -f '^python3 -S -c' && echo killed || true").strip() == "killed":
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "Traceback" not in out + err
    host = json.loads(out)["hosts"]["lab1"]
    assert "host agent (poll)" in host["error"] and "rolled back the unit, env file" in host["error"], host
    assert solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env") == before["env"]
    assert solo.ssh("lab1", f"sha256sum {UNIT_PATH}") == before["unit"]
    assert solo.ssh("lab1", f"systemctl is-active {UNIT}").strip() == "active"


# ------------------------------------------------------------------ 5: a truncated manifest of the current release


def test_a_truncated_manifest_of_current_is_rebuilt_not_ok_nothing(solo, solo_inv, tmp_path):
    """Before: a manifest.json cut short read as "differs from probed" in status and the deploy
    said `ok nothing`. Now it is not a complete release: the deploy builds it again."""
    pb = playbook(tmp_path, FULL, "full")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    man = f"{RELEASES}/current/manifest.json"
    whole = solo.ssh("lab1", f"cat {man}")
    solo.ssh("lab1", f"truncate -s 100 $(readlink -f {man})")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0 and data["hosts"]["lab1"]["status"] == "changed", data
    assert any("build release" in c for s in data["hosts"]["lab1"]["steps"] for c in s["changes"]), data
    again = json.loads(solo.ssh("lab1", f"cat {man}"))  # whole again (engine_argv: this inventory's)
    assert again["release_id"] == json.loads(whole)["release_id"] and again["site_packages"]
    assert_consistent(solo, "lab1")
    assert solo.ssh("lab1", f"systemctl is-active {UNIT}").strip() == "active"


# ------------------------------------------------------------------ 4g: a deploy killed after its install


def test_a_deploy_killed_after_its_install_is_rolled_back_by_the_rerun(solo, solo_inv, tmp_path):
    """SIGKILL of a deploy whose new config crashes, once it installed the new env file: the
    re-run used to say `nothing to roll back` (it changed nothing itself) although prev/ held
    the good files. The install stays unsettled until its engine answers healthy, so the
    re-run's failure restores what ran before it."""
    pb = playbook(tmp_path, FULL, "full")
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    good = solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env")
    doc = yaml.safe_load(solo_inv.read_text())
    doc["vars"]["engine_env"] = {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_LOAD_SECONDS": "5"}
    bad = tmp_path / "crash.yml"
    bad.write_text(yaml.safe_dump(doc))
    proc = start("-i", str(bad), "--json", "deploy", "--playbook", str(pb))
    try:
        _wait_for_env(solo, proc, "K26OPS_STANDIN_CRASH")
        os.killpg(proc.pid, signal.SIGKILL)  # no restore at all
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env") != good
    rc, data = k26ops_json("-i", str(bad), "deploy", "--playbook", str(pb), timeout=600)
    host = data["hosts"]["lab1"]
    assert rc == 1 and "rolled back the unit, env file" in host["error"], host
    assert "nothing to roll back" not in host["error"]
    assert solo.ssh("lab1", "sha256sum /etc/k26ops/sglang.env") == good
    assert solo.ssh("lab1", f"systemctl is-active {UNIT}").strip() == "active"
    # back to good and healthy: a later failure that changed nothing has nothing of a killed run to undo
    rc, data = k26ops_json("-i", str(solo_inv), "deploy", "--playbook", str(pb))
    assert rc == 0, data
    assert json.loads(solo.ssh("lab1", f"cat {STATE}/service/prev/manifest.json"))["settled"] is True
