"""Per-host results: a summary table for people, JSON for scripts, and the exit code."""

from __future__ import annotations

import sys

import click
from rich import box
from rich.console import Console

from k26ops.cli import jsonout, tables
from k26ops.cli.pipe import quiet
from k26ops.orchestrate import rollout
from k26ops.transport.fleet import HostResult, exit_code

STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "red",
    "unreachable": "red",
    "interrupted": "magenta",
    "skipped": "magenta",
}  # any other status (an engine state: stopped ...) is red

# Columns whose values an operator acts on: never wrapped, cut or hidden.
KEEP = {"unit", "health", "release", "verdict", "signature", "engine"}


def run_and_report(settings, work, *, title: str, columns=(), render=None, exit_with=None, host_status=None) -> None:
    """Run `work` over the selected hosts (k26ops.orchestrate.rollout.run, one batch), print,
    and exit with the fleet's code.

    `columns` are (header, key[, keep]) taken from each host's data for the table;
    keep (default: the header is in KEEP) marks a value never cut or hidden at
    narrow widths (k26ops.cli.tables); the others wrap, then hide, rightmost first.
    `render(results)` may print extra human detail after the table.
    `exit_with(results)` may raise the exit code (the higher one wins).
    `host_status(result)` may name a host that ran fine but is not ok (status: an enabled
    engine that does not serve): that word replaces `ok` in the table, summary and JSON.
    (Playbooks with progress and canaries go through `k26ops.cli.rollout`.)
    """
    run = rollout.run(settings.selected_hosts(), work, settings.fleet_options(), on_event=verbose_events(settings))
    for r in run.results if host_status else ():
        if r.status == "ok":
            r.status = host_status(r) or r.status
    if run.interrupted:
        print_results(settings, run.results, title, columns, code=run.code)
        click.echo(f"k26ops: {run.interrupted}", err=True)
        sys.exit(run.code)
    code = max(run.code, exit_with(run.results) if exit_with else 0)
    print_results(settings, run.results, title, columns, code=code)
    if render and not settings.as_json:
        render(run.results)
    sys.exit(code)


def verbose_events(settings):
    """With -v, each host's fleet events (connecting, running, its status) as dim lines on stderr."""
    if not settings.verbose:
        return None
    err = Console(stderr=True)
    return quiet(lambda h, m: err.print(f"[dim]{h}: {m}[/dim]"))


def print_results(
    settings, results: list[HostResult], title: str, columns=(), code: int | None = None, extra: dict | None = None
) -> None:
    """The table for people, or the one JSON document (k26ops.cli.jsonout) with
    `extra` keys; `code` is the exit code it will end with (default: the fleet's)."""
    if settings.as_json:
        doc = {"hosts": {r.host: r.to_json() for r in results}, **(extra or {})}
        if settings.warnings:
            doc["warnings"] = list(settings.warnings)
        jsonout.emit(doc, exit_code(results) if code is None else code)
        return
    cols = [
        tables.Col("host", keep=True),
        tables.Col("status", keep=True),
        *[tables.Col(c[0], keep=c[2] if len(c) > 2 else c[0] in KEEP) for c in columns],
        tables.Col("time", justify="right"),
    ]
    rows = [
        [
            r.host,
            f"[{STYLE.get(r.status, 'red')}]{r.status}[/]",
            *[_cell(r.data.get(c[1])) for c in columns],
            f"{r.elapsed:.1f}s",
        ]
        for r in results
    ]
    tables.show(
        wide_console(),
        title,
        cols,
        rows,
        [r.error for r in results],
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )  # no vertical rules: more fits at 80
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    click.echo(", ".join(f"{n} {s}" for s, n in counts.items()))


wide_console = tables.console


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)
