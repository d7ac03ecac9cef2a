"""The engine under systemd: steps `service`, `health` and `smoke`.

- `service` renders the unit and env file (units.py templates) from the
  recipe's engine profile overlaid with the inventory, compares them with the
  host's files (one remote read) and installs only what differs: the new unit
  is checked with `systemd-analyze verify` on the host before it replaces the
  old one, files are replaced by atomic rename, and the engine restarts only
  when the unit, the env file or the `current` release changed. The previous
  unit and env file are kept (state dir) for a rollback.
- `health` polls readiness from the host itself (/health, then
  /health_generate) in long-poll windows (one remote command per window); a
  crash (unit failed, process exited, restarted) ends the wait at once, the
  journal tail is classified with the diagnose classifier, and a change made
  by this run is rolled back (previous unit, env file and `current`).
- `smoke` sends one short /generate; it must return text. Latency and
  meta_info.spec_accept_length go into the host's report.

Every host-side action runs through one stdlib-only Python agent
(agents/engine.py); requests and answers are JSON over stdin/stdout. The
engine's unit, port, env file, secrets and the ready-wait come from
k26ops.engine.host. Secrets (HF_TOKEN, *_TOKEN, ...) reach only the env file
(mode 0600), secret engine flags (--api-key) only the secrets file the engine
reads with --config (mode 0600: never in an argv that `ps` shows); diffs,
journal lines and messages are redacted before anyone sees them. A unit file
k26ops did not write (no UNIT_MARKER line, or a unit systemd loads from
elsewhere, e.g. `engine_unit: ssh.service`) is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from k26ops.engine import launch, secret_policy, units
from k26ops.engine.host import UNIT_DIR, EngineHost, agent, foreign_listener, lab_standin_text, mapping, wait_ready
from k26ops.engine.multinode import serves_http
from k26ops.engine.state import exit_status_text, run_identity, start_limit_hit
from k26ops.errors import UserError
from k26ops.facts.xid import parse_bus_ids
from k26ops.host import preflight
from k26ops.hostvars import Var, declare
from k26ops.runstate import HostState
from k26ops.steps import Change, HostContext, Step, StepFailed, text_diff, traffic, warmstart
from k26ops.steps.release import ReleaseDecision

# Lab fixture, read as a file (nothing outside `lab` imports it); installed only on `lab: true` hosts.
DEFAULT_HEALTH_TIMEOUT = 1800.0
declare(
    __name__,
    "the engine's service",
    Var(
        "unit_settings",
        "mapping",
        {},
        "extra [Service] settings for the engine unit, in systemd's "
        "spelling (CPUAffinity, User, MemoryMax, Nice, ...; docs/how-to/engine-unit.md)",
    ),
    Var("health_timeout", "number (s)", DEFAULT_HEALTH_TIMEOUT, "seconds to wait for the engine's /health"),
    Var(
        "rollback_health_timeout", "number (s)", None, "seconds to wait for /health after a rollback", "health_timeout"
    ),
)


class EngineFailed(StepFailed):
    """The engine did not become healthy: one-line message plus the journal tail
    (redacted) and the classifier's diagnosis for the report."""

    def __init__(
        self, message: str, journal_tail: str = "", diagnosis: dict | None = None, outcome: dict | None = None
    ):
        super().__init__(message)
        # what the steps had learned (health, smoke, rollback) stays in the report
        self.details = {**(outcome or {}), "journal_tail": journal_tail, "diagnosis": diagnosis or {}}


@dataclass
class ServiceState(HostState):
    """The service step's state, read by health, smoke and the undo of a failed run.
    Built only by `build`: the deploy's service step, the rollback's baseline_service
    and the defaults when neither ran (`of`) get the same fields, the engine's request
    credentials (`api_key`) included: every request but /health* needs them when the
    engine runs with --api-key."""

    unit: str
    unit_path: str
    env_path: str
    secrets_path: str  # the secret flags' --config file (mode 0600)
    host: str  # where the engine is polled from the host itself
    port: int
    secrets: list[str] = field(repr=False)  # every value to redact (never in a repr)
    api_key: str | None = field(repr=False)
    show: dict | None = None  # the unit's systemctl show, as planned
    changed: bool = False  # this run replaced the unit's files (or may have: a failed apply)
    base: dict | None = None  # MainPID/NRestarts/InvocationID of the run this deploy started
    todo: dict = field(default_factory=dict, repr=False)  # what apply asks the agent (file texts: secrets)
    restart_reasons: list[str] = field(default_factory=list)
    restarted: bool = False
    unsettled: bool = False  # a killed run's install, never seen healthy: prev/ holds what ran before it

    @classmethod
    def build(
        cls,
        eh: EngineHost,
        *,
        secrets: list[str] | None = None,
        unit: str | None = None,
        unit_path: str | None = None,
        env_path: str | None = None,
        port: int | None = None,
        show: dict | None = None,
        secrets_path: str | None = None,
    ) -> "ServiceState":
        """The one constructor: what is not given comes from the engine host (inventory, profile)."""
        host, default_port = eh.target()
        unit = unit or eh.unit
        return cls(
            unit=unit,
            unit_path=unit_path or f"{UNIT_DIR}/{unit}",
            env_path=env_path or eh.env_path,
            secrets_path=secrets_path or launch.secrets_file_beside(env_path or eh.env_path),
            host=host,
            port=port or default_port,
            secrets=eh.secrets() if secrets is None else secrets,
            api_key=eh.api_key(),
            show=show,
        )

    @classmethod
    def of(cls, ctx: HostContext, params: dict | None = None) -> "ServiceState":
        """What the service step learned (unit, port, poll base), or defaults when it did not run."""
        return cls.get(ctx) or cls.build(EngineHost(ctx, params)).put(ctx)


