"""Ctrl-C while one host runs and another is still queued (--forks 1): the queued
host is reported `interrupted` (its result, the table, --json) and the run exits
130, in deploy and in snapshot.

Real fleet (k26ops.transport.fleet, k26ops.orchestrate.rollout), real playbook (run_on_host: host lock,
facts, a step's remote commands), real CLI (in-process, so that the Ctrl-C can
come at a known point), real `connection: local` sessions running /bin/sh here.
The Ctrl-C is `_thread.interrupt_main()`, i.e. SIGINT as the main thread sees it.
No lab: the hosts are this machine.
"""

from __future__ import annotations

import _thread
import json
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from jsonshape import validate

from k26ops import interrupt
from k26ops.orchestrate import rollout
from k26ops.steps import Change, HostContext, Step
from k26ops.transport import fleet

EXIT_INTERRUPTED = 130


@pytest.fixture(autouse=True)
def fresh_interrupt():
    """The process-wide interrupt Event (k26ops.interrupt.requested) is clear before and after."""
    interrupt.requested.clear()
    yield
    interrupt.requested.clear()


def _inventory(tmp_path: Path) -> Path:
    """Two local hosts, each with its own k26ops_root (lock, state) under tmp_path."""
    hosts = {
        name: {"connection": "local", "vars": {"k26ops_root": str(tmp_path / name / "k26ops")}}
        for name in ("first", "queued")
    }
    p = tmp_path / "inventory.yml"
    p.write_text(yaml.safe_dump({"hosts": hosts}))
    return p


def _interrupt_and_wait(run) -> None:
    """On the running host: a real command, then Ctrl-C; the next remote command
    sees it (run raises steps.Interrupted, as a deploy step's would)."""
    run("true")
    _thread.interrupt_main()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        run("true")
        time.sleep(0.05)
    raise AssertionError("the interrupt never reached the running host's commands")


class InterruptingStep(Step):
    name = "interrupting"

    def plan(self, ctx: HostContext) -> list[Change]:
        return [Change("interrupt the run")]

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        assert ctx.host.name == "first", "the queued host must never start"
        _interrupt_and_wait(lambda cmd: ctx.run(cmd, check=True))


def _cli(args: list[str]):
    from k26ops.cli import cli, hoist_global_flags

    return CliRunner().invoke(cli, hoist_global_flags(args), catch_exceptions=False)


def test_rollout_reports_the_queued_host_interrupted(tmp_path):
    from k26ops import inventory

    hosts = inventory.load(_inventory(tmp_path)).select(None)
    work = rollout.playbook_work([InterruptingStep()])
    run = rollout.run(hosts, lambda s: work(s, lambda m: None), fleet.FleetOptions(forks=1, interrupt_grace=60))
    by = {r.host: r for r in run.results}
    assert run.interrupted is not None and run.code == EXIT_INTERRUPTED
    assert by["queued"].status == "interrupted", by["queued"].status  # not the Event
    assert by["queued"].error == "interrupted before this host started"
    assert json.loads(json.dumps(by["queued"].to_json(), default=str))["status"] == "interrupted"
    # the running host restored what it changed (nothing) and reports its step's failure
    assert by["first"].status == "failed" and "interrupted" in by["first"].error, by["first"]
    assert "queued" in str(run.interrupted)  # "interrupted; not finished: queued"


def test_deploy_json_reports_the_queued_host_interrupted_and_exits_130(tmp_path, monkeypatch):
    from k26ops.cli.commands import deploy

    monkeypatch.setattr(deploy.playbook, "load", lambda name: [InterruptingStep()])
    res = _cli(["-i", str(_inventory(tmp_path)), "--forks", "1", "--json", "deploy"])
    doc = json.loads(res.stdout)
    validate(doc)
    assert res.exit_code == EXIT_INTERRUPTED and doc["exit_code"] == EXIT_INTERRUPTED, (res.exit_code, doc)
    assert doc["hosts"]["queued"]["status"] == "interrupted", doc["hosts"]["queued"]
    assert doc["hosts"]["first"]["status"] == "failed"
    assert "not finished: queued" in res.stderr


def test_deploy_table_shows_the_queued_host_interrupted(tmp_path, monkeypatch):
    from k26ops.cli.commands import deploy

    monkeypatch.setattr(deploy.playbook, "load", lambda name: [InterruptingStep()])
    res = _cli(["-i", str(_inventory(tmp_path)), "--forks", "1", "deploy"])
    assert res.exit_code == EXIT_INTERRUPTED
    row = next(line for line in res.stdout.splitlines() if line.lstrip().startswith("queued"))
    assert row.split()[1] == "interrupted", row
    assert "Event" not in res.stdout


def _interrupting_gather(session, tag, now):
    assert session.host.name == "first", "the queued host must never start"
    from k26ops.steps import check_interrupted

    def run(cmd):
        check_interrupted()
        session.run(cmd, check=True)

    _interrupt_and_wait(run)


