"""`k26ops diagnose` commands: name the crash in an SGLang log.

`log` works on a local file or stdin (no hosts). The remote workflows
(`service`, `cuda-graph`) build on `k26ops.diagnose.classify`.
"""

from __future__ import annotations

import json
import sys

import click

from k26ops.errors import UserError


@click.group(name="diagnose")
def group():
    """Recognise known SGLang crash signatures and say what to do."""


def _read(path: str) -> str:
    if path == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a log file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _print_human(d) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False, soft_wrap=True)
    colour = "yellow" if d.signature == "unclassified" else "red"
    console.print(f"[bold {colour}]{d.signature}[/]" + (f"  {escape(d.title)}" if d.title else ""))
    if d.evidence:
        at = f" (line {d.line})" if d.line else ""
        console.print(f"[bold]evidence{at}:[/] {escape(d.evidence)}")
    where = [f"{k} {v}" for k, v in (("rank", d.rank), ("phase", d.phase),
                                      ("algorithm", d.algorithm)) if v]
    if where:
        console.print(f"[bold]where:[/] {escape(', '.join(where))}")
    if d.detail:
        console.print("[bold]detail:[/] " + escape(", ".join(f"{k}={v}" for k, v in d.detail.items())))
    console.print(f"[bold]suggestion:[/] {escape(d.suggestion)}")


@group.command(name="log")
@click.argument("file", metavar="FILE|-")
@click.pass_context
def log_cmd(ctx, file):
    """Classify a local SGLang log (a file, or - for stdin)."""
    from k26ops.diagnose.classify import classify

    diagnosis = classify(_read(file))
    settings = ctx.find_root().obj
    if getattr(settings, "as_json", False):
        click.echo(json.dumps(diagnosis.to_json(), indent=2))
    else:
        _print_human(diagnosis)