@dataclass
class LookedAhead(HostState):
    """What the health and smoke steps would have asked, answered by the service
    step's converge call when nothing was to change (see `looked_ahead`)."""

    poll: dict | None = None
    poll_s: float | None = None
    smoke: dict | None = None


# ---------------------------------------------------------------- service step


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def looked_ahead(ctx: HostContext, step: Step, host: str, port: int) -> dict | None:
    """The requests of the health and smoke steps that come after `step` in
    this run, for the engine agent's `converge` op: when nothing is to change,
    the read, the health poll and the smoke requests are one start of python3
    on the host. None when they do not both follow (or --check, or a rank
    that serves no HTTP)."""
    if ctx.check or not serves_http(ctx.vars) or step not in ctx.steps:
        return None
    later = ctx.steps[ctx.steps.index(step) + 1 :]
    health = next((s for s in later if isinstance(s, HealthStep)), None)
    smoke = next((s for s in later if isinstance(s, SmokeStep)), None)
    if health is None or smoke is None:
        return None
    poll = {"port": port, "host": host, "window": health.window()}
    body, smoke_timeout = smoke.request()
    return {"poll": poll, "smoke": {"port": port, "host": host, **body}, "timeout": poll["window"] + smoke_timeout}


class ServiceStep(Step):
    """Install the engine's unit + env file; restart only on a change."""

    name = "service"
    preflight = True  # the rollback's baseline_service starts what its tag recorded: not checked here

    @property
    def fact_names(self) -> tuple[str, ...]:
        return preflight.DEPLOY_FACTS if self.preflight else ()  # the module's (the class attribute is self.preflight)

    def facts(self, host_vars: dict) -> list:
        return preflight.engine_facts(preflight.engine_wanted(host_vars)) if self.preflight else []

    def before_hosts(self, hosts) -> None:
        """Every selected host's unit_settings, before anything runs (a bad key: exit 2)."""
        for h in hosts:
            try:
                units.unit_settings(mapping(h.vars.get("unit_settings"), "unit_settings"))
            except UserError as exc:
                raise UserError(f"{h.name}: {exc}") from None

    def check_host(self, ctx: HostContext) -> None:
        """Before any step prepares or changes anything: refuse the host when what the engine would start
        is not there (model, drafter of the profile's block size, disk) or a GPU needs a reset."""
        if not self.preflight:
            return
        bad = preflight.deploy_refusals(ctx.facts, ctx.vars, preflight.engine_wanted(ctx.vars))
        if bad:
            raise StepFailed("preflight: " + "; ".join(f"{c.name}: {c.detail}" for c in bad) + "; nothing was changed")

    def plan(self, ctx: HostContext) -> list[Change]:
        eh = EngineHost(ctx, self.params)
        unit, upath, epath, spath = eh.unit, eh.unit_path, eh.env_path, eh.secrets_path
        profile = eh.profile()
        env = eh.env()
        secret_text = launch.engine_launch(profile)[1]  # profile errors before any host access
        lab_path = eh.lab_module_path if eh.is_lab else None
        lab_text = lab_standin_text() if lab_path else None
        settings = units.unit_settings(mapping(ctx.vars.get("unit_settings"), "unit_settings"))
        settings = traffic.unit_settings(ctx, settings)  # TimeoutStopSec > drain_timeout

        cache = []  # the release's engine cache, once render knows the release

        def render(release_id):
            full = env
            if release_id:
                c, full = warmstart.cache_for(
                    ctx.vars,
                    warmstart.engine_version_for(ctx),
                    release_id,
                    launch.engine_argv(profile),
                    warmstart.gpus_of(ctx.facts),
                    env,
                )
                cache[:] = [c]
            return (
                units.render_unit({**settings, "profile": profile, "release_id": release_id, "env_file": epath}),
                units.render_env({"env": full}),
            )

        host, port = eh.target()
        api_key = eh.api_key()
        req = {
            "unit": unit,
            "unit_path": upath,
            "env_path": epath,
            "current": eh.layout.current,
            "lab_module": lab_path,
            "secrets_path": spath,
            "state_dir": ctx.state_dir,
        }
        release = ReleaseDecision.of(ctx)
        texts = render(release.release_id) if release.release_id else None
        ahead = looked_ahead(ctx, self, host, port)
        op, timeout = "read", 120.0
        if texts and ahead and not release.changed:
            # One agent call reads the host and, if it is already as planned, checks health and smoke too.
            op, timeout = "converge", 120.0 + ahead.pop("timeout")
            want = {
                "unit_sha": sha256(texts[0]),
                "env_sha": sha256(texts[1]),
                "secrets_sha": sha256(secret_text) if secret_text is not None else None,
                "lab_module_sha": sha256(lab_text) if lab_text is not None else None,
            }
            req.update(ahead, api_key=api_key, want=want)
        cur = agent(ctx.session, op, timeout=timeout, **req)
        if texts is None:
            texts = render(os.path.basename(cur["current"]) if cur["current"] else None)
        unit_text, env_text = texts
        refuse_foreign_unit(ctx, unit, upath, cur)
        secrets = eh.secrets(env, cur["env"], cur.get("secrets"))
        show = cur["show"]
        svc = ServiceState.build(
            eh, secrets=secrets, unit=unit, unit_path=upath, env_path=epath, port=port, show=show, secrets_path=spath
        ).put(ctx)
        svc.unsettled = bool(cur.get("prev_unsettled"))

        changes: list[Change] = []
        todo: dict = {}
        reasons = []
        plan_secret_config(spath, cur, secret_text, changes, todo, reasons)

        def verb(key: str) -> str:
            return "install" if cur[key] is None else "update"

        plan_file(
            cur,
            "unit",
            upath,
            unit_text,
            f"{verb('unit')} {upath} (checked with systemd-analyze verify first)",
            secrets,
            changes,
            todo,
            reasons,
        )
        if not plan_file(
            cur, "env", epath, env_text, f"{verb('env')} {epath} (mode 0600)", secrets, changes, todo, reasons
        ) and cur["env_mode"] not in (None, 0o600):
            changes.append(Change(f"chmod 0600 {epath} (was {cur['env_mode']:04o})"))
            todo["env_mode"] = True
        if lab_path and cur["lab_module_sha"] != sha256(lab_text):
            changes.append(Change(f"install lab engine stand-in as {lab_path}"))
            todo["lab_module_text"] = lab_text
            reasons.append("lab engine module")
        changes = plan_enable_and_restart(ctx, svc, show, unit, changes, todo, reasons)
        if cache:
            warmstart.WarmStart(cache=cache[0]).put(ctx)
            ctx.report["engine_cache"] = cache[0].to_json()
            if todo.get("restart") or todo.get("start"):
                todo["cache"] = cache[0].request(settings.get("user"))
        if cur.get("converged") and not changes:
            # what the health and smoke steps would have asked, already answered by the same call
            LookedAhead(poll=cur.get("poll"), poll_s=cur.get("poll_s"), smoke=cur.get("smoke")).put(ctx)
        return changes

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        svc = ServiceState.of(ctx)
        todo = svc.todo
        rehearse = ctx.options.rehearse  # deploy --rehearse: rehearsal.run.Gate, before the restart
        if rehearse and (todo.get("restart") or todo.get("start")):
            rehearse(ctx)
        ws = warmstart.WarmStart.of(ctx)
        if ws.cache is None and todo.get("env_text") and (todo.get("restart") or todo.get("start")):
            ws.cache = warmstart.cache_in_env(ctx.vars, todo["env_text"])  # a rollback's baseline env file
            if ws.cache:
                todo["cache"] = ws.cache.request()
        if todo.get("restart") or todo.get("start"):  # out of rotation and drained before any signal
            traffic.before_stop(ctx, svc, restart=bool(todo.get("restart")))
        ctx.progress(f"service: installing {svc.unit}")
        try:
            res = agent(
                ctx.session,
                "apply",
                timeout=700,
                unit=svc.unit,
                unit_path=svc.unit_path,
                env_path=svc.env_path,
                secrets_path=svc.secrets_path,
                state_dir=ctx.state_dir,
                lab_module=EngineHost(ctx).lab_module_path,
                port=svc.port,
                **todo,
            )
        except StepFailed:
            svc.changed = True  # it may have replaced files before it failed (a full disk): roll back
            raise
        if not res.get("ok"):
            if res.get("error") == "port":  # checked before anything was written
                raise StepFailed(
                    f"refusing to start {svc.unit}: "
                    f"{foreign_listener(svc.port, svc.unit, res['holder'], svc.secrets)}; nothing changed"
                )
            out = secret_policy.redact(res.get("output") or "", svc.secrets)
            if res.get("error") == "verify":
                lines = [l for l in out.splitlines() if l.strip()]
                raise StepFailed(
                    f"systemd-analyze verify rejected the new {svc.unit}; the installed unit "
                    f"was left in place: {' | '.join(lines[-3:])[:400]}"
                )
            svc.changed = True  # files may have been replaced: a later failure rolls back
            raise StepFailed(f"systemctl {res.get('error')} {svc.unit} failed: {' '.join(out.split())[-300:]}")
        svc.changed = True
        svc.restarted = bool(todo.get("restart") or todo.get("start"))
        if svc.restarted:  # the time to first good token counts from here (health and smoke finish it)
            ws.stop_at, ws.before = res.get("stop_at"), res.get("cache_before")
        show = res["show"]
        if svc.restarted:
            svc.base = run_identity(show)
        ctx.report["engine_restarted"] = svc.restarted

    def undo(self, ctx: HostContext) -> str | None:
        """The previous unit, env file and `current` in one agent call (the restart
        must run the previous release), when this run changed any of them."""
        svc = ServiceState.get(ctx)
        if svc is None or not svc.changed:  # the engine was not touched: the release step puts `current` back
            return None
        return rollback(ctx, svc)


