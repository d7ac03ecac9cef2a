"""`k26ops snapshot`, `k26ops rollback`, `k26ops baselines list|show|delete|repin`."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import click
from rich.console import Console
from rich.text import Text

from k26ops.cli import jsonout, tables
from k26ops.cli.batchopts import batch_option, default_batch, max_fail_option
from k26ops.cli.benchopts import baselines_option, bench_options, render_bench, spec_from
from k26ops.cli.changes import render_changes
from k26ops.cli.complete import baseline_tags
from k26ops.cli.report import print_results, wide_console
from k26ops.cli.rollout import print_rollout, run_rollout
from k26ops.errors import EXIT_INTERRUPTED, UserError
from k26ops.release import engine_source
from k26ops.steps.engine import smoke_summary
from k26ops.transport.fleet import INTERRUPTED, exit_code

BASELINES_OPT = baselines_option()


def _fmt_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


@click.command(name="snapshot")
@click.option("--tag", required=True, metavar="TAG", help="Tag name for this baseline (e.g. k26-baseline-working).")
@click.option("-m", "--message", metavar="MSG", help="Why this state is worth keeping.")
@click.option("--force", is_flag=True, help="Move an existing tag to this snapshot.")
@click.option(
    "--allow-unhealthy",
    is_flag=True,
    help="Record hosts that are not healthy (or whose files differ from their manifest) anyway.",
)
@click.option(
    "--bench",
    "with_bench",
    is_flag=True,
    help="Also run `k26ops bench` on each host and store its results (the bench options below apply).",
)
@bench_options
@BASELINES_OPT
@click.pass_obj
def snapshot_cmd(settings, tag, message, force, allow_unhealthy, baselines_dir, with_bench, **bench_opts):
    """Record the hosts' running engine as a tagged known-good baseline."""
    # lazy: the baselines package (GitPython aside, about 60 ms) only for the commands that use it
    from k26ops.baselines import snapshot as snap

    err = Console(stderr=True)
    repo = snap.open_repo(tag, force=force, baselines_dir=baselines_dir)
    res = snap.snapshot(
        repo,
        settings.selected_hosts(),
        settings.fleet_options(),
        tag,
        message,
        force=force,
        allow_unhealthy=allow_unhealthy,
        bench=spec_from(bench_opts) if with_bench else None,
        log=(lambda m: err.print(f"[dim]{m}[/dim]")) if settings.verbose else (lambda m: None),
    )
    if settings.as_json:
        jsonout.emit(
            {
                "tag": res["tag"],
                "commit": res["commit"],
                "repo": res["repo"],
                "elapsed_s": res["elapsed_s"],
                "pin_errors": res["pin_errors"],
                "hosts": {r.host: r.to_json() for r in res["results"]},
            },
            1 if res["pin_errors"] else 0,
        )
    else:
        print_results(
            settings,
            res["results"],
            f"snapshot {tag}",
            [
                ("release", "release"),
                ("health", "health"),
                ("accept", "accept"),
                ("latency ms", "latency_ms"),
                ("files", "files"),
                ("pinned", "pinned"),
            ]
            + ([("bench", "bench")] if with_bench else []),
        )
        click.echo(
            f"{res['title']}\ncommit {res['commit'][:12]} tagged {tag} in {res['repo']} "
            f"({res['elapsed_s']:.1f}s); see: git -C {res['repo']} show {tag}"
        )
    for host, why in res["pin_errors"].items():
        click.echo(f"k26ops: warning: {host}: could not pin the release (prune may remove it): {why}", err=True)
    sys.exit(1 if res["pin_errors"] else 0)


@click.command(name="rollback")
@click.option("--tag", required=True, metavar="TAG", help="Baseline tag to return to.", shell_complete=baseline_tags)
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show text diffs of the unit and env file it restores (secrets redacted).")
@click.option(
    "--canary",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Roll back N hosts first; go on with the rest only if they all succeed.",
)
@batch_option(
    help_more=" Default: the config file's `batch`, else one host at a time where the inventory names "
    "a model_gateway or drain_hook, else all at once."
)
@max_fail_option()
@BASELINES_OPT
@click.pass_obj
def rollback_cmd(settings, tag, check, diff, canary, batch, max_fail, baselines_dir):
    """Bring the hosts back to a tagged baseline: release (rebuilt if gone), unit, env file; verified."""
    # lazy: the baselines package (GitPython aside, about 60 ms) only for the commands that use it
    from k26ops.baselines import rollback

    repo = rollback.open_repo(tag, baselines_dir)
    hosts = [h.name for h in settings.selected_hosts()]
    with rollback.prepared(repo, tag, hosts, check=check) as work:
        results = run_rollout(
            settings,
            work,
            canary=canary,
            batch=default_batch(settings, batch),
            max_fail=max_fail,
            stopped="not rolled back",
            title=f"rollback --tag {tag}" + (" --check" if check else ""),
            columns=rollback.COLUMNS,
            exit=False,
        )
    if not settings.as_json:
        render_changes(results, check=check, diff=diff)
    sys.exit(exit_code(results))


