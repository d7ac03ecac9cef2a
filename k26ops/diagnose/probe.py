"""`k26ops diagnose cuda-graph --host H`: the seeds' None-field hunt in one command.

Under the host lock:
  (a) check that the deployed engine is canonical: the release's patched files
      against its manifest and its patch state (the release's own
      `patchset.py verify`); say which files differ; refuse unless forced;
  (b) apply the probe patch (patches/, tag `diagnose`) to the current release
      with its own state dir (<release>/probe-state), so the release's patch
      state is untouched; file mtimes are kept so existing .pyc stay valid;
  (c) restart the engine with CUDA graphs on: a runtime drop-in
      (/run/systemd/system/<unit>.d/, gone at reboot anyway) drops
      --disable-cuda-graph from ExecStart when the profile has it and keeps
      the probed run from writing bytecode; wait until ready with progress;
  (d) send /generate requests (every decode step runs DDTree's verify path);
  (e) collect the journal since the restart and classify it;
  (f) ALWAYS (finally: failure, timeout, Ctrl-C) remove the drop-in, revert the
      probe and put the engine back as it was (running: restarted on the
      canonical files and waited for; stopped: stopped);
  (g) report signature, field/index or sizes, phase, rank and the fix.

Every host-side action is one stdlib-only agent call (JSON in/out), like the
service step's agent.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from k26ops import resources
from k26ops.diagnose.classify import classify
from k26ops.diagnose.signatures import PROBE_WATCHED
from k26ops.engine import secret_policy
from k26ops.engine.host import EngineHost, wait_ready
from k26ops.engine.host import agent as engine_agent
from k26ops.engine.state import run_identity
from k26ops.errors import StepFailed, UserError
from k26ops.host.lock import HostLock, HostLocked
from k26ops.release import patchset
from k26ops.steps import session_context
from k26ops.traffic import drain as drain_mod
from k26ops.traffic.gateway import GatewayError
from k26ops.transport import agents

PATCHES = resources.path("patches")
PROBE_GUARD = "diagnose"


def probe_patch_for(base: str | None) -> Path:
    """The diagnose-tagged patch written for the deployed base (its `Base:` names it).

    Each base's series (patches/<base>/series) lists its own probe: the copy
    call sites of `_grouped_foreach_copy_` differ between engine code bases."""
    if not base:
        raise UserError(
            "the deployed release records no engine base (built before engine provenance): redeploy it, then probe"
        )
    want = patchset.parse_base(base)
    for series in sorted(PATCHES.glob("*/series")):
        for e in patchset.parse_series(series.read_text(), str(series)):
            if PROBE_GUARD not in e.guards:
                continue
            path = (series.parent / e.path).resolve()
            p = patchset.parse_patch(path.read_text(), e.path, e.strip)
            if any((b[0], b[1]) == want for b in p.bases):
                return path
    raise UserError(
        f"no probe patch is written for the deployed base {base} (none of patches/*/series has a "
        f"[{PROBE_GUARD}] patch whose Base: names it)"
    )


DROPIN_NAME = "zz-k26ops-probe.conf"
PROBE_STATE = "probe-state"
DEFAULT_READY_TIMEOUT = 1800.0
DEFAULT_REQUESTS = 3


class ProbeFailed(Exception):
    """The workflow could not run (the engine was restored); one line."""


def agent(session, op: str, timeout: float = 120.0, **req) -> dict:
    """One operation of agents/probe.py on the host."""
    try:
        return agents.run(session, "probe", op, timeout, what="host agent", **req)
    except agents.AgentFailed as exc:
        raise ProbeFailed(str(exc)) from None


# The ways a command line turns CUDA graphs off: --disable-cuda-graph, and 0.5.23's
# --cuda-graph-backend-decode/-prefill disabled (also as =disabled), which deprecate it.
_DISABLE = ("--disable-cuda-graph",)
_BACKEND_FLAGS = ("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill")


def _without_graph_off(words: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(words):
        w = words[i]
        if w in _DISABLE or any(w == f"{f}=disabled" for f in _BACKEND_FLAGS):
            i += 1
        elif w in _BACKEND_FLAGS and i + 1 < len(words) and words[i + 1] == "disabled":
            i += 2
        else:
            out.append(w)
            i += 1
    return out


def graphs_on_exec(unit_text: str | None) -> str | None:
    """The unit's ExecStart= without what turns CUDA graphs off (--disable-cuda-graph,
    --cuda-graph-backend-decode/-prefill disabled), or None when graphs are already on."""
    if not unit_text:
        return None
    lines = [ln for ln in unit_text.splitlines() if ln.strip().startswith("ExecStart=")]
    if not lines:
        return None
    value = lines[-1].strip()[len("ExecStart=") :]
    words = value.split(" ")
    kept = _without_graph_off(words)
    if kept == words:
        return None
    return " ".join(kept)


def watched_counts(text: str) -> dict | None:
    """What the probe says it checked (its `K26OPS-PROBE watched:` lines), the highest
    count per copy site over all ranks: {"fill_from": {graph: n}, "copy_slots": n,
    "slots_checked": n}; None when no such line (nothing instrumented was reached)."""
    found = False
    out: dict = {"fill_from": {}, "copy_slots": 0, "slots_checked": 0}
    for m in PROBE_WATCHED.finditer(text or ""):
        found = True
        for item in m.group("counts").split():
            key, _, value = item.partition("=")
            n = int(value)
            if key.startswith("fill_from[") and key.endswith("]"):
                graph = key[len("fill_from[") : -1]
                out["fill_from"][graph] = max(out["fill_from"].get(graph, 0), n)
            elif key in ("copy_slots", "slots_checked"):
                out[key] = max(out[key], n)
    return out if found else None


def dropin_text(exec_start: str | None) -> str:
    text = (
        "# k26ops diagnose cuda-graph: temporary (runtime) drop-in; removed when the probe ends.\n"
        "[Service]\n"
        "# The probed code must not leave bytecode in the release.\n"
        "Environment=PYTHONDONTWRITEBYTECODE=1\n"
    )
    if exec_start is not None:
        text += (
            "# CUDA graphs on: the unit's command line without --disable-cuda-graph / "
            "--cuda-graph-backend-*=disabled.\nExecStart=\n"
        )
        text += f"ExecStart={exec_start}\n"
    return text


@dataclass
class ProbeReport:
    host: str
    release: str | None = None
    canonical: bool | None = None
    drift: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    graphs_enabled_by_dropin: bool = False
    ready_s: float | None = None
    crashed: bool | None = None
    crash_when: str | None = None  # "startup" / "request"
    request_error: str | None = None  # a request failed but the engine lived
    diagnosis: dict | None = None
    watched: dict | None = None  # the probe's own count of the copies it checked
    restored: list = field(default_factory=list)
    restore_errors: list = field(default_factory=list)
    engine_after: dict = field(default_factory=dict)
    interrupted: bool = False
    plan: list = field(default_factory=list)  # --check: what would be done
    traffic: dict | None = None  # the drain around the restart (k26ops.traffic.drain), where the host drains

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def run_probe(
    session,
    host,
    *,
    unit: str | None = None,
    force: bool = False,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    requests: int = DEFAULT_REQUESTS,
    progress: Callable[[str], None] = lambda m: None,
    check: bool = False,
    confirm: Callable[[list[str], bool], bool] | None = None,
) -> ProbeReport:
    """The whole workflow on one host (caller holds the session). Raises
    UserError for a refusal before anything changed; ProbeFailed /
    KeyboardInterrupt after restoring; returns the report.
    check=True: only the read-only checks and the plan (rep.plan); nothing changes.
    confirm(plan, serving) is asked after the read-only checks, before any
    change; False raises Declined."""
    ctx = session_context(session)
    eh = EngineHost(ctx, {"unit": unit})
    uname = eh.unit
    ehost, port = eh.target()
    epath = eh.env_path
    rep = ProbeReport(host=host.name)
    if check or confirm:
        st = _checked(session, host, rep, uname, ctx, epath, force, progress, dry=True)
        serving = st["show"].get("ActiveState") in ("active", "activating", "reloading")
        rep.plan = plan(rep, uname, serving, requests)
        if check:
            return rep
        if not confirm(rep.plan, serving):
            raise Declined(f"{host.name}: not confirmed; nothing changed")
        rep.notes = []
    lock = HostLock(session, ctx.state_dir, "diagnose cuda-graph")
    try:
        lock.acquire()
    except HostLocked as exc:
        raise UserError(f"{host.name}: {exc}") from None
    try:
        st = _checked(session, host, rep, uname, ctx, epath, force, progress)
        patch_text = st["patch_text"]
        show = st["show"]
        was_active = show.get("ActiveState") in ("active", "activating", "reloading")
        secrets = eh.secrets(old_env_text=st.get("env"))
        exec_start = graphs_on_exec(st["unit_text"])
        rep.graphs_enabled_by_dropin = exec_start is not None
        try:
            _workflow(
                ProbeRun(
                    session=session,
                    rep=rep,
                    st=st,
                    unit=uname,
                    host=ehost,
                    port=port,
                    patch_text=patch_text,
                    exec_start=exec_start,
                    was_active=was_active,
                    secrets=secrets,
                    ready_timeout=ready_timeout,
                    requests=requests,
                    progress=progress,
                    classify=classify,
                    api_key=eh.api_key(),
                    drain=drain_mod.for_session(session, progress),
                )
            )
        except BaseException as exc:  # restored already; let the caller say how the restore went
            exc.probe_report = rep
            raise
        return rep
    finally:
        lock.release()


class Declined(UserError):
    """The operator said no (or could not be asked); nothing changed."""

    def __init__(self, message: str):
        super().__init__(message, exit_code=1)


def _checked(session, host, rep, uname, ctx, epath, force, progress, dry: bool = False) -> dict:
    """The host agent's prepare (dry: change nothing) and the refusals before any change."""
    progress("checking the deployed engine is canonical")
    st = agent(
        session,
        "prepare",
        unit=uname,
        releases=ctx.releases_root,
        env_path=epath,
        dropin=DROPIN_NAME,
        probe_state=PROBE_STATE,
        dry=dry,
    )
    if not st.get("ok"):
        raise UserError(f"{host.name}: {st.get('error')}")
    rep.release, rep.notes, rep.drift = st["release_id"], st["notes"], st["drift"]
    probe_path = probe_patch_for(st.get("base"))
    try:
        st["patch_text"] = probe_path.read_text()
    except OSError as exc:
        raise UserError(f"{probe_path}: cannot read the probe patch: {exc.strerror}") from None
    rep.canonical = not st["drift"]
    if st["drift"] and not force:
        raise UserError(
            f"{host.name}: the deployed engine is not canonical (release {st['release_id']}): "
            + describe_drift(st["drift"])
            + "; redeploy, or pass --force to probe it anyway"
        )
    if st["show"].get("LoadState") != "loaded" or not st.get("unit_text"):
        raise UserError(f"{host.name}: {uname} is not installed (deploy first)")
    return st


