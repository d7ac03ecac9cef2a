"""A release build that failed for want of space is named as such (issue 42): venv's ensurepip
swallows pip's words and says only `exit status 1`. Run against this machine's real df through
a local session: the build's output naming ENOSPC on any line, or the filesystem nearly full."""

from __future__ import annotations

from k26ops.inventory.model import Host
from k26ops.steps import HostContext
from k26ops.steps.release import disk_full
from k26ops.transport.ssh import LocalSession


def _ctx() -> HostContext:
    s = LocalSession(Host(name="local", address="127.0.0.1", connection="local"))
    return HostContext(session=s, host=s.host, vars={}, facts={})


def test_a_build_that_ran_out_of_space_says_disk_full(tmp_path):
    lines = [
        "Error: Command '['venv/bin/python', '-m', 'ensurepip']' returned non-zero exit status 1.",
        "OSError: [Errno 28] No space left on device: 'venv/lib/python3.11/site-packages/pip'",
        "exit status 1",
    ]
    said = disk_full(_ctx(), str(tmp_path), lines)
    assert said and said.startswith("disk full (") and f"MiB free on {tmp_path}): OSError: [Errno 28]" in said, said
    assert "\n" not in said


def test_other_failures_with_room_left_are_not_called_disk_full(tmp_path):
    assert disk_full(_ctx(), str(tmp_path), ["ERROR: hash mismatch", "exit status 1"]) is None
