"""`k26ops report`: the HTML report of a saved run or of two baselines."""

from __future__ import annotations

import click

from k26ops.cli import jsonout
from k26ops.cli.benchopts import baselines_option
from k26ops.cli.htmlreport import inventory_gpus, read_run, report_option, stamp, write
from k26ops.enginebench.stored import stored_benches
from k26ops.errors import UserError
from k26ops.report import model


@click.command(name="report")
@click.argument("run_json", required=False, metavar="[RUN.json]", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--compare",
    "tags",
    nargs=2,
    metavar="OLD NEW",
    help="Two baseline tags: NEW's stored bench beside OLD's (`snapshot --bench`).",
)
@report_option("it")
@click.option(
    "--gpus",
    type=click.IntRange(1, 4096),
    metavar="N",
    help="GPUs per host for tok/s per GPU (default: from each host's engine profile, else 8).",
)
@baselines_option()
@click.pass_obj
def report_cmd(settings, run_json, tags, report_path, gpus, baselines_dir):
    """One self-contained HTML page (no server, no network): tok/s against concurrency, tok/s per
    user against per GPU, accept length, TTFT/ITL percentiles, the gate's verdict, new beside
    baseline. From a saved run (`k26ops --json bench --compare TAG > run.json`, `deploy --gate`)
    or from two baselines (--compare OLD NEW)."""
    if bool(run_json) == bool(tags):
        raise UserError(
            "report: give a saved run (RUN.json, from `k26ops --json bench ...`) or --compare OLD NEW, one of the two"
        )
    per = (lambda names: {n: gpus for n in names}) if gpus else None
    if tags:
        old, new = (stored_benches(baselines_dir, t) for t in tags)
        g = per(new) if per else inventory_gpus(settings)
        view = model.from_baselines(tags[0], old, tags[1], new, gpus=g, generated=stamp())
        tag = f"{tags[0]}-vs-{tags[1]}"
    else:
        doc = read_run(run_json)
        g = per(doc.get("hosts") or {}) if per else inventory_gpus(settings)
        view = model.from_run(doc, gpus=g, generated=stamp(), source=run_json)
        tag = view.baseline_label
    where = write(view, report_path, tag)
    if settings.as_json:
        jsonout.emit({"report": str(where), "kind": view.kind, "hosts": {v.host: {} for v in view.hosts}})
    else:
        click.echo(f"report written to {where}")
