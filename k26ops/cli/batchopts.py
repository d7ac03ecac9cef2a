"""`--batch N|P%|1,2,25%` and `--max-fail N|P%`: one parser (k26ops.rollout)
for deploy, provision and reboot, so the three read batch sizes alike."""

from __future__ import annotations

import click

from k26ops.rollout import parse_batches, parse_size


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
    return click.option("--batch", type=BatchSizes(), default=default, show_default=default is not None,
                        metavar="N|P%|LIST",
                        help="Hosts per batch after the canary: N, P% of all hosts, or a list as Ansible's "
                             "serial (1,2,25%: each in turn, the last repeated); a batch starts only when the "
                             "one before it succeeded." + help_more)


def max_fail_option():
    return click.option("--max-fail", type=FailLimit(), default=None, metavar="N|P%",
                        help="Failed hosts a batch after the canary may have and the rollout still go on "
                             "(N hosts or P% of the batch; default 0: any failure stops it). "
                             "The canary must always succeed.")
