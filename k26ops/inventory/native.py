"""The native k26ops shape (`hosts:`, `groups:`, `vars:` at the top), as the lab
writes it. Stricter than Ansible's: every key must be known, so a typo is an
error naming the line instead of a silently ignored setting."""

from __future__ import annotations

import difflib

from k26ops.inventory import hostpattern
from k26ops.inventory.ansible import group_name
from k26ops.inventory.graph import Graph
from k26ops.inventory.yamlsrc import line_of, show, type_name

FIELDS = ("address", "port", "user", "identity_file", "gateway", "known_hosts", "connection", "become")
TOP_KEYS = ("hosts", "groups", "vars")
HOST_KEYS = FIELDS + ("groups", "vars")
GROUP_KEYS = ("hosts", "children", "vars")


def looks_native(data: dict) -> bool:
    """Native when it has top-level `hosts:`/`groups:` and no Ansible `all:`."""
    return "all" not in data and ("hosts" in data or "groups" in data)


def _unknown(graph: Graph, where: str, key, allowed, line) -> None:
    near = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else f" (allowed: {', '.join(allowed)})"
    graph.fail(line, f"{where}unknown key {show(key)}{hint}")


def _mapping(graph: Graph, parent, key, what: str) -> dict:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        graph.fail(line_of(parent, key), f"{what} must be a mapping, got {type_name(value)}")
    return value


def _defined(graph: Graph, line, name: str, known: dict, message: str) -> None:
    """`name` must be one of `known` (a group's host or child): else `message`, with near names."""
    if name not in known:
        near = difflib.get_close_matches(name, list(known), n=3)
        graph.fail(line, message + (f" (near: {', '.join(near)})" if near else ""))


def _names(graph: Graph, parent, key, what: str) -> list[tuple[str, int | None]]:
    """A list of names (or a mapping name -> nothing), with lines."""
    value = parent.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [(value, line_of(parent, key))]
    if isinstance(value, dict):
        for k, v in value.items():
            if v is not None:
                graph.fail(line_of(value, k), f"{what}: {show(k)} must have no value here, got {type_name(v)}")
        items = [(k, line_of(value, k)) for k in value]
    elif isinstance(value, list):
        items = [(v, line_of(value, i)) for i, v in enumerate(value)]
    else:
        graph.fail(line_of(parent, key), f"{what} must be a list of names, got {type_name(value)}")
    for name, line in items:
        if not isinstance(name, str) or not name:
            graph.fail(line, f"{what}: {show(name)} is not a name (a non-empty string)")
    return items


def _vars(graph: Graph, parent, what: str) -> tuple[dict, dict]:
    values = _mapping(graph, parent, "vars", f"{what}vars")
    for var in values:
        if not isinstance(var, str) or not var:
            graph.fail(line_of(values, var), f"{what}variable name {show(var)} must be a non-empty string")
    return dict(values), {k: line_of(values, k) for k in values}


def parse(data: dict, graph: Graph, warnings: list[str]) -> None:
    for key in data:
        if key not in TOP_KEYS:
            _unknown(graph, "", key, TOP_KEYS, line_of(data, key))
    values, lines = _vars(graph, data, "")
    for var, val in values.items():
        graph.set_group_var("all", var, val, lines[var])

    hosts = _mapping(graph, data, "hosts", "hosts")
    groups = _mapping(graph, data, "groups", "groups")
    for name, spec in groups.items():
        line = line_of(groups, name)
        if not isinstance(name, str) or not name:
            graph.fail(line, f"group name {show(name)} must be a non-empty string")
        group_name(graph, name, line)
        if spec is not None and not isinstance(spec, dict):
            graph.fail(line, f"group {show(name)} must be a mapping, got {type_name(spec)}")
        graph.group(name, line)
    for name, spec in hosts.items():
        _host(graph, name, spec, line_of(hosts, name))
    for name, spec in groups.items():
        spec = spec or {}
        where = f"group {show(name)}: "
        for key in spec:
            if key not in GROUP_KEYS:
                _unknown(graph, where, key, GROUP_KEYS, line_of(spec, key))
        values, lines = _vars(graph, spec, where)
        for var, val in values.items():
            graph.set_group_var(name, var, val, lines[var])
        for host, line in _names(graph, spec, "hosts", f"group {show(name)} hosts"):
            _defined(
                graph, line, host, graph.hosts, f"group {show(name)} lists host {show(host)}, which is not under hosts:"
            )
            graph.add_host(host, name, line)
        for child, line in _names(graph, spec, "children", f"group {show(name)} children"):
            _defined(
                graph,
                line,
                child,
                graph.groups,
                f"group {show(name)} lists child group {show(child)}, which is not defined",
            )
            graph.add_child(name, child, line)


def _host(graph: Graph, name, spec, line) -> None:
    if not isinstance(name, str) or not name:
        graph.fail(line, f"host name {show(name)} must be a non-empty string (quote numbers)")
    if not hostpattern.valid_name(name):
        graph.fail(line, f"host name {show(name)} is not allowed: use {hostpattern.NAME_RULE}")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        graph.fail(line, f"host {show(name)} must be a mapping, got {type_name(spec)}")
    where = f"host {show(name)}: "
    for key in spec:
        if key not in HOST_KEYS:
            _unknown(graph, where, key, HOST_KEYS, line_of(spec, key))
    node = graph.host(name, line)
    node.vars, node.var_lines = _vars(graph, spec, where)
    for key in FIELDS:
        if key in spec:
            node.fields[key] = (spec[key], line_of(spec, key))
    member = _names(graph, spec, "groups", f"host {show(name)} groups")
    for gname, gline in member:
        group_name(graph, gname, gline)
        graph.add_host(name, gname, gline)