def plan(rep, uname: str, serving: bool, requests: int) -> list[str]:
    """What the probe will do to the host, in order (shown by --check and before asking)."""
    return [
        *rep.notes,
        f"apply the None-field probe to release {rep.release}",
        f"restart {uname} with CUDA graphs on"
        + (" (it is serving now: its requests fail until restored)" if serving else ""),
        f"send up to {requests} request(s) to reach the speculative verify path; name any crash",
        "revert the probe, then " + (f"restart {uname} as deployed" if serving else f"stop {uname} again"),
    ]


def describe_drift(drift: list) -> str:
    parts = []
    for d in drift[:6]:
        if d.get("actual") is None:
            what = "missing"
        elif d.get("probe"):
            what = "has the K26OPS-PROBE probe in it"
        else:
            what = f"sha256 {str(d['actual'])[:12]}, expected {str(d.get('expected'))[:12]}"
        parts.append(f"{d['path']} ({what})")
    more = f" and {len(drift) - 6} more" if len(drift) > 6 else ""
    return f"{len(drift)} file(s) differ from the release manifest: " + ", ".join(parts) + more


@dataclass
class ProbeRun:
    """One probe's inputs, read before any change (run_probe) and passed whole to the workflow
    and its restore."""

    session: Any
    rep: ProbeReport
    st: dict  # the host agent's prepare answer (release, site, base, unit text, env ...)
    unit: str
    host: str  # where the engine answers (EngineHost.target)
    port: int
    patch_text: str
    exec_start: str | None  # the drop-in's ExecStart= when the unit turns CUDA graphs off
    was_active: bool
    secrets: list
    ready_timeout: float
    requests: int
    progress: Callable[[str], None]
    classify: Callable
    api_key: str | None = None
    drain: Any = None  # traffic.drain.Drain, or None where the host does not drain

    def ready_wait(self, base: dict, journal_lines: int, on_wait):
        """The engine's ready-wait after a restart of this probe (or of its restore); `base` the
        restarted run's identity (engine.state.run_identity)."""
        return wait_ready(
            self.session,
            self.unit,
            self.host,
            self.port,
            base=base,
            timeout=self.ready_timeout,
            secrets=self.secrets,
            journal_lines=journal_lines,
            on_wait=on_wait,
        )


