"""`status`'s new Xid since the engine started (k26ops/facts/xid.py since_engine_start,
k26ops/cli/commands/status.py xid_lines), on recorded kernel logs replayed by the lab's journalctl
stand-in (run here as a program, its nvidia-smi the lab's) as `journalctl -k -o short-iso`."""

from __future__ import annotations

import time
from pathlib import Path

from k26ops.cli.commands.status import xid_lines
from k26ops.facts import xid
from labtools.fixtures import lab_bus_ids

DATA = Path(__file__).resolve().parent.parents[1] / "tests" / "data" / "facts"


def replay(tmp_path: Path, name: str, at: float) -> str:
    """The gpu_xid command's output on a lab host replaying recorded `name` (stamped `at`)."""
    from labtools.fixtures import lab_kernel_log

    return lab_kernel_log(tmp_path, name, at, xid.XID_COMMAND)


def answer(kernel: str, entered_ago_s: float) -> dict:
    """The engine agent's status answer: the unit active for `entered_ago_s` seconds."""
    now_mono = 10_000_000_000
    return {
        "show": {"ActiveState": "active", "ActiveEnterTimestampMonotonic": int(now_mono - entered_ago_s * 1e6)},
        "now_monotonic_us": now_mono,
        "now": time.time(),
        "kernel": {"rc": 0, "stdout": kernel},
        "bus_ids": lab_bus_ids(),
    }


def test_an_xid_after_the_engine_started_is_new_with_its_gpu_and_action(tmp_path):
    out = replay(tmp_path, "pub-ogkm1151-journal-xid79.txt", time.time() - 60)
    assert " kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus." in out  # lab GPU 0's bus id
    events = xid.since_engine_start(answer(out, entered_ago_s=600))
    assert [(e["gpu"], e["xid"], e["action"]) for e in events] == [(0, 79, "reboot")]
    [line] = xid_lines(events)
    assert line.startswith("new since the engine started: GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus")
    assert "; action: reboot: drain the host and reboot it" in line


def test_an_xid_before_the_engine_started_is_not_new(tmp_path):
    out = replay(tmp_path, "pub-pytorch51382-dmesg-xid43-31.txt", time.time() - 600)
    assert xid.since_engine_start(answer(out, entered_ago_s=60)) == []
    events = xid.since_engine_start(answer(out, entered_ago_s=6000))
    assert {(e["gpu"], e["xid"]) for e in events} == {(0, 43), (1, 31)}
    assert len(xid_lines(events)) == 2  # one line per GPU and Xid, not per channel


def test_nothing_when_the_unit_never_became_active_or_the_log_is_healthy(tmp_path):
    out = replay(tmp_path, "pub-ogkm1151-journal-xid79.txt", time.time())
    stopped = answer(out, 60)
    stopped["show"]["ActiveEnterTimestampMonotonic"] = 0
    assert xid.since_engine_start(stopped) == []
    healthy = replay(tmp_path, "h200-dmesg-nvrm-healthy.txt", time.time())
    assert xid.since_engine_start(answer(healthy, 600)) == []
    assert xid.since_engine_start(answer((DATA / "h200-xid-fact-healthy.txt").read_text(), 600)) == []


def test_journal_stamps_are_read_and_dmesg_ones_are_not():
    assert xid.line_time("2026-12-02T03:05:37+0000 lab1 kernel: NVRM: x") == 1796180737.0
    assert xid.line_time("2026-12-02T03:05:37.250+00:00 lab1 kernel: NVRM: x") == 1796180737.0
    assert xid.line_time("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0") is None
    assert xid.line_time("May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, x") is None