# ---------------------------------------------------------------- rollback


def foreign_unit(unit: str, upath: str, text: str | None, show: dict) -> str | None:
    """Why the unit is not k26ops' to overwrite, or None: the file at `upath`
    lacks UNIT_MARKER, or systemd loads the unit from another file (ssh.service
    from /lib/systemd/system: a new file at `upath` would shadow it)."""
    frag = show.get("FragmentPath") or ""
    if text is not None and not text.startswith(units.UNIT_MARKER):
        return f"{upath} was not written by k26ops (its first line is not '{units.UNIT_MARKER}...')"
    if text is None and show.get("LoadState") == "loaded" and frag and frag != upath:
        return f"systemd already has {unit} from {frag}"
    return None


def refuse_foreign_unit(ctx: HostContext, unit: str, upath: str, cur: dict) -> None:
    """k26ops only overwrites units it made (foreign_unit): one line naming the host and unit."""
    why = foreign_unit(unit, upath, cur.get("unit"), cur.get("show") or {})
    if why:
        raise StepFailed(
            f"refusing engine_unit {unit}: {why}; k26ops only overwrites units it made: name another unit (engine_unit)"
        )


FILE_REASONS = {"unit": "unit", "env": "env file"}  # what a restart names for a replaced file


def plan_file(
    cur: dict,
    key: str,
    path: str,
    text: str,
    what: str,
    secrets: list[str],
    changes: list[Change],
    todo: dict,
    reasons: list[str],
) -> bool:
    """The unit's or env file's plan (`key` "unit" or "env", cur[key] its text on the host or None):
    when it differs from `text`, a change saying `what` with its redacted diff, the text for the
    agent's apply and the restart's reason; True if so. Deploy's and rollback's service steps."""
    if cur[key] == text:
        return False
    changes.append(Change(what, secret_policy.redact(text_diff(path, cur[key], text), secrets)))
    todo[f"{key}_text"] = text
    reasons.append(FILE_REASONS[key])
    return True