def _workflow(run: ProbeRun) -> None:
    session, rep, st, uname, ehost, port = run.session, run.rep, run.st, run.unit, run.host, run.port
    patch_text, exec_start, was_active, secrets = run.patch_text, run.exec_start, run.was_active, run.secrets
    ready_timeout, requests, progress, classify = run.ready_timeout, run.requests, run.progress, run.classify
    api_key, drain = run.api_key, run.drain
    restarted = False
    try:
        progress(f"applying the probe patch to release {st['release_id']}")
        res = agent(
            session,
            "apply_probe",
            release=st["release"],
            site=st["site"],
            patch_text=patch_text,
            probe_state=PROBE_STATE,
            base=st.get("base"),
        )
        if not res.get("ok"):
            raise ProbeFailed(f"the probe patch does not apply to release {st['release_id']}: {res.get('error')}")
        if was_active and drain is not None:  # out of rotation and drained before the restart
            drain.take_out()
        progress(
            "restarting the engine with CUDA graphs on"
            + (" (temporary drop-in without --disable-cuda-graph)" if exec_start else "")
        )
        r = agent(session, "restart", timeout=700, unit=uname, dropin=DROPIN_NAME, dropin_text=dropin_text(exec_start))
        restarted = True
        cursor = r.get("cursor")
        if not r.get("ok"):
            raise ProbeFailed(
                f"systemctl restart {uname} failed: {secret_policy.redact(r.get('error') or '', secrets)}"
            )
        base = run_identity(r["show"])
        crashed = None
        w = run.ready_wait(
            base,
            50,
            lambda w: progress(
                f"waiting for ready: {w.poll['state']} {w.elapsed:.0f}s" + (f": {w.last_line}" if w.last_line else "")
            ),
        )
        el, last = w.elapsed, w.last_line
        if w.state == "healthy":
            rep.ready_s = round(el, 1)
            progress(f"ready after {el:.0f}s")
        elif w.state == "crashed":
            crashed, rep.crash_when = w.poll.get("why"), "startup"
            progress(f"engine crashed while starting ({crashed}) after {el:.0f}s")
        else:
            raise ProbeFailed(
                f"{uname} not ready after {ready_timeout:.0f}s with the probe "
                f"({w.poll['state']})" + (f"; last log line: {last}" if last else "")
            )
        if crashed is None:
            for n in range(1, requests + 1):
                progress(f"request {n}/{requests}: /generate (speculative verify path)")
                r = engine_agent(
                    session,
                    "smoke",
                    timeout=200,
                    port=port,
                    host=ehost,
                    unit=uname,
                    base=base,
                    api_key=api_key,
                    prompt="Write a short poem about CUDA graphs.",
                    max_new_tokens=32,
                    timeout_s=120.0,
                )
                if r.get("crash"):  # the agent waited for the unit to show the death
                    crashed, rep.crash_when = r["crash"]["why"], "request"
                    progress(f"engine crashed on request {n} ({crashed})")
                    break
                if r.get("failed"):
                    last = r["results"][-1]
                    why = f"HTTP {last['status']}" if last["status"] else f"no answer: {str(last['body'])[:160]}"
                    rep.request_error = f"request {n} failed ({why}); the engine did not die"
                    progress(rep.request_error)
                    break
        rep.crashed = crashed is not None
        progress("collecting the journal since the restart")
        j = agent(session, "journal", unit=uname, cursor=cursor)
        text = secret_policy.redact(j.get("text") or "", secrets)
        d = classify(text, st.get("base"))
        rep.watched = watched_counts(text)
        if crashed is None and d.signature in (None, "unclassified"):
            rep.diagnosis = None
        else:
            rep.diagnosis = d.to_json()
    finally:
        _restore(run, restarted)


