"""`k26ops deploy`: run the deploy playbook over the fleet (canary first if asked)."""

from __future__ import annotations

import sys

import click

from k26ops.cli import htmlreport
from k26ops.cli.batchopts import batch_option, default_batch, max_fail_option
from k26ops.cli.benchopts import baselines_option
from k26ops.cli.changes import render_changes
from k26ops.cli.rehearseopts import options_from, rehearsal_options
from k26ops.cli.rollout import run_rollout
from k26ops.enginebench.figures import DEFAULT_GATE, parse_figure
from k26ops.enginebench.gate import BenchGate, plan_gate
from k26ops.enginebench.run import METRICS
from k26ops.enginebench.stored import stored_benches
from k26ops.errors import UserError
from k26ops.orchestrate import playbook
from k26ops.orchestrate.rollout import canary_batches, playbook_work
from k26ops.rehearsal.run import Gate
from k26ops.steps import RunOptions
from k26ops.transport.fleet import exit_code


def run_playbook(
    settings,
    name: str,
    *,
    check: bool,
    diff: bool,
    canary: int = 0,
    options=None,
    title: str | None = None,
    purpose: str = "deploy",
    exit: bool = True,
    batch=None,
    max_fail=None,
):
    """Run playbook `name` over the selected hosts; print; exit with the fleet's code."""
    steps = playbook.load(name)
    hosts = settings.selected_hosts()  # the inventory read once for every step's checks
    for step in steps:
        step.before_hosts(hosts)
    return run_rollout(
        settings,
        playbook_work(steps, check=check, purpose=purpose, options=options),
        canary=canary,
        batch=batch,
        max_fail=max_fail,
        title=title or (f"{name} --check" if check else name),
        columns=[
            ("release", "release"),
            ("changed", "_changed"),
            ("engine", "_engine"),
            ("health", "_health"),
            ("smoke", "_smoke"),
        ],
        render=lambda results: render_changes(results, check=check, diff=diff),
        exit=exit,
    )


@click.command(name="deploy")
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show text diffs of files that would change (secrets redacted).")
@click.option(
    "--playbook",
    "name",
    default="deploy",
    show_default=True,
    metavar="NAME|PATH",
    help="Playbook to run (playbooks/NAME.yml).",
)
@click.option(
    "--canary",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Deploy to N hosts first; go on with the rest only if they all succeed.",
)
@batch_option(
    help_more=" Default: the config file's `batch`, else one host at a time where the inventory names "
    "a model_gateway or drain_hook, else the rest at once."
)
@max_fail_option()
@click.option(
    "--gate",
    "gate_tag",
    metavar="TAG",
    help="With --canary N: bench the canaries (with --batch: every host, batch by batch) and go on "
    "only if no gated figure is worse than the baseline TAG's stored bench by more than the "
    "threshold; else roll the host back.",
)
@click.option(
    "--gate-threshold",
    type=click.FloatRange(0, 1000),
    default=5.0,
    show_default=True,
    metavar="PCT",
    help="Largest allowed regression of a gated figure, percent of the baseline's value.",
)
@click.option(
    "--gate-figures",
    default=",".join(DEFAULT_GATE),
    show_default=True,
    metavar="LIST",
    help="Gated figures, METRIC@cN/tT (metrics: " + ", ".join(METRICS) + ").",
)
@baselines_option("Baselines repository for --gate")
@click.option(
    "--rehearse",
    is_flag=True,
    help="Before a host's engine is switched or restarted, rehearse the new one on dummy weights "
    "beside it (k26ops rehearse); a failed rehearsal leaves the serving engine untouched.",
)
@rehearsal_options
@htmlreport.report_option("the deploy (written with --gate or when this is given)")
@click.pass_obj
def deploy_cmd(
    settings,
    check,
    diff,
    name,
    canary,
    batch,
    max_fail,
    gate_tag,
    gate_threshold,
    gate_figures,
    baselines_dir,
    rehearse,
    report_path,
    **rkw,
):
    """Provision hosts: CUDA 13 toolchain, patched TP8 DDTree engine release, service, health."""
    options = RunOptions(rehearse=Gate(options_from(rkw, bench=False)) if rehearse else None)
    batch = default_batch(settings, batch)
    if gate_tag is None:
        results = run_playbook(
            settings,
            name,
            check=check,
            diff=diff,
            canary=canary,
            options=options,
            batch=batch,
            max_fail=max_fail,
            exit=report_path is None,
        )
        htmlreport.after_run(settings, results, "deploy", report_path)
        sys.exit(exit_code(results))
    gated_deploy(
        settings,
        name,
        check=check,
        diff=diff,
        canary=canary,
        batch=batch,
        max_fail=max_fail,
        tag=gate_tag,
        threshold=gate_threshold,
        figures=[f.strip() for f in gate_figures.split(",") if f.strip()],
        baselines_dir=baselines_dir,
        options=options,
        report_path=report_path,
    )


def gated_deploy(
    settings,
    name,
    *,
    check,
    diff,
    canary,
    tag,
    threshold,
    figures,
    baselines_dir,
    options=None,
    batch=None,
    max_fail=None,
    report_path=None,
):
    """The deploy with the bench gate on its canary batch, and with --batch on
    every later batch too (enginebench/gate.py)."""
    if not canary and not batch:
        raise UserError(
            "--gate needs --canary N or --batch (the hosts benched before the others go on); nothing was deployed"
        )
    if not figures:
        raise UserError("--gate-figures: empty list; nothing was deployed")
    for f in figures:
        parse_figure(f)
    stored = stored_benches(baselines_dir, tag)
    spec = plan_gate(stored, tag, figures)
    hosts = settings.selected_hosts()  # the inventory read once for the batches and every step's checks
    batches = canary_batches(hosts, canary, batch)
    gated = [h.name for b in (batches if batch else batches[:1]) for h in b]
    steps = playbook.load(name) + [
        BenchGate(
            {"hosts": gated, "stored": stored, "spec": spec, "tag": tag, "figures": figures, "threshold": threshold}
        )
    ]
    for step in steps:
        step.before_hosts(hosts)
    results = run_rollout(
        settings,
        playbook_work(steps, check=check, options=options),
        canary=canary,
        batch=batch,
        max_fail=max_fail,
        title=f"{name} (gate {tag})" + (" --check" if check else ""),
        columns=[
            ("release", "release"),
            ("changed", "_changed"),
            ("engine", "_engine"),
            ("health", "_health"),
            ("smoke", "_smoke"),
        ],
        render=lambda results: render_changes(results, check=check, diff=diff),
        exit=False,
    )
    # a failed batch already stopped the rollout with one line naming the gate's figure
    stopped = any(r.status == "skipped" for r in results)
    for r in results:
        g = r.data.get("gate")
        if not g:
            continue
        if not g["ok"]:
            if not stopped:
                click.echo(f"k26ops: {g['line']}", err=True)
        elif not settings.as_json:
            checked = "; ".join(f"{c['figure']} {c['current']:g} vs {c['baseline']:g}" for c in g["checked"])
            click.echo(f"gate passed on {r.host} against {tag} (median of {spec.runs} run(s)): {checked}")
    if not check:
        htmlreport.after_run(settings, results, "deploy", report_path, stored=stored, tag=tag)
    sys.exit(exit_code(results))
