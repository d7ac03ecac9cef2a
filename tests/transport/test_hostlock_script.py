"""The host lock's script (k26ops.host.lock.lock_script) run by this machine's
/bin/sh, as a host runs it under sudo: it takes the lock, refuses a second
run, tells a stale owner, frees the lock at EOF, and starts few processes
(issue 31: it runs at every deploy's start). Every command it starts is
counted through logging wrappers first on PATH. The lab tests
(test_faults_deploy, test_become) check it over SSH too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from k26ops.host.lock import LOCK_BUSY, RELEASED, lock_script

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("flock"), reason="needs root and flock(1), as on a host"
)

TOOLS = ("id", "mkdir", "flock", "sh", "cat", "df", "awk", "mv", "rm", "tail", "printf", "tr")


@pytest.fixture
def host(tmp_path):
    """(run(stdin) -> (rc, first line), the started commands' log, the state dir)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "started.log"
    bin_dir.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        if real:
            (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} >> {log}\nexec {real} "$@"\n')
            (bin_dir / tool).chmod(0o755)
    state = tmp_path / "state"  # there since the host's first run: no mkdir
    state.mkdir()
    owner = {"user": "alice", "pid": 1, "purpose": "deploy it's $HOME `x`"}
    script = lock_script(str(state), f"{state}/lock", f"{state}/lock.owner", json.dumps(owner), 100)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def start():
        return subprocess.Popen(
            ["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )

    return start, log, state, owner


def test_lock_script_holds_refuses_frees_and_starts_few_processes(host):
    start, log, state, owner = host
    first = start()
    assert first.stdout.readline() == "LOCKED \n"  # no previous owner
    assert json.loads((state / "lock.owner").read_text()) == owner
    started = log.read_text().split()
    # the old pipeline had started 9 by then (id mkdir flock sh cat df awk cat mv), then cat and rm
    assert len(started) <= 5, started
    busy = start()
    out, _ = busy.communicate("", timeout=30)
    assert busy.returncode == LOCK_BUSY and out == ""
    first.communicate(f"{RELEASED}\n", timeout=30)  # a clean release removes the owner record
    assert first.returncode == 0 and not (state / "lock.owner").exists()
    assert sorted(p.name for p in state.iterdir()) == ["lock"]


def test_a_run_that_died_leaves_a_stale_owner_and_no_blocking_lock(host):
    start, _, state, owner = host
    died = start()
    assert died.stdout.readline().startswith("LOCKED")
    died.communicate("", timeout=30)  # EOF without `released`: the channel closed
    assert json.loads((state / "lock.owner").read_text()) == owner
    nxt = start()
    line = nxt.stdout.readline()
    assert line.startswith("LOCKED {") and json.loads(line.split(" ", 1)[1]) == owner, line
    nxt.communicate(f"{RELEASED}\n", timeout=30)
    assert nxt.returncode == 0 and not (state / "lock.owner").exists()