def plan_secret_config(
    spath: str, cur: dict, text: str | None, changes: list[Change], todo: dict, reasons: list[str]
) -> None:
    """The engine's secret-flags file (0600): installed, updated, chmod-ed or
    removed as the profile's secret flags say; its diff shows only which keys."""
    keys = ", ".join(line.split(":", 1)[0] for line in (text or "").splitlines()[1:])
    if text is not None and cur.get("secrets") != text:
        verb = "install" if cur.get("secrets") is None else "update"
        changes.append(Change(f"{verb} {spath} (mode 0600, root only: the engine reads {keys} with --config)"))
        todo["secrets_text"] = text
        reasons.append("secret flags")
    elif text is not None and cur.get("secrets_mode") not in (None, 0o600):
        changes.append(Change(f"chmod 0600 {spath} (was {cur['secrets_mode']:04o})"))
    elif text is None and cur.get("secrets") is not None:
        changes.append(Change(f"remove {spath} (no secret engine flags any more)"))
        todo["secrets_remove"] = True
        reasons.append("secret flags")


def plan_unit_run(
    show: dict, unit: str, changes: list[Change], todo: dict, reasons: list[str], start_note: str = ""
) -> None:
    """Enable the unit; restart it when `reasons` (what it runs changed) and it is up, else start it
    if it is down. The engine's and the gateway's service steps."""
    if show.get("UnitFileState") != "enabled":
        changes.append(Change(f"enable {unit}"))
        todo["enable"] = True
    active = show.get("ActiveState") in ("active", "activating", "reloading")
    if reasons and active:
        changes.append(Change(f"restart {unit} ({', '.join(reasons)} changed)"))
        todo["restart"] = True
    elif not active:
        changes.append(Change(f"start {unit} (was {show.get('ActiveState') or 'not installed'}{start_note})"))
        todo["start"] = True


