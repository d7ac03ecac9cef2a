"""`k26ops diagnose` commands: name the crash in an SGLang log.

`log` works on a local file or stdin (no hosts). The remote workflows
(`service`, `cuda-graph`) build on `k26ops.diagnose.classify`.

Exit codes of `log` and `service`, for scripts: 0 a known crash was named (or
the log holds no error at all: "no crash found"), 1 an error (or, for
`service`, a crash) that matched no known signature, 2 bad input.
"""

from __future__ import annotations

import io
import sys
import time
from datetime import datetime

import click
from rich.console import Console
from rich.markup import escape

from k26ops.cli import jsonout, tables
from k26ops.cli.pipe import quiet
from k26ops.cli.report import run_and_report
from k26ops.diagnose import logread
from k26ops.engine import secret_policy
from k26ops.engine.host import EngineHost
from k26ops.engine.state import START_LIMIT, reset_hint, start_limit_hit
from k26ops.errors import EXIT_INTERRUPTED, UserError
from k26ops.release import patchset
from k26ops.shell import q
from k26ops.steps import session_context
from k26ops.transport.fleet import Connections, Outcome
from k26ops.transport.ssh import HostKeyRefused, Unreachable


@click.group(name="diagnose")
def group():
    """Recognise known SGLang crash signatures and say what to do."""


def _read(path: str):
    """The log, read in bounded memory and time (k26ops.diagnose.logread: its first and last
    MiBs, lines cut at 4 KiB): a logread.Read."""
    if path == "-":
        return logread.read_bounded(
            sys.stdin.buffer
            if hasattr(sys.stdin, "buffer")
            else io.BytesIO(sys.stdin.read().encode("utf-8", "replace"))
        )
    try:
        with open(path, "rb") as fh:
            return logread.read_bounded(fh)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a log file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None


def exit_code(d) -> int:
    """0: a known crash named, or no error at all; 1: an error no signature matched."""
    return 1 if d.signature == "unclassified" and d.error_found else 0


def _print_human(d) -> None:
    console = Console(highlight=False, soft_wrap=True)
    if not d.error_found:
        console.print(f"[bold green]no crash found[/]  {escape(d.suggestion)}")
        return
    colour = "yellow" if d.signature == "unclassified" else "red"
    console.print(f"[bold {colour}]{d.signature}[/]" + (f"  {escape(d.title)}" if d.title else ""))
    if d.evidence:
        at = f" (line {d.line})" if d.line else ""
        console.print(f"[bold]evidence{at}:[/] {escape(d.evidence)}")
    where = [f"{k} {v}" for k, v in (("rank", d.rank), ("phase", d.phase), ("algorithm", d.algorithm)) if v]
    if where:
        console.print(f"[bold]where:[/] {escape(', '.join(where))}")
    if d.detail:
        console.print("[bold]detail:[/] " + escape(", ".join(f"{k}={v}" for k, v in d.detail.items())))
    console.print(f"[bold]suggestion:[/] {escape(d.suggestion)}")


@group.command(name="log")
@click.argument("file", metavar="FILE|-")
@click.option(
    "--base",
    metavar="BASE",
    help="The engine base the log came from (sglang==VER or sglang@COMMIT): picks the fix that fits that code base.",
)
@click.pass_context
def log_cmd(ctx, file, base):
    """Classify a local SGLang log (a file, or - for stdin). Exit 0: a known crash
    named or no error at all; 1: an error that matched no known crash; 2: bad input."""
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose.classify import classify

    if base:
        try:
            patchset.parse_base(base)
        except patchset.PatchError as exc:
            raise UserError(f"--base: {exc}") from None
    got = _read(file)
    diagnosis = classify(got.text, base)
    diagnosis.line = got.input_line(diagnosis.line)
    note = got.note()
    settings = ctx.find_root().obj
    if getattr(settings, "as_json", False):
        jsonout.emit(
            {
                **diagnosis.to_json(),
                **(
                    {"read": {"note": note, "lines": got.lines, "left_out": got.left_out, "cut": got.cut}}
                    if note
                    else {}
                ),
            },
            exit_code(diagnosis),
            indent=2,
        )
    else:
        if note:
            click.echo(f"k26ops: {file}: {note}", err=True)
        _print_human(diagnosis)
    sys.exit(exit_code(diagnosis))


# ---------------------------------------------------------------- diagnose service


