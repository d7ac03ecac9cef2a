"""The canary gate of `deploy --canary N --gate TAG`: after health and smoke,
each canary is benched with the baseline's own settings (only the cells the
gated figures need) and compared with the baseline's stored figures. A figure
worse than the threshold, or a bench that cannot run, rolls the canary back to
the unit, env file and release it ran before (the deploy's own rollback) and
fails it, so the rollout stops before the other hosts."""

from __future__ import annotations

from dataclasses import replace

from k26ops.engine.multinode import serves_http
from k26ops.enginebench import figures as figs
from k26ops.enginebench.run import BenchSpec, run_host
from k26ops.enginebench.stored import baseline_for
from k26ops.errors import UserError
from k26ops.orchestrate import playbook
from k26ops.steps import Change, HostContext, Step, StepFailed


def plan_gate(stored: dict[str, dict], tag: str, figures: list[str]) -> BenchSpec:
    """The bench the gate runs, from the baseline's stored settings; bad input exits 2 before any host."""
    if not stored:
        raise UserError(
            f"--gate {tag}: the baseline has no bench results (take one with "
            f"`k26ops snapshot --tag NAME --bench`); nothing was deployed"
        )
    for name in figures:
        figs.parse_figure(name)
        for host, b in stored.items():
            if name not in figs.flatten(b):
                have = ", ".join(sorted(figs.flatten(b))[:6])
                raise UserError(
                    f"--gate {tag}: host {host}'s stored bench has no figure {name} "
                    f"(it has {have} ...); nothing was deployed"
                )
    first = next(iter(stored.values()))
    cs, ts = figs.cells_for(figures)
    return replace(BenchSpec.from_json(first["spec"]), concurrency=cs, temperatures=ts)


class BenchGate(Step):
    """Not in any playbook file: `deploy --gate` appends it, with its parameters."""

    name = "bench_gate"

    def plan(self, ctx: HostContext) -> list[Change]:
        p = self.params
        if ctx.check or ctx.host.name not in p["hosts"] or not serves_http(ctx.vars):
            return []
        base_host, base = baseline_for(p["stored"], ctx.host.name)
        try:
            bench = run_host(ctx, p["spec"], ctx.progress)
        except StepFailed as exc:
            verdict, line = None, f"gate on {ctx.host.name}: the bench did not run: {exc}"
        else:
            verdict = figs.gate_verdict(bench, base, p["figures"], p["threshold"])
            ctx.report["bench"] = bench
            line = None if verdict["ok"] else figs.gate_line(ctx.host.name, verdict)
        ctx.report["gate"] = {
            "tag": p["tag"],
            "baseline_host": base_host,
            "ok": line is None,
            "line": line,
            **(verdict or {}),
        }
        if line is None:
            worst = max(verdict["checked"], key=lambda r: r["worse_pct"])
            ctx.progress(f"gate: passed ({worst['figure']} {worst['current']:g} vs {worst['baseline']:g})")
            return []
        ctx.progress(line)
        back = playbook.restore(ctx) or playbook.NOTHING_CHANGED
        ctx.report["rollback"] = back
        failed = StepFailed(f"{line}; {back}")
        failed.details = {k: ctx.report[k] for k in ("gate", "bench", "rollback") if k in ctx.report}
        raise failed  # the rollout puts `details` into the host's result

    def apply(self, ctx, changes):  # pragma: no cover - plan never returns changes
        pass