def plan_enable_and_restart(
    ctx: HostContext, svc: ServiceState, show: dict, unit: str, changes: list[Change], todo: dict, reasons: list[str]
) -> list[Change]:
    """After the files are planned: enable the unit, and restart it only when
    something it runs changed (its files, the release); start it if it is down."""
    if ReleaseDecision.of(ctx).changed:
        reasons.append("release")
    # the agent resets the start limit before every start
    note = ": it hit systemd's start limit; systemctl reset-failed first" if start_limit_hit(show) else ""
    plan_unit_run(show, unit, changes, todo, reasons, start_note=note)
    svc.todo = todo
    svc.restart_reasons = reasons
    return changes


def rollback(ctx: HostContext, svc: ServiceState) -> str:
    """Put back the previous unit, env file and `current`, restart; a short phrase for the report."""
    release = ReleaseDecision.of(ctx)
    if not (svc.changed or release.changed or svc.unsettled):
        return "nothing to roll back (this run changed neither unit, env file nor release)"
    prev = release.previous if release.changed else None
    ctx.progress("rolling back to the previous unit, env file and release")
    try:
        res = agent(
            ctx.session,
            "rollback",
            timeout=700,
            unit=svc.unit,
            unit_path=svc.unit_path,
            env_path=svc.env_path,
            secrets_path=svc.secrets_path,
            state_dir=ctx.state_dir,
            current=ctx.layout.current,
            previous_release=prev,
        )
    except StepFailed as exc:
        return f"rollback failed: {exc}"
    if not res.get("ok"):
        return f"rollback failed: {res.get('error')}"
    if not res.get("had_unit"):
        return "no previous engine: the new unit was stopped and removed"
    # The previous engine is back; say whether it answers again.
    show = res["show"]
    base = run_identity(show)
    timeout = float(ctx.vars.get("rollback_health_timeout") or ctx.vars.get("health_timeout") or DEFAULT_HEALTH_TIMEOUT)
    w = wait_ready(
        ctx.session, svc.unit, svc.host, svc.port, base=base, timeout=timeout, secrets=svc.secrets, window=5.0
    )
    if w.state == "healthy":
        what = "unit, env file" + (" and release" if prev else "")
        return f"rolled back the {what}; the previous engine is healthy again"
    if w.state == "foreign":
        return "rolled back, but " + foreign_listener(svc.port, svc.unit, w.poll["holder"], svc.secrets)
    if w.state == "crashed":
        r = w.poll
        d, _msg, _tail = name_crash(ctx, svc, r, "after the rollback")
        return f"rolled back, but the previous engine crashed too ({r['why']}): {crash_label(d)}" + (
            f": {d.evidence[:200]}" if d.evidence else ""
        )
    return "rolled back, but the previous engine is not healthy yet"


# ---------------------------------------------------------------- naming a crash


def _classify(ctx: HostContext, text: str, bus_ids: dict | None = None):
    # lazy: the crash signatures (about 20 ms) only when the engine died
    from k26ops.diagnose.classify import classify

    prep = ReleaseDecision.of(ctx).prepared
    return classify(text, prep.recipe.base if prep else None, bus_ids)


def crash_label(d) -> str:
    """The signature of a dead engine's log (with the GPU for a hardware fault), or what its
    log lacked (signature None: no error line)."""
    gpu = (d.detail or {}).get("gpu") if d.signature == "gpu-hardware-fault" else None
    return (
        d.signature + (f" on GPU {gpu}" if gpu is not None else "")
        if d.signature
        else "no error in its log (an OOM kill or a signal leaves none: read the kernel log)"
    )


def crash_text(crash: dict, secrets) -> tuple[str, dict]:
    """The text a dead engine is named from: its journal, then the kernel's NVRM lines of the
    same time (the agent's crash report carries them: an Xid there is the cause, the engine's
    error its symptom), redacted; and the GPUs' bus ids -> index."""
    text = secret_policy.redact(crash.get("journal") or "", secrets)
    if crash.get("kernel"):
        text += ("\n" if text and not text.endswith("\n") else "") + secret_policy.redact(crash["kernel"], secrets)
    return text, {g["bus_id"]: g["index"] for g in parse_bus_ids(crash.get("bus_ids") or "")}


