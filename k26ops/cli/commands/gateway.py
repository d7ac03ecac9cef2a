"""`k26ops gateway ...`: the managed SGLang Model Gateway on the hosts of the inventory
group `gateway` (deploy, rollback, status) and its lock (`gateway lock`)."""

from __future__ import annotations

from pathlib import Path

import click

from k26ops.cli import jsonout
from k26ops.cli.batchopts import batch_option, max_fail_option
from k26ops.cli.changes import render_changes
from k26ops.cli.context import load_inventory
from k26ops.cli.report import run_and_report
from k26ops.cli.rollout import run_rollout
from k26ops.errors import UserError
from k26ops.orchestrate import playbook
from k26ops.orchestrate.rollout import playbook_work
from k26ops.steps.gateway import GatewayWorkers, api, check_engines
from k26ops.steps.gateway_spec import GROUP, GatewayHost, engine_workers, make_lock
from k26ops.transport import agents
from k26ops.transport.fleet import Outcome

COLUMNS = [
    ("release", "gateway_release"),
    ("changed", "_changed"),
    ("health", "_gw_health"),
    ("workers", "_gw_workers"),
]


class GatewaySettings:
    """The run's settings, selecting the hosts of the group `gateway` (after --limit). Gateway
    hosts need not be engine targets (they may set no gpus_per_host)."""

    def __init__(self, settings):
        self._s = settings
        self.inventory_obj = None

    def __getattr__(self, name):
        return getattr(self._s, name)

    def selected_hosts(self):
        s = self._s
        inv = self.inventory_obj = load_inventory(s.inventory_path())
        for w in getattr(inv, "warnings", []):
            if w not in s.said:
                s.said.add(w)
                click.echo(f"k26ops: warning: {w}", err=True)
        inv.check_strict(s.strict)
        if GROUP not in inv.groups:
            raise UserError(f"{inv.path}: no group `{GROUP}`: put the hosts that run the gateway in it")
        hosts = inv.select(GROUP)
        if s.limit:
            keep = {h.name for h in inv.select(s.limit)}
            hosts = [h for h in hosts if h.name in keep]
        if not hosts:
            raise UserError(f"{inv.path}: --limit {s.limit!r} selects no host of the group `{GROUP}`")
        inv.check_vault(hosts)
        return hosts


def _summary(data) -> None:
    """The table's health and workers cells (the table only: not in --json)."""
    h, g = data.get("gateway_health"), data.get("gateway")
    if isinstance(h, dict):
        data["_gw_health"] = h.get("state") + (f" {h['wait_s']:.1f}s" if "wait_s" in h else "")
    if isinstance(g, dict):
        data["_gw_workers"] = f"{len(g['healthy'])}/{g['workers']} healthy"


def _run(settings, *, check: bool, diff: bool, rollback: bool, batch=None, max_fail=None) -> None:
    gs = GatewaySettings(settings)
    steps = playbook.load("gateway")
    if rollback:
        steps[0].params["rollback"] = True
    hosts = gs.selected_hosts()
    inv = gs.inventory_obj
    engines = engine_workers(inv.hosts.values())
    check_engines(engines, inv.select(GROUP), set(inv.hosts))
    for step in steps:
        if isinstance(step, GatewayWorkers):
            step.params["engines"] = engines
        step.before_hosts(hosts)
    title = ("gateway rollback" if rollback else "gateway deploy") + (" --check" if check else "")

    def work(session, progress):
        out = playbook_work(steps, check=check, purpose="gateway")(session, progress)
        if not settings.as_json:
            _summary(out)
        return out

    run_rollout(
        gs,
        work,
        canary=0,
        batch=batch,
        max_fail=max_fail,
        title=title,
        columns=COLUMNS,
        render=lambda results: render_changes(results, check=check, diff=diff),
        stopped="not deployed",
    )


@click.group(name="gateway")
def group():
    """The SGLang Model Gateway (sglang-router) on the hosts of the inventory group `gateway`."""


