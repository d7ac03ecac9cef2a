"""The agent hub (agents/hub.py, k26ops/transport/agenthub.py) on a real local session: several
agents' operations answered by one python3 on one channel, the same answers as their
own agents.run calls; a failing operation is that agent's failure and the hub goes on;
a call that outlives its time ends the hub and the next call runs as its own command.
No lab: the lab test of a converged deploy is tests/engine/test_converged_deploy.py."""

from __future__ import annotations

import time

import pytest

from k26ops.host import ownership
from k26ops.inventory import Host
from k26ops.transport import agenthub, agents
from k26ops.transport.ssh import LocalSession

OPS = {("ownership", "states"), ("gather", "gather")}


@pytest.fixture
def session(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the hub has only the standard library, as on a host
    s = LocalSession(Host(name="local", address="127.0.0.1", connection="local"))
    yield s
    if s.hub is not None:
        s.hub.close()


def reads(session, tmp_path):
    """One ownership read and two fact gathers, as a run makes them."""
    (tmp_path / "root").mkdir(exist_ok=True)
    st = ownership.states(session, [(str(tmp_path / "root"), "root"), (str(tmp_path / "nope"), "releases")])
    cmds = [{"name": "echo", "command": "echo hello; echo err >&2; exit 3"}]
    return (
        st,
        agents.run(session, "gather", "gather", 30, commands=cmds),
        agents.run(session, "gather", "gather", 30, commands=cmds[:0]),
    )


def test_a_runs_reads_are_one_command_with_the_same_answers(session, tmp_path):
    direct = reads(session, tmp_path)
    assert session.commands == 3
    session.commands = 0
    session.hub = agenthub.Hub(session, OPS)
    assert reads(session, tmp_path) == direct
    assert session.commands == 1 and session.hub.calls == 3
    assert direct[0] == [{"state": "empty", "foreign": [], "count": 0}, {"state": "absent"}]
    assert direct[1] == {"echo": {"rc": 3, "stdout": "hello\n", "stderr": "err\n"}}
    # an op the hub was not given runs as its own command
    agents.run(
        session,
        "ownership",
        "releases",
        dir=str(tmp_path),
        kind="releases",
        names=[],
        marker=ownership.MARKER,
        release_marker=ownership.RELEASE_MARKER,
        root_entries=[],
    )
    assert session.commands == 2 and session.hub.calls == 3


def test_a_failing_op_is_the_agents_failure_and_the_hub_goes_on(session):
    session.hub = agenthub.Hub(session, OPS)
    with pytest.raises(agents.AgentFailed, match=r"fact gathering \(gather\) failed: KeyError: 'commands'"):
        agents.run(session, "gather", "gather", 30, what="fact gathering")
    assert agents.run(session, "gather", "gather", 30, commands=[]) == {}
    assert session.commands == 1


def test_a_call_past_its_time_ends_the_hub_and_the_next_runs_alone(session):
    session.hub = agenthub.Hub(session, OPS)
    slow = [{"name": "slow", "command": "sleep 5", "timeout": 10}]
    t0 = time.monotonic()
    with pytest.raises(agents.AgentFailed, match="through the agent hub: no answer within 0.3s"):
        agents.run(session, "gather", "gather", 0.3, commands=slow)
    assert time.monotonic() - t0 < 4  # not the 5 s the command sleeps
    assert session.hub.closed and session.hub.proc is None
    assert agents.run(session, "gather", "gather", 30, commands=[]) == {}
    assert session.commands == 2  # the hub, then the gather on its own


def test_the_hub_and_its_caller_agree_on_the_answer_prefix():
    text = agents.source("hub")
    assert f'ANSWER = "{agenthub.ANSWER}"' in text


# --- a deploy gathers the standard facts its steps read, not every fact


def test_a_deploy_gathers_what_its_checks_read_and_refuses_as_with_every_fact():
    import json
    from pathlib import Path

    from k26ops import facts as facts_mod
    from k26ops.host import preflight
    from k26ops.orchestrate import playbook
    from k26ops.steps import toolchain

    names = playbook.fact_names(playbook.load("deploy"))
    # nvidia-smi started twice (the query, -q), not for its table too: the driver is the query's
    assert names == ["cuda_toolkit", "gpu_health", "gpus", "os_release", "python3"]
    data = Path(__file__).resolve().parent.parent / "data"
    raw = json.loads((data / "steps" / "lab-gather-converged.json").read_text())["answer"]
    # the recorded lab host, its nvidia-smi -q replaced by a real-format one with GPUs that need a reset
    raw["gpu_health"] = {
        "rc": 0,
        "stderr": "",
        "stdout": (data / "facts" / "constructed-h200-q-faults.txt").read_text(),
    }
    extra = preflight.host_facts({})  # the facts of the host's layout, gathered by every deploy
    every, read = facts_mod.parse_results(raw, extra=extra), facts_mod.parse_results(raw, names, extra=extra)
    want = {"model_path": "/models/none", "drafter": None}
    refusals = preflight.deploy_refusals(every, {}, want)
    assert "gpu_reset" in [c.name for c in refusals]
    assert preflight.deploy_refusals(read, {}, want) == refusals
    assert toolchain.archs(read) == toolchain.archs(every)
    assert preflight.driver_version(read) == preflight.driver_version(every)
    # a run with a step that does not say what it reads gathers every fact
    assert playbook.fact_names(playbook.load("deploy") + [toolchain.Step()]) is None
