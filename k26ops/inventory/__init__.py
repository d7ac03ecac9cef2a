"""Inventory: which hosts exist, how to reach them, their groups and variables.

Two YAML shapes load into the same model: the native k26ops shape (`hosts:`,
`groups:`, `vars:`) and Ansible's YAML inventory (`all: hosts/children/vars`),
the latter with ansible-inventory's semantics. Every problem is a one-line
UserError naming file and line; nothing here ever connects anywhere.

    from k26ops.inventory import load
    inv = load("inventory/example-rtxpro6000.yml")
    for host in inv.select("gpu*,!gpu03"): ...
"""

from __future__ import annotations

import gc
import os
import posixpath
import re
from collections import deque
from pathlib import Path

from k26ops.engine import secret_policy
from k26ops.errors import UserError
from k26ops.hostvars import Var, declare
from k26ops.inventory import ansible, native, sources, variables
from k26ops.inventory.fields import ANSIBLE_SSH_CONNECTIONS, BECOME_PASSWORD_VARS, resolve
from k26ops.inventory.graph import At, Graph, Origin, file_of
from k26ops.inventory.model import Host, Inventory
from k26ops.inventory.sshconfig import SSHConfig, default_path
from k26ops.inventory.yamlsrc import Vault, is_jinja, line_of, oneline, show

__all__ = ["Host", "Inventory", "load", "Vault"]

SECRETS = declare(
    __name__,
    "what is never printed",
    Var("secret_vars", "list of names", [], "more variable names whose values are never printed"),
    Var("secret_patterns", "list of globs", [], "globs of variable names never printed"),
)


