"""`k26ops bench`: the engine's speed and acceptance on each host, measured
from the host itself; `--compare TAG` sets each figure beside a baseline's."""

from __future__ import annotations

import sys

import click
from click.core import ParameterSource

from k26ops.cli import htmlreport
from k26ops.cli.benchopts import (
    BASELINES_OPT,
    BENCH_KEYS,
    bench_options,
    render_bench,
    render_compare,
    spec_from,
)
from k26ops.cli.report import wide_console
from k26ops.cli.rollout import run_rollout
from k26ops.engine.multinode import serves_http
from k26ops.enginebench import figures as figs
from k26ops.enginebench.run import BenchSpec, cell_key, run_host
from k26ops.enginebench.stored import baseline_for, stored_benches
from k26ops.errors import UserError
from k26ops.steps import HostContext
from k26ops.transport.fleet import Outcome, exit_code


@click.command(name="bench")
@bench_options
@click.option(
    "--compare",
    "compare_tag",
    metavar="TAG",
    help="Measure the baseline's own cells and settings (options given here win) and set each figure "
    "beside its, with % change; better or worse only beyond the runs' spread, else within noise.",
)
@BASELINES_OPT
@htmlreport.report_option("the bench (written with --compare or when this is given)")
@click.pass_obj
def bench_cmd(settings, compare_tag, baselines_dir, report_path, **opts):
    """Measure the engine on each host, from the host itself (loopback): output tok/s,
    requests/s, TTFT and ITL (median, p99), spec accept length, per concurrency and temperature."""
    spec = spec_from(opts)
    stored = stored_benches(baselines_dir, compare_tag) if compare_tag else {}
    if compare_tag and not stored:
        raise UserError(
            f"baseline {compare_tag!r} has no bench results (take one with `k26ops snapshot --tag NAME --bench`)"
        )
    # --compare measures the baseline's own cells and settings, except what the command line gives
    src = click.get_current_context().get_parameter_source
    given = {k: opts[k] for k in BENCH_KEYS if src(k) == ParameterSource.COMMANDLINE}

    def spec_for(host: str) -> BenchSpec:
        if not compare_tag:
            return spec
        base = baseline_for(stored, host)[1].get("spec") or {}
        return BenchSpec.from_json(figs.spec_for_compare(base, spec.to_json(), set(given)))

    def work(session, progress):
        ctx = HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
        if not serves_http(ctx.vars):
            return Outcome(generator=f"- (node rank {ctx.vars.get('node_rank')}: benched on rank 0)")
        hs = spec_for(session.host.name)
        b = run_host(ctx, hs, progress)
        out = Outcome(bench=b, generator=b["generator"])
        f = figs.flatten(b)
        first = cell_key(hs.concurrency[0], hs.temperatures[0])
        out["tok_s"] = round((f.get(f"tok/s@{first}") or {}).get("median") or 0, 1) or None
        out["accept"] = (f.get(f"accept@{first}") or {}).get("median")
        if compare_tag:
            got = baseline_for(stored, session.host.name)
            out["compare"] = {
                "tag": compare_tag,
                "baseline_host": got[0],
                "rows": figs.compare(b, got[1]),
                "settings_differ": figs.spec_differences(b, got[1]),
            }
        return out

    hosts = settings.selected_hosts()
    shown = spec_for(hosts[0].name) if hosts else spec  # the first cell the table shows
    first = cell_key(shown.concurrency[0], shown.temperatures[0])
    results = run_rollout(
        settings,
        work,
        canary=0,
        title="engine bench",
        exit=False,
        columns=[("generator", "generator"), (f"tok/s {first}", "tok_s"), (f"accept {first}", "accept")],
    )
    if not settings.as_json:
        con = wide_console()
        for r in results:
            if "bench" not in r.data:
                continue
            render_bench(r.host, r.data["bench"], con)
            if compare_tag:
                base_host, base = baseline_for(stored, r.host)
                render_compare(r.host, base_host, compare_tag, r.data["bench"], base, con)
    if compare_tag or report_path:
        htmlreport.after_run(settings, results, "bench", report_path, stored=stored or None, tag=compare_tag)
    sys.exit(exit_code(results))
