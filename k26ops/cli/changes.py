"""What a playbook run changed (or would), shown under its table: each step's changes, the diffs in git's colours, a rehearsal's line, a stale lock cleared. Shared by deploy, provision, gateway, snapshot and rollback."""

from __future__ import annotations

import click

from k26ops.cli.report import wide_console
from k26ops.rehearsal import summary as rehearsal_summary

DIFF_STYLE = (
    ("+++", {"bold": True}),
    ("---", {"bold": True}),
    ("@@", {"fg": "cyan"}),
    ("+", {"fg": "green"}),
    ("-", {"fg": "red"}),
)


def colour_diff(text: str) -> str:
    """A unified diff with git's colours; click.echo drops them when stdout is not
    a terminal, so a pipe or a file gets the diff verbatim."""
    out = []
    for line in text.split("\n"):
        style = next((st for mark, st in DIFF_STYLE if line.startswith(mark)), None)
        out.append(click.style(line, **style) if style else line)
    return "\n".join(out)


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
                    click.echo(colour_diff(d.rstrip("\n")))  # never wrapped; colour on a terminal only
        if r.data.get("rehearsal"):  # deploy --rehearse: what the rehearsal measured, one line
            con.print(f"  {r.host}: {rehearsal_summary.line(r.data['rehearsal'])}", highlight=False)
        if r.data.get("stale_lock"):
            o = r.data["stale_lock"]
            con.print(
                f"  {r.host}: note: a run that died held this host "
                f"({o.get('user')}@{o.get('control_node')} pid {o.get('pid')} since {o.get('since')})"
            )
