"""`--batch N|P%|1,2,25%` and `--max-fail N|P%`: one parser (k26ops.orchestrate.rollout)
for deploy, provision and reboot, so the three read batch sizes alike."""

from __future__ import annotations

import click

from k26ops import config
from k26ops.errors import UserError
from k26ops.orchestrate.rollout import parse_batches, parse_size
from k26ops.traffic.drain import TrafficConfig


class BatchSizes(click.ParamType):
    """Batch sizes as Ansible's `serial`: N, P% or a list, the last size repeated."""

    name = "N|P%|LIST"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            return parse_batches(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class FailLimit(click.ParamType):
    """Failed hosts a batch may have before the rollout stops: N or P% of the batch."""

    name = "N|P%"

    def convert(self, value, param, ctx):
        if value is None or not isinstance(value, str):
            return value
        try:
            return parse_size(value, zero=True)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def batch_option(default=None, help_more: str = ""):
    return click.option(
        "--batch",
        type=BatchSizes(),
        default=default,
        show_default=default is not None,
        metavar="N|P%|LIST",
        help="Hosts per batch after the canary: N, P% of all hosts, or a list as Ansible's "
        "serial (1,2,25%: each in turn, the last repeated); a batch starts only when the "
        "one before it succeeded." + help_more,
    )


def max_fail_option():
    return click.option(
        "--max-fail",
        type=FailLimit(),
        default=None,
        metavar="N|P%",
        help="Failed hosts a batch after the canary may have and the rollout still go on "
        "(N hosts or P% of the batch; default 0: any failure stops it). "
        "The canary must always succeed.",
    )


def default_batch(settings, batch):
    """`--batch` when not given: the config file's `batch`, else one host at a time where any selected
    host drains through a gateway or hook (k26ops.traffic: a rollout keeps the others serving),
    else None (all at once after the canary, as before)."""
    if batch is not None:
        return batch
    conf = config.load()
    if "batch" in conf:
        try:
            return parse_batches(conf["batch"])
        except ValueError as exc:
            raise UserError(f"{config.config_path()}: batch: {exc}") from None
    if any(TrafficConfig.of(h).mode in ("gateway", "hook") for h in settings.selected_hosts()):
        return parse_batches("1")
    return None
