"""The `k26ops` command: parses arguments and prints; the work lives elsewhere.

Each command group lives in its own module here and is registered below.
"""

from __future__ import annotations

import os
import signal
import sys

import click
from click.core import ParameterSource

from k26ops import config as operator_config  # the name `config` is the package's submodule k26ops.cli.commands.config
from k26ops.cli import globalopts, jsonout, pipe
from k26ops.cli.commands import (
    baselines,
    bench,
    config,
    deploy,
    diagnose,
    engine,
    gateway,
    hosts,
    inventory,
    lab,
    model,
    monitoring,
    provision,
    rehearse,
    selftest,
    status,
)
from k26ops.cli.commands import (
    report_cmd as reportcmd,
)
from k26ops.cli.complete import host_patterns
from k26ops.cli.context import Settings
from k26ops.cli.globalopts import _finite
from k26ops.errors import EXIT_INTERRUPTED, UserError
from k26ops.hostvars import complete_with
from k26ops.transport.fleet import FleetInterrupted


class K26Group(click.Group):
    """Turns UserError into one line on stderr and an exit code; never a traceback."""

    def invoke(self, ctx):
        try:
            return self._invoke(ctx)
        except (
            OSError
        ) as exc:  # our stdout/stderr closed (`| head`), also while saying an error: as a closed pipe would
            if pipe.is_output_error(exc) and pipe.silence():
                sys.exit(pipe.EXIT_CLOSED_PIPE)
            raise

    def _invoke(self, ctx):
        # click clears these before the callback runs (protected_args: click < 8.2's name)
        args = [*vars(ctx).get("_protected_args", vars(ctx).get("protected_args", [])), *ctx.args]
        ctx.meta["k26ops.args"] = args  # the subcommand and its arguments, for _apply_config
        try:
            return super().invoke(ctx)
        except UserError as exc:
            jsonout.error(str(exc), exc.exit_code, ctx, args)
            click.echo(f"k26ops: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("k26ops: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except FleetInterrupted as exc:  # a command that cannot report partial results (snapshot)
            jsonout.error(str(exc), EXIT_INTERRUPTED, ctx, args)  # --json: still one document
            click.echo(f"k26ops: {exc}", err=True)
            sys.exit(EXIT_INTERRUPTED)


def _print_version(ctx, _param, value) -> None:
    if value and not ctx.resilient_parsing:
        import k26ops  # lazy: the version is looked up for --version only

        click.echo(f"k26ops, version {k26ops.__version__}")
        ctx.exit()


@click.group(cls=K26Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version (from the git tag it was built from) and exit.",
)
@click.option(
    "--inventory",
    "-i",
    "inventory",
    metavar="PATH",
    envvar="K26OPS_INVENTORY",
    help="Inventory YAML (default: $K26OPS_INVENTORY, else the config file's, else the running lab's).",
)
@click.option(
    "--limit",
    "-l",
    metavar="PATTERN",
    help="Only these hosts or groups (Ansible host pattern).",
    shell_complete=host_patterns,
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-v", "--verbose", count=True, help="More detail (repeat for more).")
@click.option(
    "--forks", "-f", type=click.IntRange(1, 512), default=16, show_default=True, help="Hosts worked on at once."
)
@click.option(
    "--deadline",
    type=click.FloatRange(1),
    callback=lambda c, p, v: _finite(p, v),
    default=3600,
    show_default=True,
    help="Seconds one host may take before it is reported failed.",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(0.1),
    callback=lambda c, p, v: _finite(p, v),
    default=10,
    show_default=True,
    help="Seconds to wait for a host's SSH connection.",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Trust-on-first-use: record unknown host keys (changed keys are always refused).",
)
@click.option(
    "--strict", is_flag=True, help="An inventory variable k26ops does not read is an error (exit 2), not a warning."
)
@click.option("--lab-dir", metavar="DIR", envvar="K26OPS_LAB_DIR", hidden=True)
@click.pass_context
def cli(
    ctx, inventory, limit, as_json, verbose, forks, deadline, connect_timeout, accept_new_host_keys, strict, lab_dir
):
    """Deploy, baseline, roll back and diagnose a TP8 DDTree SGLang engine over SSH."""
    ctx.obj = Settings(
        inventory=inventory,
        limit=limit,
        as_json=as_json,
        verbose=verbose,
        lab_dir=lab_dir,
        forks=forks,
        deadline=deadline,
        connect_timeout=connect_timeout,
        accept_new_host_keys=accept_new_host_keys,
        strict=strict,
    )
    _apply_config(ctx, ctx.obj)


_FLAGS = {
    "inventory": "--inventory",
    "forks": "--forks",
    "deadline": "--deadline",
    "connect_timeout": "--connect-timeout",
}


def _apply_config(ctx, settings: Settings) -> None:
    """Fill what no flag or environment variable set from the config file; record
    where each setting came from (`k26ops config show`)."""
    try:
        conf = operator_config.load()
    except UserError as exc:
        args = ctx.meta.get("k26ops.args") or []
        if args[:2] != ["lab", "down"] and not {"--help", "-h"} & set(args):
            raise
        # taking a lab down or reading help must never depend on the operator's defaults
        click.echo(
            f"k26ops: warning: {exc} (ignored: {'lab down' if args[:2] == ['lab', 'down'] else '--help'} "
            "does not use it)",
            err=True,
        )
        conf = {}
    for name, flag in _FLAGS.items():
        source = ctx.get_parameter_source(name)
        if source == ParameterSource.COMMANDLINE:
            settings.sources[name] = flag
        elif source == ParameterSource.ENVIRONMENT:
            settings.sources[name] = "env K26OPS_INVENTORY"
        elif name in conf:
            value = conf[name]
            setattr(settings, name, str(value) if name == "inventory" else value)
            settings.sources[name] = f"config {operator_config.config_path()}"
        else:
            settings.sources[name] = "default"


def _register() -> None:
    for module in (lab, inventory, diagnose, engine, gateway, model):
        cli.add_command(module.group)
    cli.add_command(hosts.facts_cmd)
    cli.add_command(hosts.check_cmd)
    cli.add_command(status.status_cmd)
    cli.add_command(status.logs_cmd)
    cli.add_command(deploy.deploy_cmd)
    cli.add_command(rehearse.rehearse_cmd)
    cli.add_command(provision.provision_cmd)
    cli.add_command(provision.reboot_cmd)
    cli.add_command(bench.bench_cmd)
    cli.add_command(reportcmd.report_cmd)
    cli.add_command(monitoring.monitoring_cmd)
    cli.add_command(baselines.snapshot_cmd)
    cli.add_command(baselines.rollback_cmd)
    cli.add_command(baselines.group)
    cli.add_command(selftest.selftest_cmd)
    cli.add_command(config.group)
    for command in cli.commands.values():
        globalopts.attach(command)


_register()


def _declare_every_variable() -> None:
    # lazy: the step modules that declare variables (about 20 ms) only once an inventory is read
    from k26ops.cli import readers  # noqa: F401 (its imports are the point)


complete_with(_declare_every_variable)


GLOBAL_FLAGS = {"--json", "-v", "-vv", "-vvv", "--verbose", "--accept-new-host-keys", "--strict"}


def hoist_global_flags(args: list[str]) -> list[str]:
    """`k26ops deploy --json` means `k26ops --json deploy`: global flags (no value)
    may be written after the command too."""
    if "--" in args:
        i = args.index("--")
        head, tail = args[:i], args[i:]
    else:
        head, tail = args, []
    flags = [a for a in head if a in GLOBAL_FLAGS]
    rest = [a for a in head if a not in GLOBAL_FLAGS]
    return flags + rest + tail


def _signal_as_interrupt(signum, _frame) -> None:
    """SIGTERM and SIGHUP are handled like Ctrl-C: the work in progress restores
    the hosts it was changing. After SIGHUP the terminal is gone, so output goes
    to /dev/null instead of failing the restore with EIO."""
    if signum == signal.SIGHUP:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
    raise KeyboardInterrupt


def main() -> None:
    """Entry point: click's own usage errors become one line too (exit 2); a run
    whose output was closed exits as a closed pipe would (k26ops.cli.pipe)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _signal_as_interrupt)
    try:
        _main()
    except SystemExit:
        if pipe.is_closed():
            sys.exit(pipe.EXIT_CLOSED_PIPE)
        raise


def _main() -> None:
    try:
        rc = cli.main(args=hoist_global_flags(sys.argv[1:]), prog_name="k26ops", standalone_mode=False)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `k26ops`: show the help
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        msg = " ".join(exc.format_message().split())
        jsonout.error(msg + where, 2, exc.ctx)
        click.echo(f"k26ops: error: {msg}{where}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        jsonout.error(" ".join(exc.format_message().split()), exc.exit_code)
        click.echo(f"k26ops: error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("k26ops: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(rc if isinstance(rc, int) else 0)
