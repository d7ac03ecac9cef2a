"""`k26ops lab`: boot, inspect and stop the local lab of nspawn hosts."""

from __future__ import annotations

import shlex

import click
from rich.console import Console
from rich.table import Table

from k26ops.cli import jsonout, tables
from k26ops.cli.context import default_lab_dir, remember_lab_dir
from k26ops.lab import DEFAULT_BASE_PORT
from k26ops.lab.access import ssh_argv


def _lab(ctx, directory):
    """The lab in --dir, else the default one."""
    # lazy: the lab's machinery (nspawn, base image, kernel limits: about 10 ms) only for `lab` commands
    from k26ops.lab.machines import Lab

    return Lab(directory or ctx.obj.lab_path)


@click.group(name="lab")
def group():
    """A local lab of real Debian hosts (systemd, sshd) in nspawn containers."""


@group.command()
@click.option("--hosts", "count", type=int, default=2, show_default=True, help="How many hosts.")
@click.option(
    "--dir",
    "directory",
    metavar="DIR",
    help="Lab directory (default: $K26OPS_LAB_DIR, else the last `lab up`'s, else "
    "~/.local/share/k26ops/lab); remembered: later commands use this lab's inventory.",
)
@click.option(
    "--base-port",
    type=int,
    default=DEFAULT_BASE_PORT,
    show_default=True,
    help="sshd port of the first host; the others follow.",
)
@click.option(
    "--raise-limits/--no-raise-limits",
    default=True,
    show_default=True,
    help="Raise this machine's kernel limits (inotify, pids, ...) that are too low for the hosts, "
    "for the lab's run (`lab down` puts them back); with --no-raise-limits, refuse instead.",
)
@click.option(
    "--deployed",
    is_flag=True,
    help="Boot the hosts with the lab recipe already deployed and its engine serving, from a cached "
    "layer (built once by one first deploy when the release or k26ops changed).",
)
@click.pass_context
def up(ctx, count, directory, base_port, raise_limits, deployed):
    """Boot the lab's hosts (builds the base image once)."""
    lab = _lab(ctx, directory)
    err = Console(stderr=True)
    hosts = lab.up(
        count,
        base_port,
        log=lambda m: err.print(f"[dim]{m}[/dim]", highlight=False),
        raise_limits=raise_limits,
        deployed=deployed,
    )
    remember_lab_dir(lab.dir)  # later commands use this lab without --lab-dir / K26OPS_LAB_DIR
    if ctx.obj.as_json:
        jsonout.emit(
            {"dir": str(lab.dir), "inventory": str(lab.inventory_file), "hosts": {h.name: h.__dict__ for h in hosts}}
        )
        return
    click.echo(f"lab up: {len(hosts)} hosts ({', '.join(h.name for h in hosts)})")
    click.echo(f"inventory: {lab.inventory_file}")
    click.echo(f"ssh: {shlex.join(ssh_argv(lab.dir, hosts[0].port, batch=False, connect_timeout=None))}")


@group.command()
@click.option("--dir", "directory", metavar="DIR", help="Lab directory.")
@click.pass_context
def status(ctx, directory):
    """Show the lab's hosts and whether they answer."""
    lab = _lab(ctx, directory)
    rows = lab.status()
    if ctx.obj.as_json:
        jsonout.emit({"dir": str(lab.dir), "hosts": {r["name"]: r for r in rows}})
        return
    if not rows:
        click.echo(f"no lab in {lab.dir}")
        return
    table = Table("host", "ssh port", "engine port", "pid", "running", "sshd")
    for r in rows:
        table.add_row(
            r["name"],
            str(r["port"]),
            str(r["engine_port"]),
            str(r["pid"]),
            "yes" if r["running"] else "NO",
            "answers" if r["ssh"] else "NO",
        )
    tables.print_table(Console(), table)  # piped: never wrapped


@group.command()
@click.option("--dir", "directory", metavar="DIR", help="Lab directory.")
@click.option(
    "--purge", is_flag=True, help="Also remove what `lab up` made in the lab dir (host overlays, keys, inventory)."
)
@click.pass_context
def down(ctx, directory, purge):
    """Stop every host the lab started (--purge: and delete its files)."""
    lab = _lab(ctx, directory)
    err = Console(stderr=True)
    names = lab.down(log=lambda m: err.print(f"[dim]{m}[/dim]", highlight=False))
    removed, freed = lab.purge() if purge else ([], 0)
    if purge and lab.dir.resolve() == default_lab_dir().resolve():
        remember_lab_dir(None)
    if ctx.obj.as_json:
        jsonout.emit(
            {
                "stopped": names,
                "hosts": {n: {"stopped": True} for n in names},
                **({"removed": removed, "freed_bytes": freed} if purge else {}),
            }
        )
        return
    click.echo(f"lab down: stopped {len(names)} hosts" if names else f"no lab in {lab.dir}")
    if purge:
        click.echo(
            f"purged {lab.dir}: {len(removed)} paths, {freed / 1e6:.1f} MB freed"
            if removed
            else f"nothing to purge in {lab.dir}"
        )
