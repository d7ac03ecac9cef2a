"""Options and renderers shared by the commands that bench or read bench results (bench, deploy's gate, snapshot, rollback, monitoring, report): the baselines repository option, the bench options and spec, the bench tables."""

from __future__ import annotations

import functools

import click
from rich.table import Table

from k26ops.cli import tables
from k26ops.cli.report import wide_console
from k26ops.enginebench import figures as figs
from k26ops.enginebench.run import GENERATORS, METRICS, BenchSpec, cell_key, parse_list

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
