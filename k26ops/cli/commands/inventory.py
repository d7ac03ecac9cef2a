"""`k26ops inventory list|show`: what k26ops understood from an inventory --
hosts, effective address/port/user, groups and merged vars -- without ever
opening a connection. Output mirrors `ansible-inventory --list` in spirit."""

from __future__ import annotations

import datetime
import json
import math

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from k26ops.cli import jsonout, tables
from k26ops.cli.complete import host_patterns
from k26ops.cli.context import Settings, load_inventory
from k26ops.engine import secret_policy
from k26ops.host.preflight import recipe_lock
from k26ops.inventory import Host, Inventory, Vault, variables
from k26ops.inventory.native import FIELDS  # a host's connection fields, as the inventory reads them
from k26ops.inventory.yamlsrc import oneline


def jsonable(value, _path: tuple = ()):
    """Vars as JSON: vault -> "<vault>", dates -> ISO text, sets -> lists,
    NaN/inf and anything odd -> text; recursive YAML anchors are cut."""
    if isinstance(value, Vault):
        return "<vault>"
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if id(value) in _path or len(_path) > 50:
        return "<recursive>"
    inner = _path + (id(value),)
    if isinstance(value, dict):
        return {str(k): jsonable(v, inner) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, inner) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v, inner) for v in value), key=repr)
    return repr(value) if isinstance(value, bytes) else str(value)


def host_json(host: Host, origins: bool = False) -> dict:
    out = {f: getattr(host, f) for f in FIELDS}
    out["groups"] = list(host.groups)
    out["vars"] = jsonable(secret_policy.redact_vars(host.vars))  # secrets never printed
    out["notes"] = list(host.notes)
    if origins:
        out["origins"] = dict(host.origins)
    return out


def _load(settings: Settings, inventory: str | None) -> Inventory:
    if inventory:
        settings.inventory = inventory
    inv = load_inventory(settings.inventory_path())
    for warning in inv.warnings:
        click.echo(oneline(f"k26ops: warning: {warning}"), err=True)
    inv.check_strict(settings.strict)
    return inv


def _text(value) -> Text:
    return Text("-" if value is None else str(value))


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _user_text(h: Host) -> str:
    """The login user, marked `(become)` when commands run as root through sudo."""
    return f"{h.user or '-'}" + (" (become)" if h.become else "")


# A value's text in a table is cut here: a few YAML aliases can stand for
# millions of values, and a terminal table of megabytes helps nobody (--json has all).
VALUE_TEXT_MAX = 2000


