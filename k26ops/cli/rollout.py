"""A rollout on the command line: progress board, results table or JSON,
journal tails, the stop line and the exit code (the run itself is k26ops.rollout)."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from k26ops import rollout
from k26ops.cli.pipe import quiet
from k26ops.cli.progress import Board
from k26ops.cli.report import print_results, wide_console
from k26ops.fleet import HostResult
from k26ops.steps.engine import smoke_summary


def run_rollout(settings, work, canary: int | None = 0, *, title: str = "deploy", columns=(),
                render=None, exit: bool = True, batch=None, max_fail=None,
                stopped: str = "not deployed") -> list[HostResult]:
    """Run `work(session, progress)` over the selected hosts in canary batches,
    print the results and (exit=True) exit with the fleet's code."""
    hosts = settings.selected_hosts()
    err = Console(stderr=True)
    board = Board([h.name for h in hosts], err, live=err.is_terminal and not settings.as_json,
                  verbose=bool(settings.verbose))

    update = quiet(board.update)  # output errors never reach host work (k26ops.cli.pipe)

    def with_progress(session):
        name = session.host.name
        return work(session, lambda msg: update(name, msg))

    with board:
        run = rollout.run(hosts, with_progress, settings.fleet_options(), canary=canary, batch=batch,
                          max_fail=max_fail, stopped=stopped,
                          on_result=quiet(lambda r: board.finish(r.host, r.status, r.error)))
    print_rollout(settings, run.results, title, columns, canary=canary, code=run.code)
    if render and not settings.as_json:
        render(run.results)
    if run.stopped:
        click.echo(f"k26ops: rollout stopped: {run.stopped.host}: {run.stopped.error}; "
                   f"untouched: {names_brief(run.stopped.untouched)}", err=True)
    if not exit:
        return run.results
    if run.interrupted:
        click.echo(f"k26ops: {run.interrupted}", err=True)
    sys.exit(run.code)


def print_rollout(settings, results: list[HostResult], title: str, columns=(), canary=0,
                  code: int | None = None) -> None:
    """The results table (or JSON), then each failed host's diagnosis and journal tail."""
    if settings.as_json:
        print_results(settings, results, title, columns, code=code, extra={"canary": canary or 0})
        return
    cols = list(columns) or [("engine", "_engine"), ("health", "_health"), ("smoke", "_smoke")]
    for r in results:
        h, s = r.data.get("health"), r.data.get("smoke")
        if isinstance(h, dict):
            r.data["_health"] = f"{h.get('state')} {h.get('wait_s', 0):.1f}s"
        if isinstance(s, dict) and s.get("ok"):
            r.data["_smoke"] = smoke_summary(s)
        if "engine_restarted" in r.data:
            r.data["_engine"] = "restarted" if r.data["engine_restarted"] else "kept"
        if "steps" in r.data:
            changed = [s["step"] for s in r.data["steps"] if s["changed"]]
            r.data["_changed"] = ", ".join(changed) if changed else "nothing"
    print_results(settings, results, title, cols)
    for r in results:
        for key in ("_health", "_smoke", "_engine", "_changed"):
            r.data.pop(key, None)
    console = wide_console()
    for r in results:
        tail = r.data.get("journal_tail")
        diag = r.data.get("diagnosis") or {}
        if not tail and not diag:
            continue
        console.rule(f"{r.host}: journal tail", style="red")
        if diag.get("signature"):
            console.print(f"[bold]{diag['signature']}[/bold] {diag.get('title') or ''}", highlight=False)
            if diag.get("suggestion"):
                console.print(f"suggestion: {diag['suggestion']}", highlight=False)
        console.print(tail, markup=False, highlight=False)


def names_brief(names: list[str], first: int = 20) -> str:
    """A host list for one line: all of it when short, else the first `first` names and a
    count (10,000 hosts at --batch 1% made a 100,000-character line); --json has them all."""
    if len(names) <= first + 1:
        return ", ".join(names)
    return f"{', '.join(names[:first])} and {len(names) - first} more ({len(names)} hosts)"
