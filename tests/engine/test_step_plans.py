"""The plans of the cuda_toolkit, release, service, driver and baseline_pins steps
without a host: each case gives the host's recorded answers
(tests/data/steps/<step>.json, taken from a real lab host by
tests/record_step_answers.py) and the plan the step must make from them; the
step must ask exactly the recorded calls, in order. What only a real host
shows (systemd, signals, disks, sudo) stays in the lab tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from replay import Replay, load

from k26ops import facts as facts_mod
from k26ops.baselines.pins import BaselinePins
from k26ops.host import preflight
from k26ops.inventory import Host
from k26ops.steps import HostContext, StepFailed
from k26ops.steps.registry import STEPS
from k26ops.steps.release import ReleaseDecision

STEP_FILES = ["cuda_toolkit", "release", "service", "driver", "baseline_pins"]
STEP_CLASSES = {**STEPS, BaselinePins.name: BaselinePins}  # the baselines' steps are not in the registry


def _cases():
    for step in STEP_FILES:
        for case in load(step)["cases"]:
            yield pytest.param(step, case, id=f"{step}: {case['name']}")


def _prepared(p: dict):
    """What the release step's `prepare` learns on the control node, as the plan reads it."""
    return SimpleNamespace(
        release_id=p["release_id"],
        recipe=SimpleNamespace(base_short=p["base_short"]),
        engine_wheel=SimpleNamespace(sha256=p["wheel_sha256"]),
        lock=SimpleNamespace(sha256=p["lock_sha256"]),
        patches=[None] * p["patches"],
    )


def plan(step_name: str, case: dict):
    """(the step's plan as the lines a person reads, the replaying session)."""
    spec = load(step_name)
    h = spec["host"]
    host = Host(name=h["name"], address="127.0.0.1", vars={**h["vars"], **case.get("vars", {})})
    session = Replay(host, case["answers"])
    facts = facts_mod.gather(session, extra=preflight.host_facts(host.vars))
    inputs = case.get("inputs") or {}  # what the run gives the step: its pins, the releases root's owner
    step = STEP_CLASSES[step_name](
        {**(spec.get("params") or {}), **({"pins": inputs["pins"]} if "pins" in inputs else {})}
    )
    ctx = HostContext(
        session=session,
        host=host,
        vars=dict(host.vars),
        facts=facts,
        check=True,
        steps=[step],
        releases_root_state=inputs.get("releases_root_state"),
    )
    if "prepared" in spec or "release_id" in inputs:  # what the release step decided before
        ReleaseDecision(
            release_id=inputs.get("release_id"),
            changed=bool(inputs.get("release_changed")),
            prepared=_prepared(spec["prepared"]) if "prepared" in spec else None,
        ).put(ctx)
    return [c.what for c in step.plan(ctx)], session


@pytest.mark.parametrize("step_name, case", _cases())
def test_plan_from_recorded_answers(step_name, case):
    if "error" in case:
        with pytest.raises(StepFailed) as exc:
            plan(step_name, case)
        assert case["error"] in str(exc.value)
        return
    got, session = plan(step_name, case)
    assert got == case["plan"]
    assert session.answers == [], f"recorded calls the step did not make: {session.answers}"


def test_a_call_the_case_does_not_expect_fails_the_test():
    """The replay is strict: a step that asks the host something else fails, naming the call."""
    case = next(c for c in load("release")["cases"] if c["plan"] == [] and "error" not in c)
    wrong = [case["answers"][0], {"command": "readlink /opt/k26ops/releases/current", "stdout": ""}]
    with pytest.raises(AssertionError, match="remote call .*cd /opt/k26ops/releases"):
        plan("release", {**case, "answers": wrong})
