"""`k26ops deploy`: run the deploy playbook over the fleet."""

from __future__ import annotations

import threading
import time

import click
from rich.console import Console

from k26ops import playbook
from k26ops.cli.report import run_and_report


class Progress:
    """One line per event on stderr: elapsed time, host, what it is doing."""

    def __init__(self, quiet: bool):
        self.t0 = time.monotonic()
        self.quiet = quiet
        self.err = Console(stderr=True, highlight=False)
        self.lock = threading.Lock()

    def for_host(self, name: str):
        def say(msg: str) -> None:
            if self.quiet:
                return
            with self.lock:
                self.err.print(f"[dim]{time.monotonic() - self.t0:6.1f}s[/] {name}: {msg}")
        return say


def run_playbook(settings, name: str, *, check: bool, diff: bool, shared: dict | None = None,
                 title: str | None = None, purpose: str = "deploy", canary: int = 0) -> None:
    steps = playbook.load(name)
    progress = Progress(settings.as_json)

    def work(session):
        return playbook.run_on_host(session, steps, check=check, shared=shared,
                                    progress=progress.for_host(session.host.name), purpose=purpose)

    def render(results):
        con = Console(highlight=False)
        for r in results:
            for s in r.data.get("steps", []):
                mark = "[yellow]would change[/]" if check else "[yellow]changed[/]"
                for c in s["changes"]:
                    con.print(f"  {r.host}: {s['step']}: {mark}: {c}")
                if diff:
                    for d in s.get("diffs", []):
                        con.print(d, markup=False)
            if r.data.get("stale_lock"):
                o = r.data["stale_lock"]
                con.print(f"  {r.host}: note: cleared a stale lock of a run that died "
                          f"({o.get('user')}@{o.get('control_node')} pid {o.get('pid')} since {o.get('since')})")

    def summary(r):
        steps_ = r.get("steps", [])
        changed = [s["step"] for s in steps_ if s["changed"]]
        return ", ".join(changed) if changed else ("nothing to change" if steps_ else None)

    run_and_report(settings, work, title=title or ("deploy --check" if check else "deploy"),
                   columns=[("release", "release"), ("changed steps", "summary")], render=render,
                   summarize=summary, canary=canary)


@click.command(name="deploy")
@click.option("--check", is_flag=True, help="Change nothing; say what would change.")
@click.option("--diff", is_flag=True, help="Show text diffs of files that would change.")
@click.option("--playbook", "name", default="deploy", show_default=True, metavar="NAME|PATH",
              help="Playbook to run (playbooks/NAME.yml).")
@click.option("--canary", type=click.IntRange(0), default=0, metavar="N",
              help="Deploy to N hosts first; go on only if they all succeed.")
@click.pass_obj
def deploy_cmd(settings, check, diff, name, canary):
    """Provision hosts: CUDA 13 toolchain, patched TP8 DDTree engine release, service."""
    run_playbook(settings, name, check=check, diff=diff, canary=canary)
