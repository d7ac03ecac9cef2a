"""Rolling batches (`--batch N|P%|1,2,25%`, `--max-fail N|P%`): the one parser
shared by deploy/provision/reboot, the batch plan, and the stop rule of a real
rollout over `connection: local` hosts (real sessions, real /bin/sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k26ops import inventory
from k26ops.orchestrate import rollout
from k26ops.orchestrate.rollout import Size, canary_batches, parse_batches, parse_size
from k26ops.transport.fleet import FleetOptions
from labtools.invoke import cli

NAMES = [f"h{i}" for i in range(1, 11)]


def test_batch_sizes_read_as_ansible_serial():
    assert parse_batches("3") == [Size(3)]
    assert parse_batches("25%") == [Size(25, True)]
    assert parse_batches(" 1, 2 ,25%") == [Size(1), Size(2), Size(25, True)]
    # the canary first, then 1, 2, then 25 % of all ten hosts (2) repeated
    assert canary_batches(NAMES, 1, parse_batches("1,2,25%")) == [
        ["h1"],
        ["h2"],
        ["h3", "h4"],
        ["h5", "h6"],
        ["h7", "h8"],
        ["h9", "h10"],
    ]
    # no canary: the batches cover every host; a percent is never less than one host
    assert canary_batches(NAMES, 0, parse_batches("30%")) == [NAMES[0:3], NAMES[3:6], NAMES[6:9], NAMES[9:]]
    assert canary_batches(NAMES[:3], 0, parse_batches("1%")) == [["h1"], ["h2"], ["h3"]]
    assert canary_batches(NAMES, 2) == [NAMES[:2], NAMES[2:]]  # no --batch: the rest at once


@pytest.mark.parametrize("bad", ["0", "x", "1.5", "150%", "3,", "0%", "-1", "1e3", ""])
def test_bad_batch_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_batches(bad)


def test_fail_limits():
    assert not parse_size("0", zero=True).exceeded(0, 3)
    assert parse_size("0", zero=True).exceeded(1, 3)
    assert not parse_size("1", zero=True).exceeded(1, 3) and parse_size("1", zero=True).exceeded(2, 3)
    assert not parse_size("50%", zero=True).exceeded(1, 2) and parse_size("49%", zero=True).exceeded(1, 2)


def _hosts(tmp_path: Path, n: int):
    p = tmp_path / "local.yml"
    p.write_text("hosts:\n" + "".join(f"  h{i}:\n    connection: local\n" for i in range(1, n + 1)))
    return inventory.load(p).select(None)


def _run(tmp_path, fail: set[str], **kw):
    started: list[str] = []

    def work(session):
        started.append(session.host.name)
        session.run("true")  # a real command on the local connection
        if session.host.name in fail:
            raise RuntimeError("told to fail")
        return None

    run = rollout.run(_hosts(tmp_path, 5), work, FleetOptions(forks=4), **kw)
    return run, {r.host: r.status for r in run.results}, started


def test_a_failed_batch_stops_the_rollout_and_max_fail_lets_it_go_on(tmp_path):
    run, status, started = _run(tmp_path, {"h3"}, canary=1, batch=parse_batches("2"))
    assert status == {"h1": "ok", "h2": "ok", "h3": "failed", "h4": "skipped", "h5": "skipped"}
    assert sorted(started) == ["h1", "h2", "h3"]
    assert run.stopped.host == "h3" and run.stopped.untouched == ["h4", "h5"]
    assert "batch 2 h3 failed" in [r for r in run.results if r.host == "h4"][0].error
    # one failure allowed per batch (as a count, or as 50 % of a batch of two): it goes on
    for limit in ("1", "50%"):
        run, status, _ = _run(
            tmp_path, {"h3"}, canary=1, batch=parse_batches("2"), max_fail=parse_size(limit, zero=True)
        )
        assert status == {"h1": "ok", "h2": "ok", "h3": "failed", "h4": "ok", "h5": "ok"}, limit
        assert run.stopped is None and run.code == 1
    # ... but the canary must always succeed
    run, status, _ = _run(tmp_path, {"h1"}, canary=1, batch=parse_batches("2"), max_fail=parse_size("5", zero=True))
    assert status == {"h1": "failed", "h2": "skipped", "h3": "skipped", "h4": "skipped", "h5": "skipped"}


@pytest.mark.parametrize("args", [["--batch", "0"], ["--batch", "1,x"], ["--max-fail", "150%"], ["--batch", "1.5"]])
def test_bad_batch_options_are_one_usage_line(tmp_path, args):
    inv = tmp_path / "local.yml"
    inv.write_text("hosts:\n  here:\n    connection: local\n")
    for cmd in ("deploy", "reboot"):
        proc = cli("-i", str(inv), cmd, *args)
        assert proc.returncode == 2, (cmd, args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and args[1] in proc.stderr, proc.stderr


def test_a_stopped_rollout_names_at_most_twenty_untouched_hosts():
    """10,000 hosts at --batch 1% printed a 100,108-character `untouched:` line (issue 42)."""
    from k26ops.cli.rollout import names_brief

    names = [f"gpu{i:05d}" for i in range(9900)]
    line = names_brief(names)
    assert line.startswith("gpu00000, gpu00001, ") and line.endswith("gpu00019 and 9880 more (9900 hosts)")
    assert len(line) < 300
    assert names_brief(names[:21]) == ", ".join(names[:21])  # "and 1 more" would say less than the name