def _restore(run: ProbeRun, restarted: bool):
    """Drop-in out, probe reverted, engine back as it was; Ctrl-C waits for this (restarted: the
    probe restarted the engine; only then does its drain put it back into rotation)."""
    session, rep, st, uname = run.session, run.rep, run.st, run.unit
    was_active, secrets, progress = run.was_active, run.secrets, run.progress
    drain = run.drain if restarted else None
    interrupted = []
    old = None
    try:
        old = signal.signal(signal.SIGINT, lambda *a: interrupted.append(True))
    except ValueError:  # not the main thread
        pass
    try:
        progress(
            "restoring: removing the drop-in, reverting the probe"
            + (", restarting the engine" if was_active and restarted else "")
        )
        try:
            r = agent(
                session,
                "restore",
                timeout=700,
                unit=uname,
                dropin=DROPIN_NAME,
                release=st["release"],
                site=st["site"],
                probe_state=PROBE_STATE,
                was_active=was_active and restarted,
                stop=restarted and not was_active,
            )
        except ProbeFailed as exc:
            rep.restore_errors.append(str(exc))
            return
        rep.restored = r.get("done", [])
        rep.restore_errors += [secret_policy.redact(e, secrets) for e in (r.get("errors") or [])]
        if r.get("error"):
            rep.restore_errors.append(secret_policy.redact(r["error"], secrets))
        show = r.get("show") or {}
        if was_active and restarted and r.get("ok"):
            w = run.ready_wait(
                run_identity(show),
                30,
                lambda w: progress(f"restoring: waiting for the engine: {w.poll['state']} {w.elapsed:.0f}s"),
            )
            if w.state == "healthy":
                rep.restored.append(f"the engine is healthy again ({w.elapsed:.0f}s)")
                if drain is not None:  # back into rotation only once the restored engine answers
                    try:
                        drain_mod.smoke_before_put_back(drain, session, uname)
                        drain.put_back()
                        rep.restored.append("back in rotation")
                    except (StepFailed, GatewayError) as exc:
                        rep.restore_errors.append(f"not put back in rotation: {exc}")
                    rep.traffic = drain.record
            elif w.state == "crashed":
                rep.restore_errors.append(f"the restored engine crashed: {w.poll.get('why')}")
            else:
                rep.restore_errors.append(f"the restored engine is not healthy after {w.elapsed:.0f}s")
            show = w.poll.get("show") or show
        rep.engine_after = {"ActiveState": show.get("ActiveState"), "SubState": show.get("SubState")}
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
        if interrupted:
            rep.interrupted = True


