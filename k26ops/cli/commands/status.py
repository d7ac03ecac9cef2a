"""`k26ops status` and `k26ops logs`: the engine's unit on each host; change nothing."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone

import click
from rich.console import Console

from k26ops.cli import jsonout, logview
from k26ops.cli.report import run_and_report
from k26ops.engine import secret_policy
from k26ops.engine.host import EngineHost, agent, foreign_listener
from k26ops.engine.state import EngineState, engine_state
from k26ops.errors import UserError
from k26ops.facts import xid
from k26ops.host import preflight
from k26ops.orchestrate import rollout
from k26ops.rehearsal import plan as rehearsal_plan
from k26ops.steps import HostContext, session_context
from k26ops.transport.fleet import Connections, Outcome


def _target(ctx: HostContext, unit: str | None):
    eh = EngineHost(ctx, {"unit": unit})
    host, port = eh.target()
    return eh, eh.unit, host, port


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@click.command(name="status")
@click.option("--unit", metavar="NAME", help="Engine unit (default: inventory engine_unit, else k26-engine.service).")
@click.option(
    "--baselines",
    "baselines_dir",
    metavar="DIR",
    envvar="K26OPS_BASELINES",
    help="Baselines repository to compare with (default: $K26OPS_BASELINES, else the config file's, else ~/.local/share/k26ops/baselines).",
)
@click.option(
    "--verify",
    "verify_full",
    is_flag=True,
    help="Read every file of the current release against its wheels' RECORD (sha256); "
    "by default only sizes and mtimes are compared.",
)
@click.pass_obj
def status_cmd(settings, unit, baselines_dir, verify_full):
    """Per host: what the engine is (serving, starting, stopped, failed, crash-looping), health,
    release, uptime, model, last restart; and drift: which tagged baseline runs, or which files
    differ from the release manifest. Exit 1 when an enabled engine does not serve."""
    # lazy: the baselines package (about 60 ms) only when a baseline is compared
    from k26ops.baselines import drift as drift_mod

    index = drift_mod.load_index(baselines_dir, warn=lambda line: click.echo(f"k26ops: warning: {line}", err=True))

    def work(session):
        ctx = session_context(session)
        eh, name, host, port = _target(ctx, unit)
        r = agent(
            session,
            "status",
            unit=name,
            port=port,
            host=host,
            current=eh.layout.current,
            api_key=eh.api_key(),
            kernel=xid.XID_COMMAND,
            weights_record=_weights_record(session.host.vars),
            rehearsal_record=rehearsal_plan.record_path(eh.layout.state_dir),
        )
        show = r["show"]
        active = show.get("ActiveState")
        started = show.get("ExecMainStartTimestampMonotonic") or 0
        uptime = (r["now_monotonic_us"] - started) / 1e6 if active == "active" and started else None
        health = r.get("health")
        es = engine_state(show, health, uptime, name)
        stamp = show.get("ExecMainStartTimestamp") or ""
        parts = stamp.split() if active in ("active", "activating", "reloading") else []  # a dead run's is stale
        try:  # one more call: patched files vs the release manifest, and vs the tagged baselines
            d = drift_mod.host_drift(
                session,
                ctx.releases_root,
                eh.unit_path,
                eh.env_path,
                index,
                state_dir=eh.layout.state_dir,
                verify="full" if verify_full else "cheap",
            )
        except Exception as exc:  # drift is advisory: never fail `status` for it
            d = {"error": str(exc).splitlines()[0][:200]}
        d = drift_mod.with_engine(d, r.get("engine_releases"))
        if r.get("foreign"):  # another process holds the engine's port: nothing was asked of it
            es = EngineState("unhealthy", True, foreign_listener(port, name, r["foreign"], eh.secrets()))
        return Outcome(
            drift=d,
            baseline=drift_mod.describe(d),
            engine=d.get("engine"),
            rehearsal_left=r.get("rehearsal_left") or None,
            unit=name,
            state=active or "unknown",
            substate=show.get("SubState"),
            engine_state=es.state,
            engine_detail=es.detail,
            engine_label=es.label(),
            should_serve=es.should_serve,
            serving_ok=es.ok,
            result=show.get("Result") or None,
            enabled=show.get("UnitFileState") or None,
            health=(
                "FOREIGN LISTENER"
                if r.get("foreign")
                else "healthy"
                if health == 200
                else f"HTTP {health}"
                if health
                else "no answer"
                if health == 0
                else "-"
            ),
            release=r["current"].rsplit("/", 1)[-1] if r.get("current") else None,
            uptime_s=round(uptime, 1) if uptime is not None else None,
            uptime=_ago(uptime),
            model=r.get("model"),
            model_short=(r.get("model") or "").rstrip("/").rsplit("/", 1)[-1] or None,
            port=port,
            pid=show.get("MainPID") or None,
            restarts=show.get("NRestarts"),
            last_start=stamp or None,
            gpu_xid=xid_lines(xid.since_engine_start(r)),
            weights=r.get("weights"),
            weights_short=_weights_short(r.get("weights")),
            started=" ".join(parts[1:3]) if len(parts) >= 3 else None,
        )

    def not_serving(results) -> list:
        return [r for r in results if r.data and r.data.get("serving_ok") is False]

    def render(results):
        """A new Xid since the engine started, per host; then one line per engine that
        should serve and does not (after the table)."""
        for res in results:
            for line in (res.data or {}).get("gpu_xid") or []:
                click.echo(f"  {res.host}: {line}")
        for r in not_serving(results):
            click.echo(f"k26ops: {r.host}: {r.data['unit']} should serve but is {r.data['engine_label']}", err=True)
        for r in results:
            if (r.data or {}).get("rehearsal_left"):
                click.echo(
                    f"k26ops: {r.host}: a rehearsal's engine or temp dir is there ({', '.join(r.data['rehearsal_left'])}): "
                    "a rehearsal running now, or a killed one's, which the next `rehearse` removes",
                    err=True,
                )

    def drifted(results) -> list:  # a release's bytes changed (a probe left applied, an edit): not canonical
        return [r for r in results if r.data and (r.data.get("drift") or {}).get("drifted_files")]

    run_and_report(
        settings,
        work,
        title="engine status",
        render=render,
        exit_with=lambda results: 1 if not_serving(results) or drifted(results) else 0,
        host_status=host_status,
        columns=[
            ("engine", "engine_state"),
            ("health", "health"),
            ("release", "release"),
            ("baseline / drift", "baseline"),
            ("uptime", "uptime"),
            ("model", "model_short"),
            ("weights", "weights_short"),
            ("restarts", "restarts"),
            ("started", "started"),
        ],
    )


def _weights_record(host_vars) -> str | None:
    """Where the host keeps its model verify record, for a recipe with a model manifest."""
    try:
        w = preflight.engine_wanted(host_vars).get("weights")
    except UserError:  # a recipe that does not load: status still shows the engine
        return None
    return w["record"] if w else None


def _weights_short(w: dict | None) -> str | None:
    """'902d9251 full 2026-12-07T12:00:00Z': the release's model manifest, the last full verify
    (and the manifest it checked, when another)."""
    if not w:
        return None
    rel, last = w.get("release_manifest"), w.get("last_full") or {}
    text = (rel[:8] if rel else "-") + " " + (f"full {last['at']}" if last.get("at") else "never fully verified")
    if last.get("manifest") and rel and last["manifest"] != rel:
        text += f" (of {last['manifest'][:8]})"
    return text


def host_status(result) -> str | None:
    """A host whose enabled engine does not serve is not `ok`: its status is the engine's state
    (stopped, failed, crash-looping, starting, unhealthy, stopping), the one vocabulary of the
    engine column, so the table, the summary line and `--json`'s host status all say it."""
    data = result.data or {}
    return data.get("engine_state") if data.get("serving_ok") is False else None


