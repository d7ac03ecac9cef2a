"""One host's engine bench: pick the generator, run every (concurrency,
temperature) cell `runs` times from the host itself, and keep each figure's
median with its min-max (noise shown, not hidden)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

from k26ops.engine.host import EngineHost, poll_target
from k26ops.enginebench import accept
from k26ops.errors import UserError
from k26ops.shell import q
from k26ops.steps import StepFailed
from k26ops.transport import agents

GENERATORS = ("auto", "sglang", "k26ops")
OWN = "k26ops loadgen"  # else the generator is named by SGLang's module that ran

# figure metric -> (key in the agent's metrics, label, +1 higher is better / -1 lower is better)
METRICS = {
    "tok/s": ("output_throughput", "output tok/s", 1),
    "req/s": ("request_throughput", "requests/s", 1),
    "ttft_p50_ms": ("median_ttft_ms", "TTFT median ms", -1),
    "ttft_p99_ms": ("p99_ttft_ms", "TTFT p99 ms", -1),
    "itl_p50_ms": ("median_itl_ms", "ITL median ms", -1),
    "itl_p99_ms": ("p99_itl_ms", "ITL p99 ms", -1),
    "e2e_p99_ms": ("p99_e2e_latency_ms", "end-to-end p99 ms", -1),  # the default drain_timeout (k26ops.traffic)
    "accept": ("accept_length", "spec accept length", 1),
}
# start-up figures (`ready_s@start`): the last start k26ops made on the host (its time to first good
# token, Layout.last_start_file) -> (key in its ttfgt record, label, -1: lower is better)
START_METRICS = {
    "ttfgt_s": ("total_s", "time to first good token s", -1),
    "ready_s": ("ready_s", "start to ready s", -1),
    "first_sampled_s": ("first_sampled_s", "ready to first sampled answer s", -1),
    "capture_s": ("capture_s", "CUDA-graph capture s", -1),
}


@dataclass
class BenchSpec:
    concurrency: list[int]
    temperatures: list[float]
    input_len: int = 1024
    output_len: int = 256
    seed: int = 1
    runs: int = 3
    num_prompts: int = 0  # per cell; 0: 4 x concurrency, at least 8
    generator: str = "auto"

    def prompts(self, c: int) -> int:
        return self.num_prompts or max(8, 4 * c)

    def cells(self) -> list[tuple[int, float]]:
        return [(c, t) for t in self.temperatures for c in self.concurrency]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "BenchSpec":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def parse_list(text: str, kind, what: str) -> list:
    """'1,4,16' -> [1, 4, 16]; one clear line for anything else."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            v = kind(part)
        except ValueError:
            raise UserError(
                f"--{what}: {part!r} is not a {'number' if kind is float else 'whole number'} "
                f"(give a comma list, e.g. {'0,0.7' if kind is float else '1,4,16'})"
            ) from None
        if (kind is int and v < 1) or (kind is float and not 0 <= v <= 2):
            raise UserError(f"--{what}: {part} is out of range ({'>= 1' if kind is int else '0 to 2'})")
        if v not in out:
            out.append(v)
    if not out:
        raise UserError(f"--{what}: empty list")
    return out


def cell_key(c: int, t: float) -> str:
    return f"c{c}/t{t:g}"


def agent(session, op: str, timeout: float, **req) -> dict:
    return agents.run(session, "loadgen", op, timeout, what="bench agent", **req)


def target(ctx) -> dict:
    """The host's engine as deploy runs it: loopback address, port, model, release venv python."""
    eh = EngineHost(ctx)
    profile = eh.profile()
    host, port = poll_target(profile)
    model = str(profile.get("served_model_name") or profile.get("model_path") or "")
    return {
        "host": host,
        "port": port,
        "model": model,
        "tokenizer": str(profile.get("model_path") or model),
        "python": f"{eh.layout.current}/venv/bin/python",
        "api_key": eh.api_key(),
    }


def choose_generator(session, spec: BenchSpec, t: dict) -> tuple[str, str]:
    if spec.generator == "k26ops":
        return OWN, "asked for (--generator k26ops)"
    probe = agent(session, "probe", timeout=360, python=t["python"])
    if probe["available"]:
        t["module"] = probe["module"]
        return probe["module"], probe["why"]
    if spec.generator == "sglang":
        raise StepFailed(f"--generator sglang: {probe['why']}")
    return OWN, probe["why"]


def run_host(
    ctx, spec: BenchSpec, progress=lambda m: None, *, target_override: dict | None = None, extra: dict | None = None
) -> dict:
    """Bench one host; raise StepFailed when a cell gets no answer at all.
    `target_override`: another engine than the unit's (a rehearsal's); `extra`:
    more of the load generator's request (token_ids: an engine without tokenizer)."""
    t = dict(target_override) if target_override else target(ctx)
    t0 = time.monotonic()
    progress("bench: checking for sglang.bench_serving")
    gen, why = choose_generator(ctx.session, spec, t)
    op = "loadgen" if gen == OWN else "bench_serving"
    raw: dict[str, list[dict]] = {}
    cells = spec.cells()
    for run in range(spec.runs):
        for i, (c, temp) in enumerate(cells, 1):
            progress(
                f"bench ({gen}): run {run + 1}/{spec.runs}, cell {i}/{len(cells)}: "
                f"concurrency {c}, temperature {temp:g}"
            )
            r = agent(
                ctx.session,
                op,
                timeout=3700,
                module=t.get("module"),
                host=t["host"],
                port=t["port"],
                model=t["model"],
                tokenizer=t["tokenizer"],
                python=t["python"],
                concurrency=c,
                temperature=temp,
                num_prompts=spec.prompts(c),
                input_len=spec.input_len,
                output_len=spec.output_len,
                seed=spec.seed + run,
                api_key=t["api_key"],
                **(extra or {}),
            )
            if not r.get("ok"):
                raise StepFailed(
                    f"bench {cell_key(c, temp)} on {t['host']}:{t['port']}: "
                    f"{r.get('error') or '; '.join(r.get('errors') or []) or 'no request completed'}"
                )
            raw.setdefault(cell_key(c, temp), []).append(r["metrics"])
    out_cells = []
    for c, temp in cells:
        runs = raw[cell_key(c, temp)]
        figs = {}
        for name, (key, _label, _better) in METRICS.items():
            vals = [m[key] for m in runs if m.get(key) is not None]
            if vals:
                figs[name] = {
                    "median": round(statistics.median(vals), 4),
                    "min": round(min(vals), 4),
                    "max": round(max(vals), 4),
                    "n": len(vals),
                }
        out_cells.append(
            {
                "concurrency": c,
                "temperature": temp,
                "figures": figs,
                "failed_requests": sum(m.get("failed") or 0 for m in runs),
                "accept_source": runs[-1].get("accept_source"),
                **accept.histogram_field([m.get("accept_histogram") for m in runs]),
            }
        )
    progress(f"bench: done ({gen})")
    out = {
        "generator": gen,
        "generator_why": why,
        "spec": spec.to_json(),
        "cells": out_cells,
        "elapsed_s": round(time.monotonic() - t0, 2),
    }
    start = None if target_override else last_start(ctx)
    if start:
        out["startup"] = start
    return out


def last_start(ctx) -> dict | None:
    """The host's record of the last engine start k26ops made (deploy, rollback), or None."""
    res = ctx.session.run(f"cat {q(EngineHost(ctx).layout.last_start_file)} 2>/dev/null")
    try:
        rec = json.loads(res.stdout) if res.ok and res.stdout.strip() else None
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("ttfgt"), dict) else None