@group.command(name="service")
@click.option("--unit", metavar="NAME", help="Engine unit (default: inventory engine_unit, else k26-engine.service).")
@click.option(
    "--lines",
    type=click.IntRange(100, 1000000),
    default=20000,
    show_default=True,
    help="Journal entries searched per host for the last crash.",
)
@click.pass_obj
def service_cmd(settings, unit, lines):
    """Classify the engine's last crash on each host, from its journal. Exit 0: every
    crash named (or none found); 1: a crash matched no known signature, or a host
    failed; 2: bad input."""
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose import journal
    from k26ops.diagnose.classify import classify

    def work(session):
        ctx = session_context(session)
        eh = EngineHost(ctx, {"unit": unit})
        name = eh.unit
        r = journal.last_crash(session, name, lines=lines)
        show = r.get("show") or {}
        out = Outcome(
            unit=name,
            state=show.get("ActiveState") or "unknown",
            crashes=r.get("crashes", 0),
            start_limit_hit=start_limit_hit(show),
        )
        if out["start_limit_hit"]:  # systemd gave up restarting it: nothing starts it until reset-failed
            out["state"] = f"failed ({START_LIMIT})"
            out["start_limit"] = (
                f"{name} hit systemd's start limit ({show.get('NRestarts')} restarts, "
                f"Result={show.get('Result')}): {reset_hint(name)}"
            )
        if not r.get("invocation"):
            out.update(signature=None, crashed=False, summary="no crash in the journal")
            return out
        env = session.run(f"cat {q(eh.env_path)} 2>/dev/null").stdout
        secrets = eh.secrets(old_env_text=env)
        d = classify(secret_policy.redact(r.get("text") or "", secrets))
        when = None
        if r.get("ended_us"):
            when = datetime.fromtimestamp(int(r["ended_us"]) / 1e6).astimezone().isoformat(timespec="seconds")
        out.update(
            crashed=True,
            crashed_at=when,
            exit=r.get("why"),
            invocation=r["invocation"],
            current_invocation=bool(r.get("current")),
            **d.to_json(),
            summary=f"{d.signature}: {d.evidence[:120]}"
            if d.evidence
            else (d.signature or "no error in the crashed run's log"),
        )
        return out

    def render(results):
        con = Console(highlight=False, soft_wrap=True)
        for res in results:
            data = res.data
            if data.get("start_limit"):
                con.print(f"[bold]{res.host}[/]: {escape(data['start_limit'])}")
            if not data.get("crashed"):
                continue
            con.print(
                f"[bold]{res.host}[/]: last crash {data.get('crashed_at') or ''} ({escape(str(data.get('exit')))})"
            )
            # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
            from k26ops.diagnose.classify import Diagnosis

            fields = {k: data.get(k) for k in Diagnosis.__dataclass_fields__}
            _print_human(Diagnosis(**fields))

    def unnamed(results) -> int:
        return (
            1
            if any(r.data.get("crashed") and r.data.get("signature") in (None, "unclassified") for r in results)
            else 0
        )

    run_and_report(
        settings,
        work,
        title="engine: last crash",
        columns=[
            ("unit", "state"),
            ("crashed at", "crashed_at"),
            ("signature", "signature"),
            ("phase", "phase"),
            ("rank", "rank"),
        ],
        render=render,
        exit_with=unnamed,
    )


# ---------------------------------------------------------------- diagnose cuda-graph


