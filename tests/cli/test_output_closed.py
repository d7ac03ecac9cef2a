"""Output that goes away never reaches host work (issue 35.4), host-free.

The fleet runs `connection: local` hosts (this machine, no SSH); a reporter
that raises -- BrokenPipeError, or the SystemExit rich turns it into -- must
neither end a worker thread (before: the host waited for --deadline) nor reach
the host's work. The CLI, its stdout a real pipe whose reader has gone, exits
141 without a traceback. (tests/cli/test_closed_pipe.py does the deploy on a lab host.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from k26ops import inventory
from k26ops.transport.fleet import Fleet, FleetOptions, Outcome, reporter
from labtools import REPO


def local_hosts(tmp_path: Path, n: int = 2):
    p = tmp_path / "local.yml"
    p.write_text("hosts:\n" + "".join(f"  here{i}:\n    connection: local\n" for i in range(n)))
    return inventory.load(p).select(None)


def closed_pipe_output(*_args):
    raise BrokenPipeError(32, "Broken pipe")


def rich_on_a_closed_pipe(*_args):
    raise SystemExit(1)  # what rich's Console.on_broken_pipe does by default


def test_a_failing_reporter_neither_ends_the_worker_nor_reaches_the_work(tmp_path):
    hosts = local_hosts(tmp_path, 3)
    seen = []

    def work(session):
        progress = reporter(closed_pipe_output)
        for i in range(3):
            progress(f"step {i}")  # must not raise into the work
        seen.append(session.host.name)
        return Outcome(changed=True, done=True)

    t0 = time.monotonic()
    fleet = Fleet(
        hosts, FleetOptions(forks=1, deadline=60), on_result=rich_on_a_closed_pipe, on_event=closed_pipe_output
    )
    results = fleet.run(work)
    fleet.close()
    assert time.monotonic() - t0 < 30
    assert [(r.status, r.data.get("done")) for r in results] == [("changed", True)] * 3, results
    assert sorted(seen) == [h.name for h in hosts]  # one worker, three hosts: it never died


def test_work_raising_system_exit_fails_its_host_instead_of_hanging_the_run(tmp_path):
    hosts = local_hosts(tmp_path, 1)

    def work(session):
        raise SystemExit(1)

    t0 = time.monotonic()
    fleet = Fleet(hosts, FleetOptions(deadline=60))
    (r,) = fleet.run(work)
    fleet.close()
    assert time.monotonic() - t0 < 30, "the host waited for its deadline"
    assert r.status == "failed" and "SystemExit" in r.error, r


def test_the_cli_exits_141_quietly_when_its_stdout_reader_is_gone():
    """`k26ops inventory vars | head -0`, with a real pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "k26ops", "inventory", "vars"],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode == 141, (proc.returncode, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err
