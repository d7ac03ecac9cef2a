"""Per-host results: a summary table for people, JSON for scripts, and the exit code."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from k26ops.fleet import Fleet, FleetInterrupted, HostResult, exit_code
from k26ops.errors import EXIT_INTERRUPTED

STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "red",
         "interrupted": "magenta", "skipped": "magenta"}


def run_and_report(settings, work, *, title: str, columns=(), render=None, exit_with=None) -> None:
    """Run `work` over the selected hosts, print, and exit with the fleet's code.

    `columns` are (header, key) pairs taken from each host's data for the table.
    `render(results)` may print extra human detail after the table.
    `exit_with(results)` may raise the exit code (the higher one wins).
    (Playbooks with progress and canaries go through `k26ops.rollout`.)
    """
    hosts = settings.selected_hosts()
    err = Console(stderr=True)
    fleet = Fleet(hosts, settings.fleet_options(),
                  on_event=(lambda h, m: err.print(f"[dim]{h}: {m}[/dim]")) if settings.verbose else None)
    try:
        results = fleet.run(work)
    except FleetInterrupted as exc:
        print_results(settings, exc.results, title, columns)
        click.echo(f"k26ops: {exc}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        fleet.close()
    print_results(settings, results, title, columns)
    if render and not settings.as_json:
        render(results)
    sys.exit(max(exit_code(results), exit_with(results) if exit_with else 0))


def print_results(settings, results: list[HostResult], title: str, columns=()) -> None:
    if settings.as_json:
        doc = {"hosts": {r.host: r.to_json() for r in results}}
        if settings.warnings:
            doc["warnings"] = list(settings.warnings)
        click.echo(json.dumps(doc, default=str))
        return
    table = Table("host", "status", *[c[0] for c in columns], "time", "detail", title=title)
    for r in results:
        cells = [_cell(r.data.get(key)) for _, key in columns]
        table.add_row(r.host, f"[{STYLE.get(r.status, 'white')}]{r.status}[/]", *cells,
                      f"{r.elapsed:.1f}s", r.error or "")
    wide_console().print(table)
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    click.echo(", ".join(f"{n} {s}" for s, n in counts.items()))


def wide_console(stderr: bool = False) -> Console:
    """A terminal's own width; 160 columns when output goes to a file or pipe."""
    con = Console(stderr=stderr)
    return con if con.is_terminal else Console(stderr=stderr, width=160)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)