def name_crash(ctx: HostContext, svc: ServiceState, crash: dict, when: str):
    """A dead engine, named: (diagnosis, one-line message, journal tail), from
    the agent's crash report (why, unit state, the dead run's journal, the kernel's NVRM lines)."""
    text, bus_ids = crash_text(crash, svc.secrets)
    d = _classify(ctx, text, bus_ids)
    status = (crash.get("show") or {}).get("ExecMainStatus")
    msg = (
        f"{svc.unit} crashed {when} ({crash['why']}"
        + (f", exit status {exit_status_text(status)}" if status else "")
        + f"): {crash_label(d)}"
        + (f": {d.evidence[:240]}" if d.evidence else "")
    )
    tail = "\n".join(text.splitlines()[-40:])
    if crash.get("exit_line"):
        tail += "\n" + secret_policy.redact(crash["exit_line"], svc.secrets)
    return d, msg, tail


def journal_diagnosis(ctx: HostContext, svc: ServiceState, base: dict | None):
    """An engine that is alive but failing: its recent journal, and the crash it
    names if any (None when nothing known is in it)."""
    try:
        r = agent(ctx.session, "tail", unit=svc.unit, lines=400, invocation=(base or {}).get("InvocationID"))
    except StepFailed:
        return None, ""
    return known_crash(ctx, svc, r.get("journal"))


def known_crash(ctx: HostContext, svc: ServiceState, journal: str | None):
    """A living engine's journal: (the known crash it names or None, its redacted tail)."""
    text = secret_policy.redact(journal or "", svc.secrets)
    d = _classify(ctx, text) if text else None
    tail = "\n".join(text.splitlines()[-40:])
    return (d if d and d.signature not in (None, "unclassified") else None), tail


# ---------------------------------------------------------------- health


def fail_and_roll_back(ctx: HostContext, svc: ServiceState, message: str, journal: str = "", diag=None) -> None:
    ctx.progress(f"failed: {message}")
    back = rollback(ctx, svc)
    ctx.report["rollback"] = back
    raise EngineFailed(f"{message}; {back}", journal, diag, ctx.report)


def settle(ctx: HostContext, svc: ServiceState) -> None:
    """The installed unit and env file answered healthy: the prev/ copies stop being a killed
    run's to restore (one call, only after an install or when a killed one left it unsettled)."""
    if svc.changed or svc.unsettled:
        agent(ctx.session, "settle", state_dir=ctx.state_dir)
        svc.unsettled = False


class HealthStep(Step):
    """Wait until the engine answers /health and /health_generate; fail at once on a crash."""

    name = "health"
    fact_names = ()

    def plan(self, ctx: HostContext) -> list[Change]:
        if ctx.check:
            return []
        if not serves_http(ctx.vars):
            ctx.report["health"] = {"state": f"node rank {ctx.vars['node_rank']}: checked on rank 0", "wait_s": 0}
            return []
        svc = ServiceState.of(ctx, self.params)
        ahead = LookedAhead.of(ctx)
        early = ahead.poll or {}
        if early.get("state") == "healthy":  # the service step's converge call found it healthy
            svc.base = early["base"]
            settle(ctx, svc)
            el = float(ahead.poll_s or 0.0)
            ctx.progress(f"health: healthy after {el:.0f}s")
            ctx.report["health"] = {"state": "healthy", "wait_s": round(el, 2)}
            return []
        timeout = float(self.params.get("timeout") or ctx.vars.get("health_timeout") or DEFAULT_HEALTH_TIMEOUT)
        ws = warmstart.WarmStart.get(ctx) if svc.restarted else None
        w = wait_ready(
            ctx.session,
            svc.unit,
            svc.host,
            svc.port,
            base=svc.base,
            timeout=timeout,
            secrets=svc.secrets,
            window=self.window(),
            interruptible=True,
            request={"cache": ws.cache.request()} if ws and ws.cache else None,
            on_wait=lambda w: ctx.progress(
                f"health: {w.poll['state']} {w.elapsed:.0f}s" + (f": {w.last_line}" if w.last_line else "")
            ),
        )
        el, r, last = w.elapsed, w.poll, w.last_line
        if w.state == "interrupted":
            fail_and_roll_back(ctx, svc, f"interrupted (Ctrl-C, SIGTERM or SIGHUP) {el:.0f}s into the health wait")
        if w.state == "foreign":
            ctx.report["health"] = {"state": "foreign", "wait_s": round(el, 2), "holder": r["holder"]}
            fail_and_roll_back(ctx, svc, foreign_listener(svc.port, svc.unit, r["holder"], svc.secrets))
        if w.state == "healthy":
            svc.base = w.base  # the smoke step tells a crash from this run's MainPID
            if ws:
                ws.ready_at, ws.ready_cache = w.poll.get("at"), w.poll.get("cache")
            ctx.progress(f"health: healthy after {el:.0f}s")
            settle(ctx, svc)
            ctx.report["health"] = {"state": "healthy", "wait_s": round(el, 2)}
            return []
        if w.state == "crashed":
            d, msg, tail = name_crash(ctx, svc, r, f"{el:.1f}s into the health wait")
            ctx.report["health"] = {"state": "crashed", "wait_s": round(el, 2), "signature": d.signature}
            fail_and_roll_back(ctx, svc, msg, tail, d.to_json())
        ctx.report["health"] = {"state": "timeout", "wait_s": round(el, 2)}
        d, tail = journal_diagnosis(ctx, svc, w.base)
        fail_and_roll_back(
            ctx,
            svc,
            f"{svc.unit} not healthy after {timeout:.0f}s ({r['state']}, "
            f"/health {r.get('health')}; the engine is still running)"
            + (f"; last log line: {last}" if last else "")
            + (f"; its log names {d.signature}: {d.evidence[:200]}" if d else ""),
            tail,
            d.to_json() if d else None,
        )
        return []  # pragma: no cover - fail_and_roll_back raises

    def apply(self, ctx, changes):  # pragma: no cover - plan never returns changes
        pass

    def window(self) -> float:
        """Seconds one poll of the host waits for /health before it answers."""
        return float(self.params.get("window", 2.0))


