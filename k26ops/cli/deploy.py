"""`k26ops deploy`: run the deploy playbook over the fleet (canary first if asked)."""

from __future__ import annotations

import click

from k26ops import playbook
from k26ops.cli.report import wide_console
from k26ops.rollout import playbook_work, run_rollout


def render_changes(results, *, check: bool, diff: bool) -> None:
    """What changed (or would), the diffs, and any stale lock that was cleared."""
    con = wide_console()
    for r in results:
        for s in r.data.get("steps", []):
            mark = "[yellow]would change[/]" if check else "[yellow]changed[/]"
            for c in s["changes"]:
                con.print(f"  {r.host}: {s['step']}: {mark}: {c}")
            if diff:
                for d in s.get("diffs", []):
                    click.echo(d.rstrip("\n"))  # diffs verbatim, never wrapped
        if r.data.get("stale_lock"):
            o = r.data["stale_lock"]
            con.print(f"  {r.host}: note: a run that died held this host "
                      f"({o.get('user')}@{o.get('control_node')} pid {o.get('pid')} since {o.get('since')})")


def run_playbook(settings, name: str, *, check: bool, diff: bool, canary: int = 0,
                 shared: dict | None = None, title: str | None = None, purpose: str = "deploy",
                 exit: bool = True):
    """Run playbook `name` over the selected hosts; print; exit with the fleet's code."""
    steps = playbook.load(name)
    for step in steps:
        step.before_hosts(settings.selected_hosts())
    return run_rollout(settings, playbook_work(steps, check=check, purpose=purpose, shared=shared),
                       canary=canary, title=title or (f"{name} --check" if check else name),
                       columns=[("release", "release"), ("changed", "_changed"), ("engine", "_engine"),
                                ("health", "_health"), ("smoke", "_smoke")],
                       render=lambda results: render_changes(results, check=check, diff=diff),
                       exit=exit)


@click.command(name="deploy")
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show text diffs of files that would change (secrets redacted).")
@click.option("--playbook", "name", default="deploy", show_default=True, metavar="NAME|PATH",
              help="Playbook to run (playbooks/NAME.yml).")
@click.option("--canary", type=click.IntRange(0), default=0, metavar="N",
              help="Deploy to N hosts first; go on with the rest only if they all succeed.")
@click.pass_obj
def deploy_cmd(settings, check, diff, name, canary):
    """Provision hosts: CUDA 13 toolchain, patched TP8 DDTree engine release, service, health."""
    run_playbook(settings, name, check=check, diff=diff, canary=canary)
