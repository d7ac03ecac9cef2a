"""Which inventory keys k26ops reads, and what it says about the others.

A setting nothing reads is worse than an error: an operator who writes
`releases_dir:` (the code reads `releases_root`) builds on the wrong disk. So
each key an inventory defines is looked up among the variables the reading
modules declared (k26ops.hostvars); an unknown one is a warning naming the
nearest known name (an error with --strict). docs/reference/inventory.md is generated
from the declarations (`k26ops inventory vars --markdown`).
"""

from __future__ import annotations

import difflib

from k26ops.hostvars import Var, declare, declared, is_declared

declare(__name__, "for people only", Var("description", "str", None, "free text for people", informational=True))


def variables() -> tuple[Var, ...]:
    """Every declared variable (k26ops.cli.readers has imported every declaring module)."""
    return declared()


def is_read(name: str) -> bool:
    """A variable some k26ops code reads (or declares for people)."""
    return is_declared(name)


def is_known(name: str) -> bool:
    return is_declared(name) or name.startswith("ansible_") or name.startswith("_")


# Names people write for a setting k26ops reads under another name (or that
# look like a known name but are not one): checked before spelling distance.
ALIASES = {
    "engine_service": "engine_unit",
    "service": "engine_unit",
    "unit": "engine_unit",
    "releases_dir": "releases_root",
    "release_dir": "releases_root",
    "tp_size": "engine_profile: {tp_size: N}",
    "cuda_visible_devices": "engine_env: {CUDA_VISIBLE_DEVICES: ...}",
    "CUDA_VISIBLE_DEVICES": "engine_env: {CUDA_VISIBLE_DEVICES: ...}",
    "env_file": "engine_env_file",
    "interconnect": None,
}


def nearest(name: str) -> str | None:
    """The known name (or a hint) `name` was probably meant to be."""
    if name in ALIASES:
        return ALIASES[name]
    near = difflib.get_close_matches(
        name, [v.name for v in declared() if not v.name.startswith("ansible_")], n=1, cutoff=0.8
    )
    return near[0] if near else None


def unknown_message(name: str) -> str:
    near = nearest(name)
    return f"{name}: unknown" + (f"; did you mean {near}?" if near else "; k26ops does not read it")


def unknown_keys(graph, shape: str) -> list[tuple[int | None, str, str]]:
    """(line, where, message) for each variable an inventory defines that k26ops
    does not know. An Ansible inventory carries vars for other tools, so there
    only names close to a known one (likely typos) are reported."""
    out = []
    nodes = [("vars" if g == "all" else f"group {g}", n) for g, n in graph.groups.items()]
    nodes += [(f"host {h}", n) for h, n in graph.hosts.items()]
    for where, node in nodes:  # once per place it is written, never once per host
        for layer, lines in ((node.vars, node.var_lines), (node.file_vars, node.file_lines)):
            for key in layer:
                if not isinstance(key, str) or is_known(key):
                    continue
                if shape != "native" and nearest(key) is None:
                    continue
                out.append((lines.get(key), where, unknown_message(key)))
    return out


def value_error(var: Var, value) -> str | None:
    """Why `value` cannot be variable `var` (declared int or number), or None. A digit string
    is an int (an INI inventory has only strings); a Jinja expression is not judged here."""
    if value is None or var.type not in ("int", "number"):
        return None
    if isinstance(value, str):
        text = value.strip()
        if "{{" in text:
            return None
        try:
            num = int(text) if var.type == "int" else float(text)
        except ValueError:
            num = None
        if num is not None and (var.type == "int" or num == num and abs(num) != float("inf")):
            return None
    elif isinstance(value, int) and not isinstance(value, bool):
        return None
    elif var.type == "number" and isinstance(value, float) and value == value and abs(value) != float("inf"):
        return None
    want = "a whole number" if var.type == "int" else "a number"
    return f"{var.name}: {str(value)[:60]!r} is not {want}"


def bad_values(graph) -> list[tuple[int | None, str, str]]:
    """(line, where, message) for each value of a declared int/number variable that is not one
    (`engine_port: abc` said `invalid literal for int()` at deploy time, naming nothing)."""
    want = {
        v.name: v
        for v in declared()
        if v.type in ("int", "number") and v.module != "k26ops.inventory.fields" and not v.name.startswith("ansible_")
    }  # the connection's fields say their own range (fields.py)
    out = []
    nodes = [("vars" if g == "all" else f"group {g}", n) for g, n in graph.groups.items()]
    nodes += [(f"host {h}", n) for h, n in graph.hosts.items()]
    for where, node in nodes:
        for layer, lines in ((node.vars, node.var_lines), (node.file_vars, node.file_lines)):
            for key, value in layer.items():
                why = value_error(want[key], value) if key in want else None
                if why:
                    out.append((lines.get(key), where, why))
    return out


def markdown() -> str:
    """docs/reference/inventory.md, generated from the declarations: one table per declaring module and topic."""

    def row(v: Var) -> str:
        cells = (
            f"`{v.name}`",
            v.type,
            v.shown_default,
            v.meaning + (" (informational: nothing reads it)" if v.informational else ""),
        )
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    out = [
        "# Inventory variables",
        "",
        "<!-- Generated by `k26ops inventory vars --markdown` from the declarations beside the code",
        "     that reads each variable (k26ops.hostvars.declare); do not edit by hand",
        "     (tests/inventory/test_inventory_vars.py keeps them in sync). -->",
        "",
        "Every variable k26ops reads from an inventory, at any level (all `vars`, a group's, a",
        "host's), under the module that reads it. A key not listed here is reported by",
        "`inventory list`, `check` and `deploy` as `NAME: unknown; did you mean ...?` (a warning;",
        "`--strict` makes it an error, exit 2). In an Ansible-shape inventory only names close to",
        "a known one are reported, since such inventories carry variables for other tools; every",
        "`ansible_*` variable is Ansible's.",
    ]
    section = None
    for v in declared():
        if (v.module, v.topic) != section:
            section = (v.module, v.topic)
            out += [
                "",
                f"## {v.topic[:1].upper()}{v.topic[1:]}",
                "",
                f"Read by `{v.module}`.",
                "",
                "| variable | type | default | meaning |",
                "|---|---|---|---|",
            ]
        out.append(row(v))
    return "\n".join(out + [""])