# ---------------------------------------------------------------- smoke

SAMPLED = {"temperature": 0.7, "top_p": 0.9}


def smoke_requests(params: dict) -> list[dict]:
    """Greedy first, then sampled (temperature > 0 takes DDTree's other verify
    path); `sampled: false` in the step's params leaves the second out."""
    reqs = [{"name": "greedy", "sampling": {"temperature": 0}}]
    if params.get("sampled", True) is not False:
        sampled = {
            **SAMPLED,
            **mapping(params.get("sampled") if isinstance(params.get("sampled"), dict) else None, "smoke sampled"),
        }
        reqs.append({"name": "sampled", "sampling": sampled})
    return reqs


def smoke_record(res: dict) -> dict:
    """One answered smoke request as the report and the baseline keep it."""
    body = res["body"]
    meta = body.get("meta_info") or {}
    return {
        "ok": True,
        "sampling": res["sampling"],
        "latency_s": res["latency_s"],
        "spec_accept_length": meta.get("spec_accept_length"),
        "completion_tokens": meta.get("completion_tokens"),
        "text": body["text"][:80],
    }


def smoke_outcome(results: list[dict]) -> dict:
    """The greedy request's figures at the top (as before), each request under its name."""
    recs = {r["name"]: smoke_record(r) for r in results}
    first = recs[results[0]["name"]]
    return {**first, **recs}


def smoke_summary(s: dict) -> str:
    """`120 ms, accept 3.2` for the greedy request, then the sampled one's if it ran."""
    if s.get("latency_s") is None:
        return "-"
    out = f"{s['latency_s'] * 1000:.0f} ms, accept {s.get('spec_accept_length')}"
    t = s.get("sampled")
    if isinstance(t, dict) and t.get("latency_s") is not None:
        out += f"; T={t['sampling'].get('temperature')}: {t['latency_s'] * 1000:.0f} ms, accept {t.get('spec_accept_length')}"
    return out


def record_start(ctx: HostContext, ws: "warmstart.WarmStart", r: dict) -> None:
    """The restart's time to first good token and, with the release's cache, what it compiled:
    into the host's report (`ttfgt`, `warm_start`) and one progress line each."""
    st = r["startup"]
    at = {x["name"]: x.get("at") for x in r["results"]}
    t = warmstart.timeline(
        stop_at=ws.stop_at,
        started_at=st.get("started_at"),
        ready_at=ws.ready_at,
        greedy_at=at.get("greedy"),
        sampled_at=at.get("sampled"),
        log=st.get("log") or "",
        tz_offset=st.get("tz_offset") or 0,
        metrics=warmstart.parse_metrics(st.get("metrics")),
    )
    ctx.report["ttfgt"] = t
    ctx.progress(warmstart.summary(t))
    if ws.cache:
        cached = {x["name"]: x.get("cache") for x in r["results"]}
        c = warmstart.compiled(
            ws.before,
            [
                ("start", ws.ready_cache),
                ("first greedy answer", cached.get("greedy")),
                ("first sampled answer", cached.get("sampled")),
            ],
        )
        ctx.report["warm_start"] = {**c, "cache_dir": ws.cache.dir}
        ctx.progress(c["verdict"])
    # kept on the host for `bench` (its `@start` figures: compare, gate, snapshot --bench)
    rec = {
        "release": ReleaseDecision.of(ctx).release_id,
        "stop_at": ws.stop_at,
        "ttfgt": t,
        "warm_start": ctx.report.get("warm_start"),
    }
    ctx.session.put((json.dumps(rec, sort_keys=True) + "\n").encode(), ctx.layout.last_start_file, mode=0o600)