GRAPH_PATHS = ("verify", "draft")  # the speculative graphs the probe is for


def watched_text(w: dict | None) -> str:
    """`fill_from[verify] 12, fill_from[draft] 12, copy_slots 0`: what the probe checked."""
    if not w:
        return "nothing"
    parts = [f"fill_from[{g}] {n}" for g, n in sorted(w["fill_from"].items())]
    return ", ".join(parts + [f"copy_slots {w['copy_slots']}"])


def summary(rep: ProbeReport) -> str:
    """One line: what the probe found, and for no crash what it watched (never an
    all-clear for copies it did not see)."""
    d = rep.diagnosis
    if not d:
        if rep.request_error:
            return f"no crash signature found; {rep.request_error}"
        if rep.crashed is False:
            w = rep.watched
            seen = {g: n for g, n in ((w or {}).get("fill_from") or {}).items() if n > 0}
            graph = {g: n for g, n in seen.items() if g in GRAPH_PATHS}
            if graph:
                unseen = [g for g in GRAPH_PATHS if g not in graph]
                return (
                    "no crash: with CUDA graphs on and the probe applied, no None or wrongly sized input "
                    f"reached the copies it watched ({watched_text(w)})"
                    + (
                        f"; the {' and '.join(unseen)} graph's fill was not seen, so it was not checked"
                        if unseen
                        else ""
                    )
                )
            if w is None:
                return (
                    "not checked: the engine served without a crash, but the probe reported no watched copy "
                    "(no `K26OPS-PROBE watched:` line): the requests never reached the graph-buffer fill it "
                    "instruments (fill_from, copy_slots), so the path that served was not checked"
                )
            return (
                f"not checked: the engine served without a crash, but the probe watched only {watched_text(w)}, "
                "none on the draft or verify graph path; that path was not checked"
            )
        return "no crash signature found"
    det = d.get("detail") or {}
    if d["signature"] == "cuda-graph-none-field" and det.get("field"):
        where = f" ({det.get('side', 'src')}[{det['index']}])" if "index" in det else ""
        if det.get("graph"):
            where = f" ({det['graph']} graph, {det.get('copy') or 'buffer copy'})"
        return f"{d['signature']}: `{det['field']}`{where} was None"
    if d["signature"] == "cuda-graph-shape-mismatch" and "got" in det:
        what = f" `{det['field']}` ({det['graph']} graph)" if det.get("field") and det.get("graph") else ""
        return f"{d['signature']}:{what} size {det['got']} vs {det['expected']}"
    return d["signature"]