@group.command(name="deploy")
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show text diffs of files that would change (secrets redacted).")
@batch_option(help_more=" Default: every gateway host at once.")
@max_fail_option()
@click.pass_obj
def deploy_cmd(settings, check, diff, batch, max_fail):
    """Install the pinned sglang-router as a release, its unit, wait for /health, register the engines
    of the hosts that name the gateway (POST /workers) and wait until they are healthy there."""
    _run(settings, check=check, diff=diff, rollback=False, batch=batch, max_fail=max_fail)


@group.command(name="rollback")
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.pass_obj
def rollback_cmd(settings, check):
    """Point the gateway back at its previous release, restart it, register the engines again."""
    _run(settings, check=check, diff=False, rollback=True)


@group.command(name="status")
@click.pass_obj
def status_cmd(settings):
    """Per gateway host: unit state, /health, /readiness, release, workers (named, registered, healthy).
    Exit 1 when a gateway does not serve."""
    gs = GatewaySettings(settings)
    hosts = gs.selected_hosts()
    engines = engine_workers(gs.inventory_obj.hosts.values())
    by_name = {h.name: GatewayHost.of(h) for h in hosts}

    def work(session):
        gw = by_name[session.host.name]
        r = agents.run(
            session,
            "gateway",
            "status",
            what="gateway agent",
            unit=gw.unit,
            host=gw.poll_host,
            port=gw.port,
            current=gw.current,
        )
        show, ready = r["show"], r.get("readiness") or {}
        named = [e for e in engines if set(e["gateways"]) & {gw.name, gw.url}]
        status, body = api(gw, "GET", "/workers") if r.get("health") == 200 else (0, None)
        workers = body.get("workers") if status == 200 and isinstance(body, dict) else None
        healthy = [w for w in workers or [] if w.get("is_healthy")]
        missing = [
            e["name"]
            for e in named
            if workers is not None and e["url"] not in {w.get("url", "").rstrip("/") for w in workers}
        ]
        serving = show.get("ActiveState") == "active" and r.get("health") == 200
        return Outcome(
            url=gw.url,
            unit=gw.unit,
            state=show.get("ActiveState") or "unknown",
            health="healthy" if r.get("health") == 200 else f"HTTP {r['health']}" if r.get("health") else "-",
            ready="ready" if ready.get("status") == 200 else f"not ready ({ready.get('status')})" if ready else "-",
            release=(r.get("current") or "").rsplit("/", 1)[-1] or None,
            workers=(
                f"{len(healthy)}/{len(workers)} healthy"
                if workers is not None
                else f"unknown (GET /workers: {status or 'no answer'})"
            ),
            registered=[w.get("url") for w in workers or []],
            named=[e["name"] for e in named],
            missing=missing,
            serving=serving,
            pid=show.get("MainPID") or None,
        )

    def render(results):
        for r in results:
            if r.data and r.data.get("missing"):
                click.echo(
                    f"k26ops: {r.host}: not registered there: {', '.join(r.data['missing'])} "
                    "(`k26ops gateway deploy` registers them)",
                    err=True,
                )

    run_and_report(
        gs,
        work,
        title="gateway status",
        render=render,
        exit_with=lambda results: 1 if any(r.data and not r.data.get("serving") for r in results) else 0,
        columns=[
            ("state", "state"),
            ("health", "health"),
            ("ready", "ready"),
            ("release", "release"),
            ("workers", "workers"),
            ("url", "url"),
        ],
    )


@group.command(name="lock")
@click.argument("version")
@click.option("--python", "python", default="3.11", show_default=True, help="The gateway hosts' python3 (X.Y).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the lock here (default: stdout); point gateway_lock at it.",
)
@click.pass_obj
def lock_cmd(settings, version, python, output):
    """Make a gateway lock: sglang-router==VERSION and its dependencies, each wheel with its sha256."""
    text = make_lock(version, python)
    if output:
        try:
            output.write_text(text)
        except OSError as exc:
            raise UserError(f"{output}: cannot write the lock: {exc.strerror}") from None
    if settings.as_json:
        jsonout.emit(
            {"hosts": {}, "version": version, "python": python, "lock": text, "output": str(output) if output else None}
        )
    elif output:
        click.echo(f"wrote {output} (sglang-router {version}, python {python})", err=True)
    else:
        click.echo(text, nl=False)
