"""Playbooks: `playbooks/NAME.yml` is an ordered list of steps with parameters;
running one drives the steps per host through the fleet.

Per host: take the host lock, gather facts in one remote call, then for each
step plan -> (apply unless --check). The result lists each step as changed or
unchanged with the changes (and diffs). A step that fails or is interrupted
after the host changed: the steps' own `undo` put it back (`restore`); the
playbook knows no step's internals.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from k26ops import facts as facts_mod
from k26ops import resources
from k26ops.errors import UserError
from k26ops.facts.changes import gpu_changes
from k26ops.host import ownership, preflight
from k26ops.host.lock import HostLock
from k26ops.layout import Layout
from k26ops.release import wheelsource
from k26ops.steps import HostContext, Interrupted, RunOptions, Step, StepEvent, StepFailed
from k26ops.steps.release import ReleaseDecision
from k26ops.transport.agenthub import Hub
from k26ops.transport.fleet import Outcome, reporter
from k26ops.transport.ssh import LocalSession, SSHSession

PLAYBOOKS_DIR = resources.path("playbooks")


GPU_HEALTH_FACTS = ("gpus", "gpu_health", "gpu_xid")


def gpu_changes_since(session, facts: dict, progress) -> list[dict] | None:
    """The GPU health changes since `facts` were gathered (new Xids, ECC errors, row remaps,
    faults): the health facts gathered again and compared; None when they could not be."""
    if not any(isinstance(facts.get(n), dict) for n in GPU_HEALTH_FACTS[1:]):
        return None
    progress("gathering GPU health again")
    try:
        after = facts_mod.gather(session, list(GPU_HEALTH_FACTS))
    except facts_mod.GatherError:
        return None
    return gpu_changes(facts, after)


def fact_names(steps: list[Step]) -> list[str] | None:
    """The standard facts a run of `steps` gathers: those they read when each says (Step.fact_names), else all."""
    declared = [s.fact_names for s in steps]
    return None if None in declared else sorted({n for d in declared for n in d})


def step_message(i: int, n: int, name: str, what: str) -> StepEvent:
    """`3/5 service: planning`, with its parts as fields (steps.StepEvent: the CLI's progress
    board reads its step counter from them)."""
    return StepEvent(i, n, name, what)


def _shown(path: Path) -> str:
    """A path for a one-line message: control characters (newlines...) escaped."""
    text = str(path)
    return text if text.isprintable() else ascii(text)


def load(name_or_path: str) -> list[Step]:
    # lazy: the step table imports every step module (about 45 ms) only when a playbook runs
    from k26ops.steps.registry import STEPS

    path = Path(name_or_path)
    if not path.suffix:
        path = PLAYBOOKS_DIR / f"{name_or_path}.yml"
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise UserError(f"{_shown(path)}: cannot read playbook: {why}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{_shown(path)}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    items = (doc or {}).get("steps") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise UserError(f"{_shown(path)}: a playbook needs a non-empty `steps:` list")
    steps = []
    for i, item in enumerate(items, 1):
        if isinstance(item, str):
            item = {item: {}}
        if not isinstance(item, dict) or len(item) != 1:
            raise UserError(f"{_shown(path)}: step {i}: write each step as `- NAME: {{params}}`")
        ((name, params),) = item.items()
        if name not in STEPS:
            raise UserError(f"{_shown(path)}: step {i}: unknown step {name!r} (known: {', '.join(sorted(STEPS))})")
        if params is not None and not isinstance(params, dict):
            raise UserError(f"{_shown(path)}: step {i} ({name}): parameters must be a mapping")
        steps.append(STEPS[name](params or {}))
    return steps


NOTHING_CHANGED = "nothing was changed yet"


def restore(ctx: HostContext) -> str | None:
    """Put the host back after a failed or interrupted step: each step's own `undo`,
    latest first, until one says what it did; None when no step had anything to undo."""
    for step in reversed(ctx.steps):
        said = step.undo(ctx)
        if said is not None:
            return said
    return None


# The agents' short reads a run makes in turn (ownership, facts, the engine's converge): one
# python3 on one channel for all of them (k26ops.transport.agenthub); everything else runs as before.
HUB_OPS = {
    ("ownership", "states"),
    ("ownership", "releases"),
    ("gather", "gather"),
    ("engine", "read"),
    ("engine", "converge"),
}


def run_on_host(
    session,
    steps: list[Step],
    *,
    check: bool,
    options: RunOptions | None = None,
    progress=lambda m: None,
    purpose: str = "deploy",
) -> Outcome:
    """Run the steps on one host; raise StepFailed (or others) on failure."""
    if not isinstance(session, (SSHSession, LocalSession)) or session.hub is not None:
        return _run_on_host(session, steps, check=check, options=options, progress=progress, purpose=purpose)
    session.hub = Hub(session, HUB_OPS)
    try:
        return _run_on_host(session, steps, check=check, options=options, progress=progress, purpose=purpose)
    finally:
        hub, session.hub = session.hub, None
        hub.close()


def _run_on_host(
    session, steps: list[Step], *, check: bool, options: RunOptions | None, progress, purpose: str
) -> Outcome:
    host = session.host
    progress = reporter(progress)  # output errors never reach the steps (a closed pipe: issue 35.4)
    layout = Layout.of(host.vars)
    root = layout.root
    # read before the lock writes <root>/state; releases_root too (the release step's check), in the same call
    st, rel_st = ownership.states(session, [(root, "root"), (layout.releases_root, "releases")])
    why = ownership.refusal(root, "root", st)
    if why:
        raise StepFailed(why)
    lock = None if check else HostLock(session, layout.state_dir, purpose)
    if lock:
        lock.acquire()  # refuses a login that is not root first
        if st["state"] != "owned":
            ownership.claim(session, root)
        wheelsource.admit(session, lock)  # a wheel relay is written to only from here on
    try:
        progress("gathering facts")
        extra = preflight.host_facts(host.vars)
        for step in steps:  # the steps' own facts (the engine's model and drafter), in the same call
            extra += [f for f in step.facts(host.vars) if f.name not in {e.name for e in extra}]
        names = fact_names(steps)
        # the kernel's Xid log too where the steps read GPU health, to name new Xids after the run;
        # kept out of the steps' facts (preflight would then refuse a host with any Xid of the day)
        xid_aside = names is not None and "gpu_health" in names and "gpu_xid" not in names
        facts = facts_mod.gather(session, [*names, "gpu_xid"] if xid_aside else names, extra=extra)
        health_before = {
            "gpu_health": facts.get("gpu_health"),
            "gpu_xid": facts.pop("gpu_xid", None) if xid_aside else facts.get("gpu_xid"),
        }
        ctx = HostContext(
            session=session,
            host=host,
            vars=dict(host.vars),
            facts=facts,
            check=check,
            progress=progress,
            steps=list(steps),
            options=options or RunOptions(),
            releases_root_state=rel_st,
        )
        report, changed = [], False
        for step in steps:
            step.check_host(ctx)
        for step in steps:
            step.prepare(ctx)
        for i, step in enumerate(steps, 1):
            progress(step_message(i, len(steps), step.name, "planning"))
            try:
                changes = step.plan(ctx)
            except (Interrupted, StepFailed) as exc:
                # a plan that waits on what an earlier step changed (health, smoke) and fails without
                # restoring it (its host agent died, a read failed): the same restore as a failed apply
                back = None if check or ctx.report.get("rollback") else restore(ctx)
                if back is None:
                    raise
                ctx.report["rollback"] = back
                raise StepFailed(f"{exc}; {back}") from None
            if changes and not check:
                progress(step_message(i, len(steps), step.name, f"applying {len(changes)} change(s)"))
                try:
                    step.apply(ctx, changes)
                except Interrupted as exc:  # like a failure of this step: put the host back
                    raise StepFailed(f"{exc}; {restore(ctx) or NOTHING_CHANGED}") from None
                except StepFailed as exc:  # a failed step after the host changed: put it back
                    # once: a step that failed may have put the host back already (its report says so)
                    back = None if ctx.report.get("rollback") else restore(ctx)
                    if back is None:
                        raise
                    ctx.report["rollback"] = back
                    raise StepFailed(f"{exc}; {back}") from None
            changed = changed or bool(changes)
            report.append(
                {
                    "step": step.name,
                    "changed": bool(changes),
                    "changes": [c.what for c in changes],
                    "diffs": [c.diff for c in changes if c.diff],
                }
            )
        out = Outcome(changed=changed, steps=report, release=ReleaseDecision.of(ctx).release_id)
        out.update(ctx.report)  # steps' report data (health, smoke, ...)
        if changed and not check:
            seen = gpu_changes_since(session, health_before, progress)
            if seen is not None:
                out["gpu_changes"] = seen
        if lock and lock.stale:
            out["stale_lock"] = lock.stale
        return out
    finally:
        if lock and not wheelsource.keeps(session, lock):  # a relay's lock is kept until its batch ends
            lock.release()