class SmokeStep(Step):
    """Greedy and sampled /generate must return text; record latency and spec_accept_length.
    A failed request is named: the engine died of it (its crash, classified) or
    it is alive and answered wrong (the HTTP status or the exception)."""

    name = "smoke"
    fact_names = ()

    def plan(self, ctx: HostContext) -> list[Change]:
        if ctx.check or not serves_http(ctx.vars):
            return []
        svc = ServiceState.of(ctx, self.params)
        r = LookedAhead.of(ctx).smoke  # answered by the service step's converge call
        ws = warmstart.WarmStart.get(ctx) if svc.restarted else None
        if r is None:
            body, timeout = self.request()
            if ws:  # a start this run made: its phases, and what it compiled per request
                body.update(startup=warmstart.STARTUP_REQUEST, **({"cache": ws.cache.request()} if ws.cache else {}))
            r = agent(
                ctx.session,
                "smoke",
                timeout=timeout,
                port=svc.port,
                host=svc.host,
                unit=svc.unit,
                base=svc.base,
                api_key=svc.api_key,
                **body,
            )
        if r["failed"]:
            self._failed(ctx, svc, r)
        rec = smoke_outcome(r["results"])
        ctx.report["smoke"] = rec
        if ws and r.get("startup"):
            record_start(ctx, ws, r)
        ctx.progress(
            "smoke: "
            + ", ".join(
                f"{k} {v['latency_s'] * 1000:.0f} ms accept {v['spec_accept_length']}"
                for k, v in rec.items()
                if isinstance(v, dict) and "latency_s" in v
            )
        )
        return []

    def request(self) -> tuple[dict, float]:
        """The engine agent's smoke request (without where and which run) and its time limit."""
        reqs = smoke_requests(self.params)
        # a cold engine's first sampled request JIT-builds sampling kernels: 102 s on an H200 (tests/data/rehearsal)
        per = float(self.params.get("timeout") or 300)
        body = {
            "prompt": str(self.params.get("prompt") or "Say hello in one short sentence."),
            "max_new_tokens": int(self.params.get("max_new_tokens") or 16),
            "timeout_s": per,
            "requests": reqs,
        }
        return body, per * len(reqs) + 30

    def _failed(self, ctx: HostContext, svc: ServiceState, r: dict) -> None:
        if r.get("foreign"):
            ctx.report["smoke"] = {
                "ok": False,
                "failed": r["failed"],
                "status": None,
                "crashed": False,
                "holder": r["foreign"],
            }
            fail_and_roll_back(ctx, svc, foreign_listener(svc.port, svc.unit, r["foreign"], svc.secrets))
        last = r["results"][-1]
        what = f"the {r['failed']} smoke request (temperature {last['sampling'].get('temperature')})"
        if r.get("crash"):
            d, msg, tail = name_crash(ctx, svc, r["crash"], f"on {what}")
            ctx.report["smoke"] = {
                "ok": False,
                "failed": r["failed"],
                "status": last["status"],
                "crashed": True,
                "signature": d.signature,
            }
            fail_and_roll_back(ctx, svc, msg, tail, d.to_json())
        body = last["body"]
        why = f"HTTP {last['status']}" if last["status"] else "no answer"
        detail = secret_policy.redact(
            json.dumps(body)[:200] if isinstance(body, dict) else str(body)[:200], svc.secrets
        )
        alive = r.get("alive") or {}
        d, tail = known_crash(ctx, svc, r.get("journal"))
        ctx.report["smoke"] = {"ok": False, "failed": r["failed"], "status": last["status"], "crashed": False}
        fail_and_roll_back(
            ctx,
            svc,
            f"{what} to /generate failed ({why}: {detail}); the engine did not die "
            f"(pid {alive.get('MainPID')}, {alive.get('state')})"
            + (f"; its log names {d.signature}: {d.evidence[:200]}" if d else ""),
            tail,
            d.to_json() if d else None,
        )

    def apply(self, ctx, changes):  # pragma: no cover
        pass
