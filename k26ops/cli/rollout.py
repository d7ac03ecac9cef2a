"""A rollout on the command line: progress board, results table or JSON,
journal tails, the stop line and the exit code (the run itself is k26ops.orchestrate.rollout)."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from k26ops.cli.pipe import quiet
from k26ops.cli.progress import Board
from k26ops.cli.report import print_results, wide_console
from k26ops.orchestrate import rollout
from k26ops.steps.engine import smoke_summary
from k26ops.traffic.drain import TrafficConfig
from k26ops.traffic.gateway import Gateway, Watch
from k26ops.transport.fleet import HostResult


def run_rollout(
    settings,
    work,
    canary: int | None = 0,
    *,
    title: str = "deploy",
    columns=(),
    render=None,
    exit: bool = True,
    batch=None,
    max_fail=None,
    stopped: str = "not deployed",
) -> list[HostResult]:
    """Run `work(session, progress)` over the selected hosts in canary batches,
    print the results and (exit=True) exit with the fleet's code."""
    hosts = settings.selected_hosts()
    err = Console(stderr=True)
    board = Board(
        [h.name for h in hosts], err, live=err.is_terminal and not settings.as_json, verbose=bool(settings.verbose)
    )

    update = quiet(board.update)  # output errors never reach host work (k26ops.cli.pipe)

    def with_progress(session):
        name = session.host.name
        return work(session, lambda msg: update(name, msg))

    watch = gateway_watch(hosts)
    with board, watch:
        run = rollout.run(
            hosts,
            with_progress,
            settings.fleet_options(),
            canary=canary,
            batch=batch,
            max_fail=max_fail,
            stopped=stopped,
            on_result=quiet(lambda r: board.finish(r.host, r.status, r.error)),
        )
    traffic = watch.report() if watch.gateways else None
    print_rollout(settings, run.results, title, columns, canary=canary, code=run.code, traffic=traffic)
    if render and not settings.as_json:
        render(run.results)
    if run.stopped:
        click.echo(
            f"k26ops: rollout stopped: {run.stopped.host}: {run.stopped.error}; "
            f"untouched: {names_brief(run.stopped.untouched)}",
            err=True,
        )
    if not exit:
        return run.results
    if run.interrupted:
        click.echo(f"k26ops: {run.interrupted}", err=True)
    sys.exit(run.code)


def gateway_watch(hosts) -> Watch:
    """A watch on every gateway the hosts name (none: a watch that watches nothing)."""
    urls = {}
    for h in hosts:
        cfg = TrafficConfig.of(h)
        if cfg.mode == "gateway":
            for u in cfg.gateways:
                urls.setdefault(u, cfg.api_key)
    return Watch([Gateway(u, k) for u, k in urls.items()])


def traffic_cell(t: dict) -> str:
    """`drained 21s (47 req), out 38s, back 17s` for the table."""
    parts = []
    if t.get("drain_s") is not None:
        parts.append(f"drained {t['drain_s']:.0f}s ({t.get('requests') if t.get('requests') is not None else '?'} req)")
    if t.get("out_of_rotation_s") is not None:
        parts.append(f"out {t['out_of_rotation_s']:.0f}s")
    if t.get("stop_to_serving_s") is not None:
        parts.append(f"stop->serving {t['stop_to_serving_s']:.0f}s")
    if t.get("out_of_rotation_s") is None and not t.get("put_back") and t.get("drain_s") is not None:
        parts.append("left out of rotation")
    return ", ".join(parts) or t.get("mode", "-")


def print_rollout(
    settings,
    results: list[HostResult],
    title: str,
    columns=(),
    canary=0,
    code: int | None = None,
    traffic: dict | None = None,
) -> None:
    """The results table (or JSON), then each failed host's diagnosis and journal tail;
    `traffic`: the run's gateway watch (zero healthy workers ever?)."""
    if settings.as_json:
        print_results(
            settings,
            results,
            title,
            columns,
            code=code,
            extra={"canary": canary or 0, **({"traffic": traffic} if traffic else {})},
        )
        return
    cols = list(columns) or [("engine", "_engine"), ("health", "_health"), ("smoke", "_smoke")]
    if any(isinstance(r.data.get("traffic"), dict) for r in results):
        cols.append(("traffic", "_traffic"))
    for r in results:
        h, s = r.data.get("health"), r.data.get("smoke")
        if isinstance(h, dict):
            r.data["_health"] = f"{h.get('state')} {h.get('wait_s', 0):.1f}s"
        if isinstance(s, dict) and s.get("ok"):
            r.data["_smoke"] = smoke_summary(s)
        if isinstance(r.data.get("traffic"), dict):
            r.data["_traffic"] = traffic_cell(r.data["traffic"])
        if "engine_restarted" in r.data:
            r.data["_engine"] = "restarted" if r.data["engine_restarted"] else "kept"
        if "steps" in r.data:
            changed = [s["step"] for s in r.data["steps"] if s["changed"]]
            r.data["_changed"] = ", ".join(changed) if changed else "nothing"
    print_results(settings, results, title, cols)
    for r in results:
        for key in ("_health", "_smoke", "_engine", "_changed", "_traffic"):
            r.data.pop(key, None)
    console = wide_console()
    if traffic:
        z = traffic["zero_worker_windows"]
        console.print(
            (
                "[red]traffic: a gateway had ZERO healthy workers " + f"{z} time(s)[/]"
                if z
                else "traffic: no gateway ever had zero healthy workers"
            )
            + " ("
            + ", ".join(f"{n}: at least {g['min_healthy']} healthy" for n, g in traffic["gateways"].items())
            + ")",
            highlight=False,
        )
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
