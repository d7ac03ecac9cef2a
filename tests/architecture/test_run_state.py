"""Typed run state (issue 29 item 2): no step passes what it learned through a
dict of string keys any more, the restore after a failure is declared by the
steps (Step.undo), and the service state has one constructor.

Source checks (ast over k26ops/) plus the playbook's restore order on real
HostContext and Step objects; the restores themselves run on lab hosts
(tests/deploy/test_faults_deploy.py, tests/engine/test_steps_engine.py, tests/baselines/test_baselines.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from k26ops.orchestrate import playbook
from k26ops.runstate import HostState
from k26ops.steps import HostContext, RunOptions, Step
from k26ops.steps.release import ReleaseDecision
from labtools.source import parsed

PKG = Path(__file__).resolve().parent.parent.parent / "k26ops"


@functools.cache
def _trees() -> tuple:
    """(path, tree) of every module, parsed once per run (the tests only read them)."""
    return tuple((path.relative_to(PKG.parent), parsed(path)) for path in sorted(PKG.rglob("*.py")))


def shared_uses(tree) -> list[int]:
    """Lines that reach a `shared` mapping of the run: `x.shared`, `shared[...]`, `shared=`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "shared":
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "shared":
            lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "shared":
            lines.append(node.value.lineno)
    return lines


def test_no_shared_string_keys_are_left():
    found = [f"{path}:{line}" for path, tree in _trees() for line in shared_uses(tree)]
    assert not found, "run state passed through a `shared` dict (use a HostState dataclass): " + ", ".join(found)


def test_the_check_sees_each_form():
    for src in (
        'ctx.shared["release_changed"] = True',
        'x = ctx.shared.get("service")',
        'shared["outcome"] = {}',
        'run(s, shared={"pins": p})',
    ):
        assert shared_uses(ast.parse(src)), src
    assert not shared_uses(ast.parse("ReleaseDecision.of(ctx).changed = True"))


def test_the_service_state_has_one_constructor():
    """Deploy and rollback build it through ServiceState.build (the rollback's own copy once lacked api_key)."""
    direct, built = [], set()
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                if (
                    isinstance(f, ast.Name)
                    and f.id == "ServiceState"
                    or (isinstance(f, ast.Attribute) and f.attr == "ServiceState")
                ):
                    direct.append(f"{path}:{node.lineno}")
                if isinstance(f, ast.Attribute) and f.attr == "build" and "ServiceState" in ast.unparse(f.value):
                    built.add(str(path))
    assert direct == [], f"ServiceState made without ServiceState.build: {direct}"
    assert {"k26ops/steps/engine.py", "k26ops/baselines/rollback.py"} <= built, built


def test_the_playbook_knows_no_step_internals():
    """The restore is each step's undo: the playbook imports no step module but the release
    step's decision (the host's release id in its result)."""
    text = (PKG / "orchestrate" / "playbook.py").read_text()
    tree = ast.parse(text)
    names = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    step_modules = {m for m in names if m.startswith("k26ops.steps.") and m.count(".") > 2}
    assert step_modules <= {"k26ops.steps.release.ReleaseDecision", "k26ops.steps.registry.STEPS"}, step_modules
    assert "ServiceState" not in text and "rollback(" not in text


class Undoes(Step):
    def __init__(self, name, said, log):
        super().__init__()
        self.name, self.said, self.log = name, said, log

    def undo(self, ctx):
        self.log.append(self.name)
        return self.said


def test_restore_asks_the_steps_latest_first_and_stops_at_the_first_answer():
    log: list[str] = []
    ctx = HostContext(session=None, host=None, vars={}, facts={})
    ctx.steps = [
        Undoes("release", "current points at r1 again", log),
        Undoes("service", "rolled back", log),
        Undoes("health", None, log),
    ]
    assert playbook.restore(ctx) == "rolled back"
    assert log == ["health", "service"]  # the release's undo is the service's to do with its restart
    log.clear()
    ctx.steps = [Undoes("toolchain", None, log), Undoes("release", None, log)]
    assert playbook.restore(ctx) is None and log == ["release", "toolchain"]


def test_state_is_per_host_and_typed():
    a = HostContext(session=None, host=None, vars={}, facts={}, options=RunOptions(allow_reboot=True))
    b = HostContext(session=None, host=None, vars={}, facts={})
    ReleaseDecision.of(a).changed = True
    assert ReleaseDecision.of(a).changed and not ReleaseDecision.of(b).changed
    assert ReleaseDecision.get(b) is not None and HostState not in a.state
    assert a.options.allow_reboot and not b.options.allow_reboot


def test_undo_puts_current_back_on_a_real_host_after_an_interrupt_too(tmp_path):
    """The release step's undo on this machine (`connection: local`: /bin/sh, a real
    symlink): `current` back where the run found it, also with the interrupt flag set
    (a Ctrl-C restore: the steps' ctx.run refuses then). The service step, not planned
    yet, leaves it to the release step; a run that moved nothing has nothing to undo."""
    from k26ops import interrupt
    from k26ops.inventory import Host
    from k26ops.steps.engine import HealthStep, ServiceStep
    from k26ops.steps.release import Release
    from k26ops.transport.ssh import LocalSession

    rel = tmp_path / "releases"
    for r in ("r1", "r2"):
        (rel / r).mkdir(parents=True)
    (rel / "current").symlink_to("r2")
    host = Host(name="here", address="", connection="local", vars={"releases_root": str(rel)})
    ctx = HostContext(
        session=LocalSession(host),
        host=host,
        vars=dict(host.vars),
        facts={},
        steps=[Release(), ServiceStep(), HealthStep()],
    )
    assert playbook.restore(ctx) is None
    ReleaseDecision(release_id="r2", previous="r1", changed=True).put(ctx)
    interrupt.requested.set()
    try:
        assert playbook.restore(ctx) == "current points at r1 again"
    finally:
        interrupt.requested.clear()
    assert (rel / "current").readlink() == Path("r1") and not (rel / ".current.tmp").exists()