@click.group(name="baselines")
def group():
    """Tagged known-good baselines (the control node's git repository)."""


@group.command(name="list")
@BASELINES_OPT
@click.pass_obj
def list_cmd(settings, baselines_dir):
    """Tags with date, hosts, release, health and spec accept length."""
    # lazy: the baselines package (GitPython aside, about 60 ms) only for the commands that use it
    from k26ops.baselines import Baselines

    repo = Baselines(baselines_dir)
    tags = repo.tags() if repo.exists() else []
    rows = []
    for t in tags:
        hosts = (t.index or {}).get("hosts") or {}
        rows.append(
            {
                "tag": t.name,
                "date": _fmt_time(t.date),
                "commit": t.commit[:12],
                "hosts": sorted(hosts),
                "releases": sorted({h.get("release_id") for h in hosts.values()}),
                "health": sorted({h.get("health") for h in hosts.values()}),
                "accept": [hosts[h].get("spec_accept_length") for h in sorted(hosts)],
                **({"error": t.error} if t.error else {}),
            }
        )
        if t.error:
            click.echo(f"k26ops: warning: {t.error}", err=True)
    if settings.as_json:
        jsonout.emit({"repo": str(repo.path), "tags": rows})
        return
    if not rows:
        click.echo(f"no baselines in {repo.path} (take one with `k26ops snapshot --tag TAG`)")
        return
    cols = [
        tables.Col("tag", keep=True),
        tables.Col("release", keep=True),
        tables.Col("hosts"),
        tables.Col("health"),
        tables.Col("date"),
        tables.Col("accept length"),
    ]
    tables.show(
        wide_console(),
        Text(f"baselines in {repo.path}"),
        cols,
        [
            [
                Text(r["tag"]),
                Text(", ".join(map(str, r["releases"]))),
                Text(", ".join(r["hosts"])),
                Text(", ".join(map(str, r["health"]))),
                Text(r["date"]),
                Text(", ".join("-" if a is None else str(a) for a in r["accept"])),
            ]
            for r in rows
        ],
    )


@group.command(name="show")
@click.argument("tag", shell_complete=baseline_tags)
@BASELINES_OPT
@click.pass_obj
def show_cmd(settings, tag, baselines_dir):
    """One baseline: its tag message and per-host record."""
    # lazy: the baselines package (GitPython aside, about 60 ms) only for the commands that use it
    from k26ops.baselines import Baselines

    repo = Baselines(baselines_dir)
    if not repo.exists():
        raise UserError(f"unknown baseline tag {tag!r}: no baselines repository at {repo.path}")
    t = repo.tag(tag)
    hosts = {h: repo.host_record(t.commit, h) for h in ((t.index or {}).get("hosts") or {})}
    benches = {h: repo.host_bench(t.commit, h) for h in hosts}
    if settings.as_json:
        jsonout.emit(
            {
                "tag": t.name,
                "date": _fmt_time(t.date),
                "commit": t.commit,
                "message": t.message,
                "hosts": hosts,
                "bench": {h: b for h, b in benches.items() if b},
            }
        )
        return
    out = tables.console(highlight=False)  # piped: long lines (sha256, cmd) never wrapped
    out.print(f"[bold]{t.name}[/bold]  {_fmt_time(t.date)}  commit {t.commit[:12]}  ({repo.path})")
    out.print(t.message, markup=False)
    for h, rec in hosts.items():
        if not rec:
            continue
        out.rule(h)
        sm = rec.get("smoke") or {}
        out.print(
            f"release {rec['release_id']}  health {rec['health']}  smoke {smoke_summary(sm)}  "
            f"rebuildable {'yes' if rec.get('rebuildable') else 'no'}",
            markup=False,
        )
        for line in engine_source.describe(rec.get("engine")):
            out.print(line, markup=False)
        for p in rec.get("patches") or []:
            out.print(f"patch {p['name']}  sha256 {p['sha256']}", markup=False)
        for p, s in sorted((rec.get("patched_files") or {}).items()):
            out.print(f"file  {p}  sha256 {s}", markup=False)
        out.print(f"unit  {rec['unit']['path']}  sha256 {rec['unit']['sha256']}", markup=False)
        out.print(
            f"env   {rec['env']['path']}  secrets recorded as {rec['env'].get('marker')}: "
            f"{', '.join(rec['env'].get('secret_keys') or []) or 'none'}",
            markup=False,
        )
        out.print("cmd   " + " ".join(rec.get("cmdline") or []), markup=False)
        if benches.get(h):
            render_bench(h, benches[h], out)
        else:
            out.print("bench none stored (`k26ops snapshot --tag NAME --bench` stores one)", markup=False)