def xid_lines(events: list[dict]) -> list[str]:
    """One line per GPU and Xid the running engine has lived through (the kernel log since the
    unit became active): 'new since the engine started: GPU 0 (0000:18:00) Xid 79 GPU has fallen
    off the bus ... at 03:05:37; action: reboot: ...'."""
    out = []
    for e in xid.distinct(events):
        at = datetime.fromtimestamp(e["time"], timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        out.append(
            f"new since the engine started: {xid.who(e)} {xid.label(e)} {e.get('meaning') or e.get('message')} "
            f"at {at}; action: {e['action']}: {xid.ACTION_TEXT[e['action']]}"
        )
    return out


@click.command(name="logs")
@click.option(
    "-n", "--lines", type=click.IntRange(1, 100000), default=50, show_default=True, help="Journal lines per host."
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C stops).")
@click.option("--unit", metavar="NAME", help="Engine unit (default: inventory engine_unit, else k26-engine.service).")
@click.option(
    "--since", metavar="TIME", help="From this time on (journalctl's: '1h ago', '2026-12-01 10:00', 'today')."
)
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression.")
@click.option("--all", "show_all", is_flag=True, help="Also k26ops' own health and smoke requests (hidden by default).")
@click.option("--interval", type=click.FloatRange(0.2), default=1.0, hidden=True)
@click.pass_obj
def logs_cmd(settings, lines, follow, unit, since, pattern, show_all, interval):
    """The engine's journal on each host (secrets redacted; k26ops' own requests hidden)."""
    matches = logview.grep(pattern)
    hosts = settings.selected_hosts()
    prefix = len(hosts) > 1
    cursors: dict[str, str | None] = {}
    secrets: dict[str, list[str]] = {}
    out = Console(soft_wrap=True, highlight=False)

    def work(session):
        name = session.host.name
        ctx = session_context(session)
        eh, uname, _host, _port = _target(ctx, unit)
        cut = not cursors.get(name) and not since  # -n: the last N lines *shown*, after hiding and --grep
        ask = lines
        while True:
            first = name not in secrets
            r = agent(
                session,
                "logs",
                unit=uname,
                lines=ask,
                cursor=cursors.get(name),
                since=since,
                env_path=eh.env_path,
                with_env=first,
            )
            if r.get("error"):
                raise RuntimeError(r["error"])
            if first:
                secrets[name] = eh.secrets(old_env_text=r.get("env"))
            shown = [
                line
                for line in (
                    secret_policy.redact(logview.drop_hostname(line), secrets[name])
                    for line in r["lines"]
                    if show_all or not logview.own_request(line)
                )
                if matches(line)
            ]  # grep after redaction
            if not cut or len(shown) >= lines or len(r["lines"]) < ask or ask >= logview.MAX_LINES_ASKED:
                break
            ask = min(ask * 8, logview.MAX_LINES_ASKED)  # hidden lines took the place of shown ones
        cursors[name] = r.get("cursor") or cursors.get(name)
        return Outcome(lines=shown[-lines:] if cut else shown)

    conns = Connections(settings.fleet_options())  # each host's one connection, kept while following
    failed = False
    doc: dict[str, dict] = {}  # --json without -f: one document at the end
    try:
        while True:
            run = rollout.run(hosts, work, settings.fleet_options(), connections=conns)
            if run.interrupted:
                break
            logview.check_since(since, run.results)
            for res in run.results:
                if res.status not in ("ok", "changed"):
                    failed = True
                    doc[res.host] = {"status": res.status, "error": res.error, "lines": []}
                    click.echo(f"k26ops: {res.host}: {res.status}: {res.error}", err=True)
                    continue
                if settings.as_json and follow:  # NDJSON: a record only for new lines
                    if res.data["lines"]:
                        click.echo(json.dumps({"host": res.host, "lines": res.data["lines"]}, ensure_ascii=False))
                    continue
                if settings.as_json:
                    doc[res.host] = {"status": "ok", "error": None, "lines": res.data["lines"]}
                    continue
                for line in res.data["lines"]:
                    out.print(f"[bold]{res.host}[/bold] | " if prefix else "", end="", markup=True)
                    out.print(line, markup=False)
            if not follow or failed:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        conns.close()
    if settings.as_json and not follow:
        jsonout.emit({"hosts": doc}, 1 if failed else 0)
    sys.exit(1 if failed else 0)
