"""The rehearsal's options and its plan.Options from them: shared by rehearse and deploy --rehearse."""

from __future__ import annotations

import click

from k26ops.rehearsal import plan


def rehearsal_options(fn):
    """The options `rehearse` and `deploy --rehearse` share."""
    for opt in reversed(
        [
            click.option(
                "--layers",
                type=click.IntRange(1),
                metavar="N",
                help="Target layers (config override), so the GPUs need not hold the full model "
                "(default: the recipe's rehearsal.layers, else the model's own).",
            ),
            click.option(
                "--rehearse-port",
                "port",
                type=click.IntRange(1, 65535),
                metavar="PORT",
                help="The rehearsal engine's loopback port (default: the serving port + 100).",
            ),
            click.option(
                "--mem-fraction",
                type=click.FloatRange(0.01, 0.99),
                default=plan.Options.mem_fraction,
                show_default=True,
                help="--mem-fraction-static of the rehearsal engine.",
            ),
            click.option(
                "--tp-size",
                type=click.IntRange(1),
                metavar="N",
                help="Rehearse at another TP size than the unit's (said in the report).",
            ),
            click.option(
                "--ready-timeout",
                type=click.FloatRange(1),
                default=plan.Options.ready_timeout,
                show_default=True,
                help="Seconds to wait for the rehearsal engine to be ready.",
            ),
            click.option(
                "--request-timeout",
                type=click.FloatRange(1),
                default=plan.Options.request_timeout,
                show_default=True,
                help="Seconds per request (a cold first sampled request JIT-builds kernels).",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


def options_from(kw: dict, **more) -> plan.Options:
    return plan.Options(
        port=kw.get("port"),
        mem_fraction=kw["mem_fraction"],
        layers=kw.get("layers"),
        tp_size=kw.get("tp_size"),
        ready_timeout=kw["ready_timeout"],
        request_timeout=kw["request_timeout"],
        deadline_s=int(kw["ready_timeout"] + 1800),
        **more,
    )
