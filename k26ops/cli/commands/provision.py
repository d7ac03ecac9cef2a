"""`k26ops provision` (the host layer: NVIDIA driver, daemons, rolling reboots)
and `k26ops reboot` (rolling reboots alone). Both go one canary batch at a
time, never all hosts at once: a batch must come back healthy before the next
starts, and a host that does not come back stops the rollout."""

from __future__ import annotations

import click

from k26ops.cli.batchopts import batch_option, max_fail_option
from k26ops.cli.changes import render_changes
from k26ops.cli.globalopts import _finite
from k26ops.cli.rollout import run_rollout
from k26ops.host.reboot import DEFAULT_TIMEOUT, reboot_work
from k26ops.orchestrate import playbook


def rolling_options(f):
    """--canary/--batch/--max-fail/--reboot-timeout/--allow-reboot/--check, shared by both commands."""
    for opt in reversed(
        [
            click.option(
                "--check", is_flag=True, help="Change nothing; say what would change and which hosts would reboot."
            ),
            click.option(
                "--canary",
                type=click.IntRange(1),
                default=1,
                show_default=True,
                metavar="N",
                help="Hosts in the first batch; the rest go on only if they all come back healthy.",
            ),
            batch_option(default="1"),
            max_fail_option(),
            click.option(
                "--reboot-timeout",
                type=click.FloatRange(5),
                default=DEFAULT_TIMEOUT,
                show_default=True,
                metavar="S",
                callback=lambda c, p, v: _finite(p, v),
                help="Seconds a host may take to come back after its reboot.",
            ),
            click.option(
                "--allow-reboot",
                is_flag=True,
                help="Reboot hosts whose engine is serving (requests in flight are lost).",
            ),
        ]
    ):
        f = opt(f)
    return f


@click.command(name="reboot")
@rolling_options
@click.pass_obj
def reboot_cmd(settings, check, canary, batch, max_fail, reboot_timeout, allow_reboot):
    """Rolling reboot: canary batch first, wait for SSH, re-gather facts, go on only if healthy."""
    work = reboot_work(
        accept_new=settings.accept_new_host_keys,
        connect_timeout=settings.connect_timeout,
        check=check,
        allow_reboot=allow_reboot,
        timeout=reboot_timeout,
    )
    run_rollout(
        settings,
        work,
        canary=canary,
        batch=batch,
        max_fail=max_fail,
        title="reboot --check" if check else "reboot",
        columns=[("reboot", "reboot")],
        stopped="not rebooted",
    )


@click.command(name="provision")
@rolling_options
@click.option("--diff", is_flag=True, help="Show text diffs of files that would change.")
@click.option(
    "--playbook",
    "name",
    default="provision",
    show_default=True,
    metavar="NAME|PATH",
    help="Playbook to run (playbooks/NAME.yml).",
)
@click.pass_obj
def provision_cmd(settings, check, canary, batch, max_fail, reboot_timeout, allow_reboot, diff, name):
    """Host layer: pinned NVIDIA driver (open modules), nvidia-persistenced, fabric manager on
    NVSwitch hosts; reboots the hosts that need it in canary batches and verifies them."""
    # lazy: the driver step and its plan tables (about 10 ms at CLI start) only for provision
    from k26ops.orchestrate import provision

    steps = playbook.load(name)
    hosts = settings.selected_hosts()  # the inventory read once for every step's checks
    for step in steps:
        step.before_hosts(hosts)
    work = provision.provision_work(
        steps,
        check=check,
        allow_reboot=allow_reboot,
        timeout=reboot_timeout,
        accept_new=settings.accept_new_host_keys,
        connect_timeout=settings.connect_timeout,
    )
    run_rollout(
        settings,
        work,
        canary=canary,
        batch=batch,
        max_fail=max_fail,
        title=f"{name} --check" if check else name,
        columns=[("changed", "_changed"), ("reboot", "reboot"), ("driver", "driver")],
        render=lambda results: render_changes(results, check=check, diff=diff),
        stopped="not provisioned",
    )