def test_snapshot_reports_the_queued_host_interrupted(tmp_path, monkeypatch):
    from k26ops import inventory
    from k26ops.baselines import snapshot as snap

    monkeypatch.setattr(snap, "gather_host", _interrupting_gather)
    hosts = inventory.load(_inventory(tmp_path)).select(None)
    repo = snap.open_repo("t1", baselines_dir=tmp_path / "baselines")
    with pytest.raises(fleet.FleetInterrupted) as exc:
        snap.snapshot(repo, hosts, fleet.FleetOptions(forks=1, interrupt_grace=60), "t1")
    by = {r.host: r for r in exc.value.results}
    assert by["queued"].status == "interrupted", by["queued"].status
    assert by["first"].status == "failed" and "interrupted" in by["first"].error
    assert str(exc.value) == "interrupted; not finished: queued"
    assert not repo.has_tag("t1")  # nothing recorded


def test_snapshot_json_is_one_document_and_exits_130(tmp_path, monkeypatch):
    from k26ops.baselines import snapshot as snap

    monkeypatch.setattr(snap, "gather_host", _interrupting_gather)
    res = _cli(
        [
            "-i",
            str(_inventory(tmp_path)),
            "--forks",
            "1",
            "--json",
            "snapshot",
            "--tag",
            "t1",
            "--baselines",
            str(tmp_path / "baselines"),
        ]
    )
    assert res.exit_code == EXIT_INTERRUPTED, (res.exit_code, res.stdout, res.stderr)
    doc = json.loads(res.stdout)
    validate(doc)
    assert doc["command"] == "snapshot" and doc["exit_code"] == EXIT_INTERRUPTED and not doc["ok"]
    assert doc["error"] == "interrupted; not finished: queued"


def test_baselines_repin_json_exits_130_when_a_host_was_queued(tmp_path, monkeypatch):
    """cli/baselines.py's pins report decides 130 from the hosts' statuses."""
    import subprocess

    from k26ops.baselines import pins

    monkeypatch.setattr(pins, "BaselinePins", InterruptingStep)
    repo = tmp_path / "baselines"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)  # a repository with no tags: nothing pinned
    res = _cli(
        ["-i", str(_inventory(tmp_path)), "--forks", "1", "--json", "baselines", "repin", "--baselines", str(repo)]
    )
    doc = json.loads(res.stdout)
    validate(doc)
    assert res.exit_code == EXIT_INTERRUPTED and doc["exit_code"] == EXIT_INTERRUPTED, (res.exit_code, doc)
    assert doc["hosts"]["queued"]["status"] == "interrupted"


class InterruptingPins(Step):
    name = "baseline_pins"

    def plan(self, ctx: HostContext) -> list[Change]:
        return [Change("interrupt the run")]

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        _interrupt_and_wait(lambda cmd: ctx.run(cmd, check=True))


@pytest.mark.parametrize("as_json", [False, True])
def test_repin_interrupted_with_no_host_queued_exits_130(tmp_path, monkeypatch, as_json):
    """Ctrl-C while the only host repins: no host is left queued, so no result says
    `interrupted`; the rollout does, and `baselines repin` exits 130, not 1."""
    from k26ops.baselines import pins

    inv = tmp_path / "one.yml"
    inv.write_text(
        yaml.safe_dump(
            {"hosts": {"first": {"connection": "local", "vars": {"k26ops_root": str(tmp_path / "first/k26ops")}}}}
        )
    )
    import git

    git.Repo.init(tmp_path / "baselines", initial_branch="main")  # a repository, no tag yet
    monkeypatch.setattr(pins, "BaselinePins", InterruptingPins)
    res = _cli(
        [
            "-i",
            str(inv),
            *(["--json"] if as_json else []),
            "baselines",
            "repin",
            "--baselines",
            str(tmp_path / "baselines"),
        ]
    )
    assert res.exit_code == EXIT_INTERRUPTED, (res.exit_code, res.stdout, res.stderr)
    if as_json:
        doc = json.loads(res.stdout)
        validate(doc)
        assert doc["exit_code"] == EXIT_INTERRUPTED and doc["hosts"]["first"]["status"] == "failed"


def test_the_interrupt_line_names_the_failed_hosts_when_none_is_unfinished():
    # both hosts were running at Ctrl-C: each restored itself and failed (interrupted); none was queued
    both = [fleet.HostResult("a", fleet.FAILED, "interrupted"), fleet.HostResult("b", fleet.FAILED, "interrupted")]
    assert str(fleet.FleetInterrupted(both)) == "interrupted; failed: a, b"
    one = [fleet.HostResult("a", fleet.CHANGED), fleet.HostResult("b", fleet.INTERRUPTED)]
    assert str(fleet.FleetInterrupted(one)) == "interrupted; not finished: b"
    assert str(fleet.FleetInterrupted([fleet.HostResult("a", fleet.OK)])) == "interrupted; every host had finished"
