"""Roll a unit of work over the selected hosts: canary batch first, then the rest.

`run_rollout(settings, work, canary=N)` runs `work` on the first N selected
hosts; only when every one of them ends ok/changed does it run the rest. A
failed canary stops the rollout: the other hosts are reported `skipped` and
untouched. Per-host progress (k26ops.progress: live on a terminal, else one
line per host event), the results table or --json, a failed host's journal tail and
crash diagnosis, and the exit code.

`work(session, progress)` gets the host's progress callback (pass it to
`playbook.run_on_host(..., progress=progress)`); `playbook_work(steps, ...)`
builds that for a playbook and carries the steps' report data (health,
smoke latency, spec_accept_length, rollback) into each host's result.
"""

from __future__ import annotations

import sys
from typing import Callable

import click
from rich.console import Console

from k26ops.release import wheelsource
from k26ops.errors import EXIT_INTERRUPTED
from k26ops.fleet import Fleet, FleetInterrupted, HostResult, exit_code
from k26ops.progress import Board
from k26ops.steps.engine import smoke_summary

SKIPPED = "skipped"
Progress = Callable[[str], None]


def canary_batches(hosts: list, n: int | None, batch: int | None = None) -> list[list]:
    """[first n hosts, then the rest] (empty batches dropped); n <= 0 or None: one
    batch. With `batch`, the rest goes in batches of that many (rolling reboots)."""
    hosts = list(hosts)
    if not n or n <= 0 or n >= len(hosts):
        first, rest = hosts, []
    else:
        first, rest = hosts[:n], hosts[n:]
    size = batch if batch and batch > 0 else len(rest) or 1
    return [b for b in [first] + [rest[i:i + size] for i in range(0, len(rest), size)] if b]


def playbook_work(steps, *, check: bool = False, purpose: str = "deploy", shared: dict | None = None):
    """A rollout work function running `steps` via playbook.run_on_host; each
    host's result gets the steps' report data (ctx.shared["outcome"])."""
    from k26ops import playbook

    def work(session, progress: Progress):
        return playbook.run_on_host(session, steps, check=check, progress=progress, purpose=purpose,
                                    shared={**(shared or {}), "outcome": {}})

    return work


def run_rollout(settings, work, canary: int | None = 0, *, title: str = "deploy", columns=(),
                render=None, exit: bool = True, batch: int | None = None,
                stopped: str = "not deployed") -> list[HostResult]:
    """Run `work(session, progress)` over the selected hosts in canary batches,
    print the results and (exit=True) exit with the fleet's code."""
    hosts = settings.selected_hosts()
    err = Console(stderr=True)
    board = Board([h.name for h in hosts], err, live=err.is_terminal and not settings.as_json,
                  verbose=bool(settings.verbose))
    details: dict[str, dict] = {}

    def wrapped_for(session):
        name = session.host.name
        try:
            return work(session, lambda msg: board.update(name, msg))
        except Exception as exc:
            if getattr(exc, "details", None):
                details[name] = exc.details
            raise

    results: dict[str, HostResult] = {}
    batches = canary_batches(hosts, canary, batch)
    interrupted = None
    stop_line = None
    with board:
        for i, batch in enumerate(batches):
            fleet = Fleet(batch, settings.fleet_options(),
                          on_result=lambda r: board.finish(r.host, r.status, r.error))
            # peer wheel source: this batch's first host relays wheels to the others, until the batch ends
            wheelsource.CURRENT = wheelsource.Batch(batch, fleet.session)
            try:
                for r in fleet.run(wrapped_for):
                    results[r.host] = r
            except FleetInterrupted as exc:
                for r in exc.results:
                    results[r.host] = r
                interrupted = exc
            finally:
                wheelsource.CURRENT.stop()
                wheelsource.CURRENT = None
                for name, s in list(fleet.sessions.items()):  # the relay's pushes may come after its own work
                    if name in results:
                        results[name].uploaded = s.uploaded
                fleet.close()
            if interrupted:
                break
            failed = [h.name for h in batch if results[h.name].status not in ("ok", "changed")]
            if failed and i + 1 < len(batches):
                what = "canary" if i == 0 else f"batch {i + 1}"
                why = f"{stopped}: {what} {', '.join(failed)} failed"
                untouched = [h.name for later in batches[i + 1:] for h in later]
                for name in untouched:
                    results[name] = HostResult(name, SKIPPED, why)
                    board.finish(name, SKIPPED, why)
                first = results[failed[0]]
                stop_line = (f"k26ops: rollout stopped: {failed[0]}: {first.error or first.status}; "
                             f"untouched: {', '.join(untouched)}")
                break
    ordered = [results.get(h.name) or HostResult(h.name, SKIPPED, "not started") for h in hosts]
    for r in ordered:
        if r.host in details:
            r.data.update(details[r.host])
    print_rollout(settings, ordered, title, columns, canary=canary,
                  code=EXIT_INTERRUPTED if interrupted else exit_code(ordered))
    if render and not settings.as_json:
        render(ordered)
    if stop_line:
        click.echo(stop_line, err=True)
    if not exit:
        return ordered
    if interrupted:
        click.echo(f"k26ops: {interrupted}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(exit_code(ordered))


def print_rollout(settings, results: list[HostResult], title: str, columns=(), canary=0,
                  code: int | None = None) -> None:
    """The results table (or JSON), then each failed host's diagnosis and journal tail."""
    from k26ops.cli.report import print_results, wide_console

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
