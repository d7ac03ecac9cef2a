"""`k26ops rehearse`: start the release's own engine with the unit's command
line on dummy weights, serve a few requests, stop it (k26ops.rehearsal)."""

from __future__ import annotations

import json

import click

from k26ops.cli.rehearseopts import options_from, rehearsal_options
from k26ops.cli.report import wide_console
from k26ops.cli.rollout import run_rollout
from k26ops.enginebench.run import parse_list
from k26ops.errors import UserError
from k26ops.host.lock import HostLock, HostLocked
from k26ops.rehearsal import plan, summary
from k26ops.rehearsal.run import rehearse
from k26ops.safefiles import OutDir
from k26ops.steps import StepFailed, session_context
from k26ops.transport.fleet import Outcome


@click.command(name="rehearse")
@rehearsal_options
@click.option("--release", metavar="ID", help="Rehearse this release (default: the one `current` points to).")
@click.option("--alongside", is_flag=True, help="Rehearse beside a serving engine, in the GPUs' free memory.")
@click.option(
    "--stop-serving",
    is_flag=True,
    help="Stop the serving engine for the rehearsal; it is started again and waited for after.",
)
@click.option(
    "--probe",
    is_flag=True,
    help="Apply the None-field probe to the release for the rehearsal (reverted after, checked byte-exact).",
)
@click.option("--no-bench", is_flag=True, help="Skip the short bench after the smoke requests.")
@click.option("--concurrency", default="1,4", show_default=True, metavar="LIST", help="Bench concurrencies.")
@click.option("--temperatures", default="0", show_default=True, metavar="LIST", help="Bench temperatures.")
@click.option(
    "--input-len",
    type=click.IntRange(1, 100_000),
    default=plan.Options.input_len,
    show_default=True,
    help="Bench prompt length, token ids.",
)
@click.option(
    "--output-len",
    type=click.IntRange(1, 100_000),
    default=plan.Options.output_len,
    show_default=True,
    help="Bench output tokens per request.",
)
@click.option(
    "--num-prompts",
    type=click.IntRange(1, 100_000),
    default=plan.Options.num_prompts,
    show_default=True,
    help="Bench requests per cell.",
)
@click.option(
    "--save-log",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Write each host's engine log and report to DIR/<host>.log and DIR/<host>.json.",
)
@click.pass_obj
def rehearse_cmd(
    settings,
    release,
    alongside,
    stop_serving,
    probe,
    no_bench,
    concurrency,
    temperatures,
    input_len,
    output_len,
    num_prompts,
    save_log,
    **kw,
):
    """Rehearse the engine on dummy weights: the unit's flags, CUDA graphs, smoke, short bench."""
    if alongside and stop_serving:
        raise UserError("--alongside and --stop-serving exclude each other")
    opts = options_from(
        kw,
        release=release,
        probe=probe,
        bench=not no_bench,
        serving="alongside" if alongside else "stop" if stop_serving else "refuse",
        concurrency=parse_list(concurrency, int, "concurrency"),
        temperatures=parse_list(temperatures, float, "temperatures"),
        input_len=input_len,
        output_len=output_len,
        num_prompts=num_prompts,
    )
    if release is not None and (not release or "/" in release or release.startswith(".")):
        raise UserError(f"--release: not a release id: {release!r}")
    out = OutDir.open(save_log, "--save-log") if save_log else None  # refused before any host is touched

    def work(session, progress):
        ctx = session_context(session)
        ctx.progress = progress
        # the host lock, as a deploy's: no deploy starts the serving engine while the rehearsal holds the GPUs
        lock = HostLock(session, ctx.state_dir, "rehearse")
        try:
            lock.acquire()
        except HostLocked as exc:
            raise StepFailed(f"rehearsal not started: {exc}") from None
        try:
            rep = rehearse(ctx, opts, progress=progress)
        except Exception as exc:
            rep = getattr(exc, "report", None)
            if rep is not None:
                _save(out, session.host.name, rep)
                rep.pop("_log", None)
            raise
        finally:
            lock.release()
        _save(out, session.host.name, rep)
        rep.pop("_log", None)
        return Outcome(False, rehearsal=rep, **_columns(rep))

    run_rollout(
        settings,
        work,
        title="rehearse",
        stopped="not rehearsed",
        columns=[
            ("state", "_state"),
            ("ready", "_ready"),
            ("graphs", "_capture"),
            ("accept", "_accept"),
            ("tok/s", "_toks"),
        ],
        render=_render,
    )


def _columns(rep: dict) -> dict:
    f = summary.figures(rep)  # the one format of each figure, also the deploy's rehearsal line
    return {
        "_state": f["state"],
        "_ready": f["ready"],
        "_capture": f["capture"],
        "_accept": f["accept"],
        "_toks": f["tok/s"],
    }


def _save(out: OutDir | None, host: str, rep: dict) -> None:
    if out is None:
        return
    out.write(f"{host}.log", rep.get("_log") or "")
    out.write(f"{host}.json", json.dumps({k: v for k, v in rep.items() if k != "_log"}, indent=1) + "\n")


def _render(results) -> None:
    con = wide_console()
    for r in results:
        rep = r.data.get("rehearsal") or {}
        for k in ("_state", "_ready", "_capture", "_accept", "_toks"):
            r.data.pop(k, None)
        if not rep:
            continue
        con.rule(f"{r.host}: rehearsal of {rep.get('release')}")
        if rep.get("runner"):
            con.print(
                f"ran as {rep['runner']}; CUDA graphs {'on' if rep.get('cuda_graphs') else 'off'}", highlight=False
            )
        for line in rep.get("changes") or []:
            con.print(f"  changed: {line}", highlight=False)
        for line in rep.get("notes") or []:
            con.print(f"  note: {line}", highlight=False)
        for c in (rep.get("capture") or {}).get("captures") or []:
            con.print(f"  CUDA graph capture ({c['graph']}): {c['seconds']:g} s", highlight=False)
        for name, s in (rep.get("smoke") or {}).items():
            acc = summary.figures({"accept_length": s.get("spec_accept_length")})["accept"]
            con.print(
                f"  smoke {name}: HTTP {s.get('status')}, {s.get('latency_s', 0) * 1000:.0f} ms, "
                f"{s.get('completion_tokens')} tokens, accept {acc or '-'}",
                highlight=False,
            )
        for cell in (rep.get("bench") or {}).get("cells") or []:
            f = cell["figures"]
            shown = summary.figures(
                {"accept_length": (f.get("accept") or {}).get("median"), "tok_s": (f.get("tok/s") or {}).get("median")}
            )
            con.print(
                f"  bench c{cell['concurrency']}/t{cell['temperature']:g}: "
                f"{shown['tok/s'] or '-'} tok/s, accept {shown['accept'] or '-'}",
                highlight=False,
            )
        probe = rep.get("probe")
        if probe:
            con.print(
                f"  probe {probe.get('patch')}: watched {probe.get('watched') or 'nothing'}; "
                f"reverted byte-exact: {probe.get('byte_exact')}",
                highlight=False,
            )
        cl = rep.get("cleanup") or {}
        con.print(
            "  cleanup: "
            + "; ".join(cl.get("done") or [])
            + (f"; LEFT: {', '.join(cl['left'])}" if cl.get("left") else "; nothing left behind"),
            highlight=False,
        )
