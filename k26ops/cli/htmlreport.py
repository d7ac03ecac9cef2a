"""Writing the HTML report (k26ops.report): the `--report PATH` option and the one
helper `bench --compare` and `deploy --gate` call after their run (`k26ops report`
itself is k26ops.cli.commands.report_cmd)."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import click

from k26ops.engine import profile
from k26ops.errors import UserError
from k26ops.report import files, model, page


def report_option(what: str):
    return click.option(
        "--report",
        "report_path",
        metavar="PATH",
        type=click.Path(dir_okay=False),
        help=f"Write the HTML report of {what} here (default: a new file in "
        "$XDG_DATA_HOME/k26ops/reports, ~/.local/share/k26ops/reports when unset).",
    )


def now() -> datetime:
    return datetime.now(timezone.utc)


def write(view: model.ReportView, path: str | None, tag: str | None = None) -> Path:
    """Write the page (atomically: a reader never sees half of it); returns where."""
    target = Path(path) if path else files.default_path(view.kind, tag, now())
    target = target.expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".k26ops-report-", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page.build_html(view))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        raise UserError(f"--report {target}: cannot write the report: {exc.strerror or exc}") from None
    return target


def gpus_of(hosts) -> dict[str, int]:
    """Each selected host's GPU count from its engine profile (8 when its recipe cannot be read)."""
    out = {}
    for h in hosts:
        try:
            out[h.name] = files.gpus_per_host(profile.profile_for(h.vars, profile.recipe_for(h.vars)))
        except UserError:
            out[h.name] = 8
    return out


def after_run(settings, results, command: str, path: str | None, *, stored=None, tag=None) -> None:
    """Write the report of a run that just ended and say where (stderr: --json keeps stdout)."""
    doc = {"command": command, "hosts": {r.host: r.to_json() for r in results}}
    try:
        gpus = gpus_of(settings.selected_hosts())
        view = model.from_run(doc, stored=stored, gpus=gpus, generated=stamp())
    except UserError as exc:
        click.echo(f"k26ops: no report written: {exc}", err=True)
        return
    where = write(view, path, tag)
    click.echo(f"report written to {where}", err=True)


def stamp() -> str:
    return now().strftime("%Y-%m-%d %H:%M UTC")


def inventory_gpus(settings) -> dict[str, int]:
    try:
        return gpus_of(settings.selected_hosts())
    except UserError:  # no inventory at hand: a saved run is drawn anywhere
        return {}


def read_run(path: str) -> dict:
    try:
        text = click.get_text_stream("stdin").read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text (a k26ops --json run document)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