PIN_COLUMNS = [("changed", "_changed"), ("pins", "pins"), ("unpinned", "unpinned"), ("pinned", "newly_pinned")]


def _report_pins(settings, res: dict, title: str, diff: bool, hint: str) -> None:
    """Per-host table or JSON, the changes, what stays on disk, stale hosts; then exit."""
    results, check, stale = res["results"], res["check"], res["stale_pins"]
    # Ctrl-C: a host still queued says so, and so does the rollout when every host had started
    interrupted = res.get("interrupted") or any(r.status == INTERRUPTED for r in results)
    if settings.as_json:
        doc = {k: v for k, v in res.items() if k not in ("results", "interrupted")}
        code = EXIT_INTERRUPTED if interrupted else exit_code(results)
        jsonout.emit({**doc, "hosts": {r.host: r.to_json() for r in results}}, code)
    else:
        if results:
            print_rollout(settings, results, title, PIN_COLUMNS)
            render_changes(results, check=check, diff=diff)
        if any(r.data.get("unpinned") for r in results) and not check:
            click.echo(
                "Unpinned releases stay on disk: the next deploy's prune removes them "
                "(it never removes `current` or a pinned release)."
            )
    for host, why in stale.items():
        click.echo(
            f"k26ops: warning: {host}: pins {'would not be' if check else 'not'} rewritten ({why}); "
            "they may keep releases no baseline needs",
            err=True,
        )
    if stale and not check:
        click.echo(
            f"k26ops: {hint}`k26ops baselines repin --limit {','.join(stale)}` (with an inventory that has them)",
            err=True,
        )
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(exit_code(results))


@group.command(name="delete")
@click.argument("tags", nargs=-1, required=True, metavar="TAG [TAG...]", shell_complete=baseline_tags)
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show the pinned-releases diff per host.")
@BASELINES_OPT
@click.pass_obj
def delete_cmd(settings, tags, check, diff, baselines_dir):
    """Delete baseline tags, then unpin releases no remaining baseline needs.

    Only the tags go: the commits they name stay in the repository's history.
    Every tag must exist, else nothing changes. Then each host the tags
    recorded (after --limit) is repinned: its pinned-releases becomes exactly
    the releases the remaining tags record for it (as `baselines repin`).
    Release directories are not removed here; the next deploy's prune frees
    them. A host that cannot be reached keeps its old pins; the tags stay
    deleted, and `k26ops baselines repin` fixes that host later.
    """
    # lazy: the baselines package (GitPython aside, about 60 ms) only for the commands that use it
    from k26ops.baselines import pins

    repo = pins.open_repo(baselines_dir)
    pins.recorded_hosts(repo, list(tags))  # an unknown tag: refused before the inventory is read
    res = pins.delete(
        repo,
        list(tags),
        settings.selected_hosts(),
        settings.fleet_options(),
        limited=bool(settings.limit),
        check=check,
        log=_log(settings),
    )
    if not settings.as_json:
        click.echo(
            f"{'would delete' if check else 'deleted'} tag(s) {', '.join(res['tags'])} in {res['repo']} "
            "(their commits stay in its history)"
        )
    _report_pins(
        settings,
        res,
        "baselines delete" + (" --check" if check else ""),
        diff,
        "the tags are deleted, do not run `baselines delete` again; when the hosts are back, run ",
    )


@group.command(name="repin")
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show the pinned-releases diff per host.")
@BASELINES_OPT
@click.pass_obj
def repin_cmd(settings, check, diff, baselines_dir):
    """Rewrite the hosts' pinned-releases from the baselines' tags.

    Each selected host pins exactly the releases the tags record for it (a
    host no tag records pins none). `current` and release directories are not
    touched; the next deploy's prune frees what is no longer pinned.
    """
    # lazy: the baselines package (GitPython aside, about 60 ms) only for the commands that use it
    from k26ops.baselines import pins

    repo = pins.open_repo(baselines_dir)
    res = pins.repin(repo, settings.selected_hosts(), settings.fleet_options(), check=check, log=_log(settings))
    _report_pins(
        settings, res, "baselines repin" + (" --check" if check else ""), diff, "when the hosts are back, run "
    )


def _log(settings):
    err = Console(stderr=True)
    return (lambda m: err.print(f"[dim]{m}[/dim]", highlight=False)) if settings.verbose else (lambda m: None)
