"""One JSON shape for every command's --json (docs/reference/json.md, docs/json/*.schema.json).

    {"command": "status", "ok": true, "exit_code": 0, "hosts": {name: {...}}, ...}

plus the command's own keys (kept as they were). Errors under --json are
{"command", "ok": false, "exit_code": 2, "error": "..."} on stdout (the
one-line message still goes to stderr for people). `logs -f --json` is the one
stream: NDJSON, one {"host", "lines"} record per host per batch of new lines.
"""

from __future__ import annotations

import json
import sys

import click

CURRENT = {"command": ""}  # the leaf command being run (set by globalopts.attach)


def command_name(ctx: click.Context | None = None) -> str:
    """`baselines list`, `status`...: the command path without the program."""
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None or not isinstance(ctx.command, click.Command) or isinstance(ctx.command, click.Group):
        return CURRENT["command"]
    return " ".join(ctx.command_path.split()[1:])


def document(body: dict, exit_code: int = 0, command: str | None = None) -> dict:
    doc = {
        "command": command if command is not None else command_name(),
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "hosts": {},
    }
    doc.update({k: v for k, v in body.items() if k not in ("command", "ok", "exit_code")})
    return doc


def emit(
    body: dict, exit_code: int = 0, *, indent: int | None = None, command: str | None = None, sort_keys: bool = False
) -> None:
    click.echo(
        json.dumps(
            document(body, exit_code, command), indent=indent, default=str, ensure_ascii=False, sort_keys=sort_keys
        )
    )


def _named(ctx: click.Context | None, args: list | None) -> str:
    """The command the arguments name, when the error came before it ran."""
    root = ctx.find_root() if ctx is not None else None
    if root is None:
        return ""
    cmd, names = root.command, []
    for tok in args or []:
        sub = cmd.commands.get(tok) if isinstance(cmd, click.Group) else None
        if sub is not None:
            names.append(tok)
            cmd = sub
        elif not tok.startswith("-") and names:
            break
    return " ".join(names)


def wanted(args: list[str] | None = None) -> bool:
    """--json anywhere before `--` (errors can come before the settings exist)."""
    args = sys.argv[1:] if args is None else args
    head = args[: args.index("--")] if "--" in args else args
    return "--json" in head


def error(message: str, exit_code: int, ctx: click.Context | None = None, args: list | None = None) -> None:
    """The error document on stdout, when --json was asked for (the settings say
    so, or the command line does: errors can come before the settings exist)."""
    settings = getattr(ctx, "obj", None) if ctx is not None else None
    if getattr(settings, "as_json", False) or wanted():
        click.echo(
            json.dumps(
                {
                    "command": command_name(ctx) or _named(ctx, args),
                    "ok": False,
                    "exit_code": exit_code,
                    "error": message,
                },
                ensure_ascii=False,
            )
        )