def value_text(value) -> str:
    """One var's value as JSON text for a table, cut at VALUE_TEXT_MAX characters."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= VALUE_TEXT_MAX:
        return text
    return f"{text[:VALUE_TEXT_MAX]}... ({len(text) - VALUE_TEXT_MAX:,} more characters; --json shows all)"


def _vars_text(values: dict) -> Text:
    shown = jsonable(secret_policy.redact_vars(values))  # secrets never printed
    return Text("\n".join(f"{k}={value_text(v)}" for k, v in shown.items()))


def _who(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} and {len(names) - 3} more"


def _vars_lines(hosts: list[Host]) -> list[tuple[str, bool]]:
    """Merged vars after the table, hosts with identical vars together: (line, bold)."""
    by_vars: dict[str, list[str]] = {}
    for h in hosts:
        by_vars.setdefault(_vars_text(h.vars).plain, []).append(h.name)
    out = []
    for text, names in by_vars.items():
        out.append((f"vars of {_who(names)}:", True))
        out.append(("  " + (text.replace("\n", "\n  ") if text else "(none)"), False))
    return out


def _notes_lines(hosts: list[Host]) -> list[tuple[str, bool]]:
    by_note: dict[str, list[str]] = {}
    for h in hosts:
        for n in h.notes:
            by_note.setdefault(n, []).append(h.name)
    return [(f"note: {_who(names)}: {note}", False) for note, names in by_note.items()]


def _targets_lines(hosts: list[Host], targets) -> list[tuple[str, bool]]:
    """Which listed hosts commands act on by default, and why (k26ops.inventory.targets)."""
    inside = [h.name for h in hosts if h.name in targets.names]
    outside = [h.name for h in hosts if h.name not in targets.names]
    out = [(f"targets: {len(inside)} of {len(hosts)} hosts: {targets.why}", True)]
    if outside:
        out.append((f"  not targets (only with a config `targets` pattern naming them): {_who(outside)}", False))
    return out


def _print_lines(console: Console, lines: list[tuple[str, bool]], plain: bool = False) -> None:
    """`plain`: one write, no rich rendering (a rich print per line of 200,000 hosts took minutes)."""
    if plain:
        if lines:
            click.echo("\n".join(text for text, _ in lines))
        return
    for text, bold in lines:
        console.print(Text(text, style="bold" if bold else ""))


# Past this many hosts the table is plain aligned columns: a boxed rich table of
# 200,000 rows took over 10 minutes and 1.5 GB; these lines take seconds.
BIG_LIST = 2000


def _plain_table(title: Text, cols: list, rows: list[list]) -> None:
    cells = [[c.header for c in cols]] + [[x.replace("\n", " ") for x in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    out = [title.plain]
    out += ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in cells]
    click.echo("\n".join(out))


_options = [
    click.option(
        "--inventory", "-i", "inventory", metavar="PATH", help="Inventory YAML (overrides the global --inventory)."
    ),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
]


def _with_options(func):
    for opt in reversed(_options):
        func = opt(func)
    return func


@click.group(name="inventory")
def group():
    """Show what k26ops understood from an inventory (never connects)."""


@group.command("list")
@_with_options
@click.option(
    "--limit",
    "-l",
    "limit",
    metavar="PATTERN",
    shell_complete=host_patterns,
    help="Only these hosts or groups (overrides the global --limit).",
)
@click.pass_obj
def list_cmd(settings: Settings, inventory, as_json, limit):
    """Every selected host: address, port, user, gateway, groups, merged vars."""
    inv = _load(settings, inventory)
    hosts = inv.select(limit if limit is not None else settings.limit)
    targets = settings.targets(inv)
    if as_json or settings.as_json:
        names = {h.name for h in hosts}
        doc = {
            "inventory": str(inv.path),
            "shape": inv.shape,
            "hosts": {h.name: host_json(h) for h in hosts},
            "groups": {g: [h for h in members if h in names] for g, members in inv.groups.items()},
            "targets": [h.name for h in hosts if h.name in targets.names],
            "targets_why": targets.why,
            "warnings": list(inv.warnings),
            "recipes": _recipes(hosts),
        }
        jsonout.emit(doc, indent=2)
        return
    console = tables.console()
    title = Text(f"{inv.path} ({inv.shape} shape, {len(hosts)} of {len(inv.hosts)} hosts)")
    cols = [
        tables.Col("host", keep=True),
        tables.Col("address", keep=True),
        tables.Col("port", keep=True),
        tables.Col("user", keep=True),
        tables.Col("groups"),
        tables.Col("gateway"),
        tables.Col("identity file"),
    ]
    rows = [
        [
            _cell(h.name),
            _cell(h.address),
            _cell(h.port),
            _user_text(h),
            ", ".join(h.groups),
            _cell(h.gateway),
            _cell(h.identity_file),
        ]
        for h in hosts
    ]
    big = len(rows) > BIG_LIST
    if big:
        _plain_table(title, cols, rows)
    else:
        tables.show(console, title, cols, [[Text(c) for c in r] for r in rows], show_lines=True)
    _print_lines(console, _vars_lines(hosts) + _notes_lines(hosts) + _targets_lines(hosts, targets), plain=big)
    for r in _recipes(hosts):
        what = f"lock {r['lock']}" if r["ok"] else r["problem"]
        line = f"recipe {r['recipe'] or '?'} ({_who(r['hosts'])}): {what}"
        if big:
            click.echo(line)
        else:
            console.print(Text(line))


def _recipes(hosts) -> list[dict]:
    """Which recipe each host gets (a deploy builds it) and whether its dependency lock exists:
    one entry per recipe, with its hosts (preflight.recipe_lock)."""
    out: dict[tuple, dict] = {}
    seen: dict[str, dict] = {}  # the recipe depends on these two vars only: read each recipe and lock once
    for h in hosts:
        key = json.dumps([h.vars.get("recipe"), h.vars.get("engine_source_mirrors")], sort_keys=True, default=str)
        if key not in seen:
            seen[key] = recipe_lock(h.vars)
        info = seen[key]
        out.setdefault((info["recipe"], info["source"], info["problem"]), {**info, "hosts": []})["hosts"].append(h.name)
    return list(out.values())


@group.command("show")
@_with_options
@click.argument("host")
@click.pass_obj
def show_cmd(settings: Settings, inventory, as_json, host):
    """One host, with where each of its settings came from."""
    inv = _load(settings, inventory)
    h = inv.host(host)
    if as_json or settings.as_json:
        jsonout.emit({"hosts": {h.name: host_json(h, origins=True)}}, indent=2)
        return
    console = tables.console()
    table = Table(title=Text(f"{h.name} ({inv.path})"), show_header=True)
    table.add_column("setting")
    table.add_column("value", overflow="fold")
    table.add_column("from", overflow="fold")
    for f in FIELDS:
        table.add_row(f, _text(getattr(h, f)), _text(h.origins.get(f, "default")))
    table.add_row("groups", Text(", ".join(h.groups)), Text(""))
    for k, v in jsonable(secret_policy.redact_vars(h.vars)).items():
        table.add_row(Text(f"vars.{k}"), Text(value_text(v)), Text(""))
    tables.print_table(console, table)  # piped: whole values, never folded at 80
    _print_lines(console, _notes_lines([h]))


@group.command("vars")
@click.option("--markdown", is_flag=True, help="As docs/reference/inventory.md (generated from this table).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def vars_cmd(settings: Settings, markdown, as_json):
    """Every inventory variable k26ops reads: type, default, where, meaning."""
    if markdown:
        click.echo(variables.markdown(), nl=False)
        return
    if as_json or settings.as_json:
        jsonout.emit({"variables": [v.to_json() for v in variables.variables()]}, indent=2)
        return
    for v in variables.variables():
        info = " (informational)" if v.informational else ""
        click.echo(f"{v.name} ({v.type}, default {v.shown_default}){info}: {v.meaning} [read by {v.module}]")