def load(path: Path | str, ssh_config: Path | str | None | bool = True) -> Inventory:
    """Load and validate `path`. `ssh_config`: True for the default
    (~/.ssh/config, or $K26OPS_SSH_CONFIG), a path, or None/False for none.

    The cyclic garbage collector is paused meanwhile: loading makes millions of
    small objects and none of them is garbage, yet each full collection walks
    them all (a 200,000-host file spent most of its time there)."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _load(path, ssh_config)
    finally:
        if was:
            gc.enable()


def _load(path: Path | str, ssh_config) -> Inventory:
    path = Path(os.fspath(path))
    files = sources.inventory_files(path)
    graph = Graph(path)
    warnings: list[str] = []
    shape = "ansible"
    for f in files:
        data = sources.read_source(f)
        graph.path = f
        if len(files) == 1 and native.looks_native(data):
            shape = "native"
        (native if shape == "native" else ansible).parse(data, graph, warnings)
        if f != path:  # a file of a directory: lines must say which file
            graph.stamp(f)
    graph.path = path
    _vars_dirs(graph, path if path.is_dir() else path.parent)
    graph.finish()
    unknown = [
        f"{file_of(line, path)}:{line}: {where}: {msg}" if line else f"{path}: {where}: {msg}"
        for line, where, msg in variables.unknown_keys(graph, shape)
    ]
    warnings.extend(unknown)
    for line, where, msg in variables.bad_values(graph)[:1]:  # bad input: one line, nothing runs
        raise UserError(oneline(f"{file_of(line, path)}:{line}: {where}: {msg}" if line else f"{path}: {where}: {msg}"))
    ssh = SSHConfig(default_path() if ssh_config is True else Path(ssh_config) if ssh_config else None)
    notes: dict = {}
    hosts = {name: _host(graph, name, shape, ssh, warnings, notes) for name in graph.hosts}
    secrets = _secret_policy(hosts)
    groups = {g: graph.group_hosts(g) for g in graph.groups}
    children = {g: list(node.children) for g, node in graph.groups.items()}
    members = {g: list(node.hosts) for g, node in graph.groups.items()}
    return Inventory(
        path=path,
        hosts=hosts,
        groups=groups,
        warnings=warnings,
        shape=shape,
        children=children,
        members=members,
        unknown_vars=unknown,
        secret_policy=secrets,
    )


def _vars_dirs(graph: Graph, base: Path) -> None:
    """group_vars/ and host_vars/ beside the inventory (see k26ops.inventory.sources),
    for the groups and hosts it defines; later files win within one group or host."""
    for kind, nodes in (("group_vars", graph.groups), ("host_vars", graph.hosts)):
        for name, node in nodes.items():
            for f in sources.vars_files(base, kind, name):
                data = sources.read_vars_file(f)
                if data is None:
                    continue
                if not isinstance(data, dict):
                    raise UserError(oneline(f"{f}: must be a mapping of variables"))
                for var, value in data.items():
                    if not isinstance(var, str) or not var:
                        raise UserError(
                            oneline(f"{f}:{line_of(data, var)}: variable name {show(var)} must be a non-empty string")
                        )
                    node.file_vars[var] = value
                    node.file_lines[var] = At(line_of(data, var) or 1, f)


def _secret_policy(hosts: dict) -> secret_policy.SecretPolicy:
    """The inventory's own secret names (`secret_vars`) and glob patterns
    (`secret_patterns`), at any level: the command puts them in force for every output
    of its run (secret_policy.use); loading changes nothing."""
    names, patterns = set(), set()
    for h in hosts.values():
        for var, into in zip(SECRETS, (names, patterns)):
            v = h.vars.get(var)
            if v is None:
                continue
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise UserError(f"host {show(h.name)}: {var} must be a list of names, got {show(v)}")
            into.update(v)
    return secret_policy.SecretPolicy.of(names, patterns)


def _where(graph: Graph, o: Origin) -> str:
    return f"{file_of(o.line, graph.path)}:{o.line}" if o.line else str(graph.path)


def _origin_text(o: Origin) -> str:
    parts = [o.level]
    if o.var:
        parts.append(f"var {o.var}")
    if isinstance(o.line, At):
        parts.append(f"{o.line.file}:{o.line}")
    elif o.line:
        parts.append(f"line {o.line}")
    return ", ".join(parts)


# Variables that name a path on the host. They reach shell lines, unit files and
# scripts k26ops writes, so they are data with a shape: absolute, normalised,
# from a safe character set; anything else is refused at load.
PATH_VARS = ("k26ops_root", "releases_root", "model_path", "draft_model_path", "env_file", "engine_env_file")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._+@=,/-]*")


def path_problem(value) -> str | None:
    """Why `value` is not a usable host path, or None."""
    if isinstance(value, Vault) or is_jinja(value):
        return "must be a plain path (not a !vault value or a Jinja expression)"
    if not isinstance(value, str):
        return f"must be a path string, got {show(value)}"
    if not value.startswith("/"):
        return f"must be an absolute path, got {show(value)}"
    if not _SAFE_PATH.fullmatch(value):
        bad = sorted({c for c in value if not re.fullmatch(r"[A-Za-z0-9._+@=,/-]", c)})
        return (
            f"may only hold letters, digits and . _ + @ = , - /, got {show(value)} "
            f"(refused: {' '.join(repr(c) for c in bad)})"
        )
    if posixpath.normpath(value) != value or value.startswith("//"):
        return f"must be normalised (no //, /./, /../ or trailing /), got {show(value)}"
    if value == "/":
        return "must not be / itself"
    return None


def _check_paths(graph: Graph, name: str, values: dict, origins: dict) -> None:
    for var in PATH_VARS:
        if var in values and values[var] is not None:
            why = path_problem(values[var])
            if why:
                o = origins.get(var)
                graph.fail(o.line if o else None, f"host {show(name)}: {var} {why}")


def _host(graph: Graph, name: str, shape: str, ssh: SSHConfig, warnings: list[str], note_cache: dict) -> Host:
    values, origins = graph.merged_vars(name)
    _check_paths(graph, name, values, origins)
    r = resolve(graph, name, values, origins, shape, ssh)
    conn = r.values.get("connection", "ssh")
    if shape == "native" and conn not in ("ssh", "local"):
        o = r.origins["connection"]
        graph.fail(o.line, f"host {show(name)}: connection must be ssh or local, got {show(conn)}")
    if shape == "ansible":
        if conn in ANSIBLE_SSH_CONNECTIONS:
            conn = "ssh"
        elif conn in ("local", "ansible.builtin.local"):
            conn = "local"
        else:
            warnings.append(
                f"{graph.path}: host {show(name)}: ansible_connection {show(conn)} "
                f"is not one k26ops can use (ssh or local)"
            )
    notes = list(r.notes)
    notes += _value_notes(values, "vars", note_cache)
    vault_used = [
        f"{_where(graph, origins[k])}: {k}"
        for k, v in values.items()
        if variables.is_read(k)
        and k not in BECOME_PASSWORD_VARS
        and any("!vault" in n for n in _value_notes({k: v}, "vars", note_cache, limit=1))
    ]
    return Host(
        name=name,
        address=r.values["address"],
        port=r.values.get("port"),
        user=r.values.get("user"),
        identity_file=r.values.get("identity_file"),
        gateway=r.values.get("gateway"),
        known_hosts=r.values.get("known_hosts"),
        connection=conn,
        become=r.values.get("become", False),
        groups=graph.member_of(name),
        vars=values,
        notes=notes,
        unresolved=r.unresolved,
        origins={f: _origin_text(o) for f, o in r.origins.items()},
        vault_used=vault_used,
    )


def _value_notes(values: dict, where: str, cache: dict, limit: int = 50) -> list[str]:
    """Notes for every Jinja or vault value inside the merged vars.

    Linear in the file, not in the expanded values: a container reached again
    (a YAML alias: the same object) is walked once, and each top-level value's
    notes are kept in `cache` by identity, so every host sharing a group's
    value reuses them (1.9 M aliased values under 400 bytes once took > 300 s)."""
    out: list[str] = []
    for key, value in values.items():
        ident = (key, id(value))
        if ident not in cache:
            cache[ident] = (value, _walk_notes(f"{where}.{key}", value, limit))
        out.extend(cache[ident][1])
        if len(out) >= limit:
            return out[:limit]
    return out


def _walk_notes(at: str, value, limit: int) -> list[str]:
    out: list[str] = []
    seen: set[int] = set()
    todo = deque([(at, value, 0)])
    while todo and len(out) < limit:
        at, v, depth = todo.popleft()
        if isinstance(v, Vault):
            out.append(f"{at} is a !vault value, not decrypted (shown as <vault>)")
        elif is_jinja(v):
            out.append(f"{at} is a Jinja expression, kept as written: {show(v)}")
        elif depth < 20 and isinstance(v, (dict, list)) and id(v) not in seen:
            seen.add(id(v))
            items = v.items() if isinstance(v, dict) else enumerate(v)
            fmt = "{}.{}" if isinstance(v, dict) else "{}[{}]"
            todo.extend((fmt.format(at, k), x, depth + 1) for k, x in items)
    return out
