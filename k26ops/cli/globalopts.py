"""Global options in every command's place too: `k26ops status -l gpu -f 4`
means `k26ops -l gpu -f 4 status`. Each command gets the global options it
does not define itself (`logs -f` stays --follow; there, --forks is long only),
and only those that mean something there: a command that never reads the
inventory gets no -i/-l/-f (USES)."""

from __future__ import annotations

import math

import click

from k26ops.cli import jsonout
from k26ops.cli.complete import host_patterns
from k26ops.cli.context import Settings

# (option strings, Settings attribute, click keyword arguments)
GLOBAL = [
    (("--inventory", "-i"), "inventory", dict(metavar="PATH", help="Inventory YAML (as the global --inventory).")),
    (
        ("--limit", "-l"),
        "limit",
        dict(metavar="PATTERN", help="Ansible host pattern (as the global --limit).", shell_complete=host_patterns),
    ),
    (
        ("--forks", "-f"),
        "forks",
        dict(type=click.IntRange(1, 512), help="Hosts worked on at once (as the global --forks)."),
    ),
    (("--json",), "as_json", dict(is_flag=True, help="Machine-readable output.")),
    (("--verbose", "-v"), "verbose", dict(count=True, help="More detail (repeat for more).")),
]

# Commands (or groups) that use only some of -i/-l/-f: the ones they use. Every other command uses all.
HOST_OPTIONS = {"inventory", "limit", "forks"}
USES = {
    "lab": set(),  # its own --dir; never an inventory
    "diagnose log": set(),  # a file
    "engine": set(),  # recipes and locks on this machine
    "baselines list": set(),
    "baselines show": set(),  # the baselines repository
    "inventory list": {"inventory", "limit"},
    "inventory show": {"inventory"},
    "inventory vars": set(),
    "config show": {"inventory", "forks"},  # shows where they come from
}


def uses(path: str) -> set[str]:
    """The host options `path` (e.g. "baselines show") means something with."""
    words = path.split()
    for n in range(len(words), 0, -1):
        if " ".join(words[:n]) in USES:
            return USES[" ".join(words[:n])]
    return HOST_OPTIONS


def _store(attr: str, flag: str):
    def callback(ctx, param, value):
        if value in (None, False, 0):  # not given (these options have no defaults)
            return value
        settings = ctx.find_object(Settings)
        if settings is not None:
            if attr == "verbose":
                settings.verbose += value
            else:
                setattr(settings, attr, value)
                settings.sources[attr] = flag
        return value

    return callback


def attach(command: click.Command, path: str = "") -> None:
    """Add the global options `command` (and its subcommands) lacks and uses."""
    path = f"{path} {command.name}".strip()
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            attach(sub, path)
        return
    _remember_name(command)
    taken = {o for p in command.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
    for p in command.params:  # -C / -D: Ansible's short forms of --check / --diff
        for long, short in (("--check", "-C"), ("--diff", "-D")):
            if long in getattr(p, "opts", []) and short not in taken:
                p.opts.append(short)
                taken.add(short)
    names = {p.name for p in command.params}
    used = uses(path)
    for opts, attr, kwargs in GLOBAL:
        if attr in HOST_OPTIONS and attr not in used:
            continue
        free = [o for o in opts if o not in taken]
        if not free or (attr in names and len(free) < len(opts)):
            continue
        command.params.append(
            click.Option([*free, f"global_{attr}"], expose_value=False, callback=_store(attr, opts[0]), **kwargs)
        )


def _remember_name(command: click.Command) -> None:
    """Errors under --json name the command that was running (k26ops.cli.jsonout)."""
    invoke = command.invoke

    def remembering(ctx):
        jsonout.CURRENT["command"] = " ".join(ctx.command_path.split()[1:])
        return invoke(ctx)

    command.invoke = remembering


def _finite(param, value):
    """click's float ranges let NaN through: `--deadline nan` would mean no deadline."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds", param=param)
    return value