@group.command(name="cuda-graph")
@click.option("--host", "host_name", required=True, metavar="HOST", help="The one host to probe.")
@click.option("--unit", metavar="NAME", help="Engine unit (default: inventory engine_unit, else k26-engine.service).")
@click.option("--force", is_flag=True, help="Probe even when the deployed files differ from the release manifest.")
@click.option(
    "--timeout",
    "ready_timeout",
    type=click.FloatRange(1),
    default=1800,
    show_default=True,
    help="Seconds to wait for the probed engine to be ready.",
)
@click.option(
    "--requests",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Requests sent to reach the speculative verify path.",
)
@click.option("-y", "--yes", is_flag=True, help="Restart a serving engine without asking.")
@click.option("-C", "--check", is_flag=True, help="Show what it would do; change nothing.")
@click.pass_obj
def cuda_graph_cmd(settings, host_name, unit, force, ready_timeout, requests, yes, check):
    """Apply the None-field probe, restart with CUDA graphs on, send a request,
    name the crash; always revert and restore the engine. A serving engine is
    restarted twice: asks first (-y: don't ask; no terminal to ask on: refused)."""
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose import probe

    inv, hosts = settings.select(host_name)
    if len(hosts) != 1:
        raise UserError(f"--host {host_name}: names {len(hosts)} hosts in {inv.path}; name exactly one host")
    host = hosts[0]
    err = tables.console(stderr=True, highlight=False)  # piped: progress lines never wrapped
    t0 = time.monotonic()
    last = {"msg": None, "t": 0.0}

    def progress(msg: str) -> None:
        now = time.monotonic()
        # the waits report every ~2s: on a terminal each, in a pipe when it changes or every 10s
        key = msg.split(":")[0] if msg.startswith("waiting") else msg
        if not err.is_terminal and key == last["msg"] and now - last["t"] < 10:
            return
        last.update(msg=key, t=now)
        err.print(f"[dim]{host.name} {now - t0:5.0f}s[/dim] {escape(msg)}", markup=True)

    progress = quiet(progress)  # a closed output interrupts the probe like Ctrl-C (k26ops.cli.pipe)

    # one host, driven here rather than by k26ops.orchestrate.rollout: the probe's restore keeps Ctrl-C
    # for itself (a signal handler, main thread only) until the engine is back
    try:
        session = Connections(settings.fleet_options()).session(host)
    except (Unreachable, HostKeyRefused) as exc:
        raise UserError(f"{host.name}: {exc}", exit_code=1) from None

    def confirm(plan: list[str], serving: bool) -> bool:
        if yes or not serving:
            return True
        if not sys.stdin.isatty():
            raise probe.Declined(
                f"{host.name}: the engine is serving and diagnose cuda-graph restarts it "
                "twice: pass -y to go ahead (--check shows the plan); nothing changed"
            )
        for line in plan:
            err.print(f"  {host.name}: {line}", markup=False)
        return click.confirm(f"{host.name}: restart the serving engine?", err=True, default=False)

    rep = None
    try:
        try:
            rep = probe.run_probe(
                session,
                host,
                unit=unit,
                force=force,
                ready_timeout=ready_timeout,
                requests=requests,
                progress=progress,
                check=check,
                confirm=confirm,
            )
        except KeyboardInterrupt as exc:
            click.echo(f"k26ops: interrupted; {host.name}: {_restore_line(exc)}", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except UserError:
            raise
        except Exception as exc:  # after restore: one line, never a traceback
            text = str(exc).strip().splitlines()
            raise UserError(
                f"{host.name}: diagnose cuda-graph failed: {text[0] if text else exc.__class__.__name__}"
                f" ({_restore_line(exc)})",
                exit_code=1,
            ) from None
    finally:
        session.close()
    if check:
        if settings.as_json:
            jsonout.emit(
                {
                    "host": rep.host,
                    "check": True,
                    "release": rep.release,
                    "canonical": rep.canonical,
                    "plan": rep.plan,
                    "hosts": {rep.host: {"release": rep.release, "plan": rep.plan}},
                },
                indent=2,
            )
        else:
            click.echo(f"{host.name}: would (nothing changed):")
            for line in rep.plan:
                click.echo(f"  {line}")
        sys.exit(0)
    if rep.interrupted:
        _print_probe(settings, rep, EXIT_INTERRUPTED)
        click.echo(f"k26ops: interrupted; {host.name}: probe reverted and engine restored", err=True)
        sys.exit(EXIT_INTERRUPTED)
    _print_probe(settings, rep, 1 if rep.restore_errors else 0)
    sys.exit(1 if rep.restore_errors else 0)


def _restore_line(exc) -> str:
    rep = getattr(exc, "probe_report", None)
    if rep is not None and rep.restore_errors:
        return "restore problem: " + "; ".join(rep.restore_errors)
    return "the probe was reverted and the engine restored"


def _print_probe(settings, rep, code: int) -> None:
    # lazy: the crash signatures and their tables (about 20-50 ms) only when a log is classified
    from k26ops.diagnose import probe
    from k26ops.diagnose.classify import Diagnosis

    if getattr(settings, "as_json", False):
        one = {k: rep.to_json().get(k) for k in ("release", "canonical", "crashed", "crash_when", "restore_errors")}
        jsonout.emit(
            {
                **rep.to_json(),
                "summary": probe.summary(rep),
                "hosts": {rep.host: {**one, "signature": (rep.diagnosis or {}).get("signature")}},
            },
            code,
            indent=2,
        )
        return
    con = Console(highlight=False, soft_wrap=True)
    con.print(
        f"[bold]{rep.host}[/]: release {rep.release}, " + ("canonical" if rep.canonical else "NOT canonical (--force)")
    )
    for note in rep.notes:
        con.print(f"  note: {escape(note)}")
    if rep.drift:
        con.print("  " + escape(probe.describe_drift(rep.drift)))
    con.print(f"[bold]result:[/] {escape(probe.summary(rep))}")
    if rep.crashed is not None:
        con.print(f"[bold]probe watched:[/] {escape(probe.watched_text(rep.watched))}")
    if rep.diagnosis:
        d = rep.diagnosis
        _print_human(Diagnosis(**{k: d.get(k) for k in Diagnosis.__dataclass_fields__}))
    con.print("[bold]restored:[/] " + escape("; ".join(rep.restored) or "nothing to restore"))
    for e in rep.restore_errors:
        con.print(f"[bold red]restore problem:[/] {escape(e)}")
