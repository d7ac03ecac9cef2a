"""`k26ops bench`: the engine's speed and acceptance on each host, measured
from the host itself; `--compare TAG` sets each figure beside a baseline's."""

from __future__ import annotations

import functools
import sys

import click
from click.core import ParameterSource
from rich.table import Table

from k26ops.cli import htmlreport, tables
from k26ops.cli.report import wide_console
from k26ops.cli.rollout import run_rollout
from k26ops.engine.multinode import serves_http
from k26ops.enginebench import figures as figs
from k26ops.enginebench.run import GENERATORS, METRICS, BenchSpec, cell_key, parse_list, run_host
from k26ops.enginebench.stored import baseline_for, stored_benches
from k26ops.errors import UserError
from k26ops.steps import HostContext
from k26ops.transport.fleet import Outcome, exit_code

BASELINES_DEFAULT = "$K26OPS_BASELINES, else the config file's `baselines`, else ~/.local/share/k26ops/baselines"


def baselines_option(what: str = "Baselines git repository"):
    """--baselines with the default the library uses (k26ops.baselines.repo.default_dir)."""
    return click.option(
        "--baselines",
        "baselines_dir",
        metavar="DIR",
        envvar="K26OPS_BASELINES",
        help=f"{what} (default: {BASELINES_DEFAULT}).",
    )


BASELINES_OPT = baselines_option()


def bench_options(fn):
    """The bench's options (also on `snapshot --bench`)."""
    opts = [
        click.option(
            "--concurrency",
            "concurrency",
            default="1,4,16",
            show_default=True,
            metavar="LIST",
            help="Concurrent requests, a comma list.",
        ),
        click.option(
            "--temperatures",
            default="0,0.7",
            show_default=True,
            metavar="LIST",
            help="Sampling temperatures, a comma list (0 = greedy).",
        ),
        click.option(
            "--input-len",
            type=click.IntRange(1, 1_000_000),
            default=1024,
            show_default=True,
            help="Prompt length (tokens for SGLang's benchmark; words for k26ops' loadgen).",
        ),
        click.option(
            "--output-len",
            type=click.IntRange(1, 1_000_000),
            default=256,
            show_default=True,
            help="Output tokens per request (ignore_eos: every request makes exactly this many).",
        ),
        click.option(
            "--num-prompts",
            type=click.IntRange(0),
            default=0,
            metavar="N",
            help="Requests per cell (default: 4 x concurrency, at least 8).",
        ),
        click.option("--seed", type=int, default=1, show_default=True, help="Prompt seed (run i uses seed + i)."),
        click.option(
            "--runs",
            type=click.IntRange(1, 100),
            default=5,
            show_default=True,
            help="Repeats; each figure is their median, with min-max. 5: the fewest with which "
            "--compare can tell a change from noise (enginebench/figures.py judge).",
        ),
        click.option(
            "--generator",
            type=click.Choice(GENERATORS),
            default="auto",
            show_default=True,
            help="auto: SGLang's serving benchmark when the release venv imports it, else k26ops' own.",
        ),
    ]
    return functools.reduce(lambda f, o: o(f), reversed(opts), fn)


def spec_from(opts: dict) -> BenchSpec:
    return BenchSpec(
        concurrency=parse_list(opts["concurrency"], int, "concurrency"),
        temperatures=parse_list(opts["temperatures"], float, "temperatures"),
        input_len=opts["input_len"],
        output_len=opts["output_len"],
        seed=opts["seed"],
        runs=opts["runs"],
        num_prompts=opts["num_prompts"],
        generator=opts["generator"],
    )


BENCH_KEYS = ("concurrency", "temperatures", "input_len", "output_len", "num_prompts", "seed", "runs", "generator")


def _stat(s: dict | None) -> str:
    if not s:
        return "-"
    n = figs.plain_number
    if s["n"] > 1 and s["min"] != s["max"]:
        return f"{n(s['median'])} ({n(s['min'])}-{n(s['max'])})"
    return n(s["median"])


def render_bench(host: str, bench: dict, con=None) -> None:
    con = con or wide_console()
    spec = bench.get("spec") or {}
    con.rule(f"{host}: {bench.get('generator')}", style="cyan")
    con.print(
        f"generator {bench.get('generator')} ({bench.get('generator_why')}); input {spec.get('input_len')}, "
        f"output {spec.get('output_len')}, seed {spec.get('seed')}, median of {spec.get('runs')} run(s) "
        "(min-max in brackets)",
        highlight=False,
        markup=False,
    )
    table = Table("cell", *[METRICS[m][1] for m in METRICS], box=None)
    for cell in bench.get("cells") or []:
        f = cell.get("figures") or {}
        table.add_row(cell_key(cell["concurrency"], cell["temperature"]), *[_stat(f.get(m)) for m in METRICS])
    for col in table.columns:
        col.overflow = "fold"  # a terminal folds a long range, never cuts it with "…"
    tables.print_table(con, table)


def render_compare(host: str, base_host: str, tag: str, bench: dict, base: dict, con=None) -> None:
    con = con or wide_console()
    rows = figs.compare(bench, base)
    title = f"{host} vs {tag}" + (f" (baseline host {base_host})" if base_host != host else "")
    table = Table("figure", "what", f"{tag}", "now", "change", "verdict", "why", title=title, box=None)
    for r in rows:
        pct = "-" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
        word = r["verdict"] if r["verdict"] == figs.NOISE else f"{r['verdict']} ({r['better']} is better)"
        style = {"worse": "red", "better": "green"}.get(r["verdict"], "")
        table.add_row(
            r["figure"],
            r["label"],
            _stat({"median": r["baseline"], "min": r["baseline_min"], "max": r["baseline_max"], "n": r["baseline_n"]}),
            _stat({"median": r["current"], "min": r["current_min"], "max": r["current_max"], "n": r["current_n"]}),
            pct,
            f"[{style}]{word}[/]" if style else word,
            r["why"],
        )
    for col in table.columns:
        col.overflow = "fold"  # a terminal folds a long range, never cuts it with "…"
    tables.print_table(con, table)
    con.print(
        f"median (min-max) of each side's runs; better or worse only when the ranges do not overlap and "
        f"that is unlikely from noise (exact rank test, p <= {figs.ALPHA:g})",
        highlight=False,
        markup=False,
    )
    for d in figs.spec_differences(bench, base):
        con.print(
            f"note: {host}: settings differ from the baseline's ({d}): figures may not compare",
            highlight=False,
            markup=False,
        )


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
