"""`k26ops selftest`: prove each host can run the engine, on its own GPUs.

Per host, over the host's one Session (SSH, or `connection: local`):
  1. one probe: a private temp dir (under <k26ops_root>/state when that
     exists, else /tmp), which python to use, the toolchain's nvcc;
  2. the payload (k26ops/selftest/payload.py) is written there as a file and
     run with the current release's python (<releases_root>/current/venv/bin/
     python, the engine's, with torch and triton) or, when there is no
     release yet, `python3`; the report says which was used. `--python`
     overrides. The temp dir is removed afterwards;
  3. its one JSON document (schema in payload.py) is validated and shown.

Expectations come from the host's inventory vars (the preflight defaults):
gpus_per_host, compute_capability, min_driver, and nvcc (the toolchain's
<k26ops_root>/toolchain/cuda-*/bin/nvcc when present). Optional floors:
selftest_min_tflops, selftest_min_busbw (GB/s; raise it for NVLink hosts).

Timeouts: every check has its own timeout inside the payload (it never hangs
on a wedged driver or NCCL rendezvous). Each host also has a deadline
(`--host-timeout`, default: the sum of the payload's per-check timeouts for
the expected GPU count, plus a margin), enforced on the host with
`timeout(1)` and again on this side; the global `--deadline` still applies.

Running on the GPU host itself: give it an inventory host with
`connection: local` (no address needed), e.g.

    hosts:
      here:
        connection: local
        vars: {gpus_per_host: 1, compute_capability: ["9.0"]}

and `k26ops -i here.yml selftest` (or `facts`, `check`) runs every command
with /bin/sh on this machine: no SSH, no keys.

Output: a line per host (status, headline figures, python used), then for
each host that has GPUs a table of its checks (status, figure, expected,
detail). `--json`: {"hosts": {name: {host, status, error, elapsed, commands,
python, python_source, selftest: <payload document>, headline: {...}}},
"exit_code": N}. `--from-file PATH` shows a payload document saved earlier
(no host is contacted).

Exit codes:
  0  every host passed every check
  1  a check failed, or a host failed / was unreachable / timed out
  2  usage: bad option or inventory (nothing ran)
  3  no check failed, but a host has no GPU (no CUDA device visible to torch,
     or no torch in the python used: the lab's hosts)
A real failure (1) wins over "no GPU" (3) when both occur.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from k26ops.cli import jsonout, tables
from k26ops.cli.report import verbose_events
from k26ops.errors import EXIT_INTERRUPTED, UserError
from k26ops.orchestrate import rollout
from k26ops.selftest import payload as payload_mod
from k26ops.selftest.report import headline, summarize, validate
from k26ops.selftest.run import NO_GPU, classify, exit_code, make_work
from k26ops.transport.fleet import FAILED, OK, HostResult

STATUS_STYLE = {
    "pass": "green",
    "skip": "magenta",
    "fail": "red",
    "timeout": "red",
    "error": "red",
    "no-gpu": "yellow",
    OK: "green",
    FAILED: "red",
    NO_GPU: "yellow",
    "unreachable": "red",
    "interrupted": "magenta",
}
SHOWN = {OK: "pass", NO_GPU: "no GPU"}


def checks_table(doc: dict, title: str | None = None) -> Table:
    """One row per check of a payload document (the report's summarize())."""
    table = Table("check", "status", "figure", "expected", "time", "detail", title=title, title_justify="left")
    for row in summarize(doc):
        st = row["status"]
        table.add_row(
            row["check"],
            f"[{STATUS_STYLE.get(st, 'white')}]{st}[/]",
            row["figure"],
            escape(row["expected"]),
            f"{row['seconds']}s" if row["seconds"] else "",
            escape(row["detail"]),
        )
    return table


def host_line(r: HostResult) -> str:
    """One line per host: status, the few figures that matter, python used, time."""
    st = SHOWN.get(r.status, r.status)
    head = f"[bold]{escape(r.host)}[/]: [{STATUS_STYLE.get(r.status, 'white')}]{st}[/]"
    h = r.data.get("headline") or {}
    figs = []
    if h.get("gpus") is not None:
        figs.append(f"{h['gpus']} GPUs")
    if h.get("min_tflops") is not None:
        figs.append(f"min {h['min_tflops']:g} TFLOP/s")
    if h.get("allreduce_busbw_gbps") is not None:
        figs.append(f"all-reduce {h['allreduce_busbw_gbps']:g} GB/s")
    if h.get("driver"):
        figs.append(f"driver {h['driver']}")
    if h.get("torch"):
        figs.append(f"torch {h['torch']}")
    parts = [head]
    if r.status == NO_GPU:
        parts.append(escape(r.error[len("no GPU: ") :] if r.error else ""))
    elif r.error:
        parts.append(escape(r.error))
    if figs and r.status != NO_GPU:
        parts.append(", ".join(figs))
    if r.data.get("python_used"):
        parts.append(f"[dim]python {escape(r.data['python_used'])}[/]")
    return " — ".join(p for p in parts if p) + f" [dim]({r.elapsed:.1f}s)[/]"


def render(results: list[HostResult], console: Console | None = None) -> None:
    con = console or Console(soft_wrap=True)
    for r in results:
        con.print(host_line(r))
    for r in results:
        doc = r.data.get("selftest")
        if doc and doc.get("status") != "no-gpu":
            seen = doc.get("host")
            table = checks_table(doc, title=r.host if seen in (None, r.host) else f"{r.host} ({seen})")
            if console is None:  # piped: as wide as its content, never wrapped
                tables.print_table(Console(width=max(120, con.width)) if con.is_terminal else con, table)
            else:
                con.print(table)
    counts: dict[str, int] = {}
    for r in results:
        s = SHOWN.get(r.status, r.status)
        counts[s] = counts.get(s, 0) + 1
    con.print(", ".join(f"{n} {s}" for s, n in counts.items()))


def emit_json(results: list[HostResult], code: int) -> None:
    jsonout.emit({"hosts": {r.host: r.to_json() for r in results}}, code)


def from_file(settings, path: str) -> None:
    """Show a saved payload document through the same code as a live run."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read a self-test JSON document: {exc}") from None
    problems = validate(doc)
    if problems:
        raise UserError(f"{path}: not a self-test result: {'; '.join(problems[:3])}")
    r = HostResult(
        str(doc.get("host") or Path(path).stem),
        OK,
        data={"selftest": doc, "headline": headline(doc)},
        elapsed=float(doc.get("duration_s") or 0),
    )
    classify([r])
    code = exit_code([r])
    if settings.as_json:
        emit_json([r], code)
    else:
        render([r])
    sys.exit(code)


@click.command(name="selftest")
@click.option(
    "--python",
    metavar="PATH",
    help="Python on the host to run the payload with (default: the current release's venv python, else python3).",
)
@click.option(
    "--checks",
    metavar="NAME[,NAME]",
    help="Only these checks (gpus always runs): " + ",".join(payload_mod.CHECKS) + ".",
)
@click.option(
    "--host-timeout",
    type=click.FloatRange(10),
    default=None,
    metavar="SECONDS",
    help="Deadline per host (default: the sum of the payload's per-check timeouts + 120s).",
)
@click.option(
    "--timeout-scale",
    type=click.FloatRange(0.1, 100),
    default=1.0,
    show_default=True,
    help="Multiply every per-check timeout.",
)
@click.option(
    "--min-tflops",
    type=click.FloatRange(0),
    default=None,
    help="Per-GPU bf16 floor (default: by compute capability; host var selftest_min_tflops).",
)
@click.option(
    "--min-busbw",
    type=click.FloatRange(0),
    default=None,
    help="All-reduce bus bandwidth floor, GB/s (default 10; host var selftest_min_busbw).",
)
@click.option(
    "--from-file",
    "saved",
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help="Show a payload JSON saved earlier instead of running (no host contacted).",
)
@click.pass_obj
def selftest_cmd(settings, python, checks, host_timeout, timeout_scale, min_tflops, min_busbw, saved):
    """Run the GPU self-test on each host: GPUs, versions, CUDA graphs, Triton,
    bf16 matmul, NCCL all-reduce, nvcc.

    Exit 0 all pass; 1 a check or host failed; 2 usage; 3 a host has no GPU.
    """
    if saved:
        from_file(settings, saved)
    if checks:
        unknown = [c for c in checks.split(",") if c and c not in payload_mod.CHECKS]
        if unknown:
            raise UserError(f"--checks: unknown check(s) {','.join(unknown)} (known: {','.join(payload_mod.CHECKS)})")
    opts = {
        "python": python,
        "checks": checks,
        "host_timeout": host_timeout,
        "timeout_scale": timeout_scale,
        "min_tflops": min_tflops,
        "min_busbw": min_busbw,
    }
    err = Console(stderr=True)
    t0 = time.monotonic()
    run = rollout.run(
        settings.selected_hosts(), make_work(opts), settings.fleet_options(), on_event=verbose_events(settings)
    )
    results = run.results
    classify(results)
    code = EXIT_INTERRUPTED if run.interrupted else exit_code(results)
    if settings.as_json:
        emit_json(results, code)
    else:
        render(results)
        if settings.verbose and not run.interrupted:
            err.print(f"[dim]selftest took {time.monotonic() - t0:.1f}s[/dim]")
    if run.interrupted:
        click.echo(f"k26ops: {run.interrupted}", err=True)
    sys.exit(code)
