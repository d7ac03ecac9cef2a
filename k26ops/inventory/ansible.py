"""The Ansible YAML inventory shape (`all: hosts: / children: / vars:`), read
with the rules of ansible-core's yaml inventory plugin so that an inventory a
team already uses means the same thing to k26ops: same hosts, groups and vars,
same warnings for keys ansible skips."""

from __future__ import annotations

import difflib

from k26ops.inventory import hostpattern
from k26ops.inventory.graph import Graph
from k26ops.inventory.yamlsrc import Map, line_of, show, type_name

SECTIONS = ("vars", "children", "hosts")


def parse(data: dict, graph: Graph, warnings: list[str]) -> None:
    if data.get("plugin"):
        graph.fail(line_of(data, "plugin"), "this is an inventory plugin configuration, not a YAML inventory")
    for name, body in data.items():
        line = line_of(data, name)
        if not isinstance(body, (dict, type(None))):
            warnings.append(
                f"{graph.path}:{line}: skipping {show(name)}: not a valid group "
                f"definition ({type_name(body)}, not a mapping)"
            )
            continue
        _group(graph, name, body, line, warnings)


def group_name(graph: Graph, name, line) -> str:
    if not isinstance(name, str) or not name:
        graph.fail(line, f"group name {show(name)} must be a non-empty string")
    if not hostpattern.valid_name(name):
        graph.fail(line, f"group name {show(name)} is not allowed: use {hostpattern.NAME_RULE}")
    return name


def _group(graph: Graph, name, body, line, warnings: list[str], stack=()) -> str:
    name = group_name(graph, name, line)
    graph.group(name, line)
    if body is None:
        return name
    body = dict(body) if not isinstance(body, Map) else body
    sections = {}
    for section in SECTIONS:
        if section not in body:
            continue
        value = body[section]
        if isinstance(value, str):
            value = {value: None}
        if not isinstance(value, (dict, type(None))):
            graph.fail(
                line_of(body, section),
                f"group {show(name)}: {section} must be a mapping, got {type_name(value)}"
                + (" (Ansible's YAML shape lists hosts as keys: `hosts: {a:, b:}`)" if isinstance(value, list) else ""),
            )
        sections[section] = value
    for key, value in body.items():
        kline = line_of(body, key)
        if key not in SECTIONS:
            near = difflib.get_close_matches(str(key), SECTIONS, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            warnings.append(
                f"{graph.path}:{kline}: group {show(name)}: ignoring key {show(key)} "
                f"({hint}ansible reads only vars, children and hosts)"
            )
            continue
        value = sections[key]
        if value is None:
            continue
        if key == "vars":
            for var, val in value.items():
                _check_var(graph, var, line_of(value, var))
                graph.set_group_var(name, var, val, line_of(value, var))
        elif key == "children":
            for child, child_body in value.items():
                cline = line_of(value, child)
                if not isinstance(child_body, (dict, type(None))):
                    graph.fail(
                        cline,
                        f"group {show(name)}: child group {show(child)} must be a "
                        f"mapping or empty, got {type_name(child_body)}",
                    )
                child = _group(graph, child, child_body, cline, warnings)
                graph.add_child(name, child, cline)
        else:
            for pattern, hvars in value.items():
                _hosts(graph, name, pattern, hvars, line_of(value, pattern), warnings)
    return name


def _hosts(graph: Graph, group: str, pattern, hvars, line, warnings: list[str]) -> None:
    if not isinstance(pattern, str):
        graph.fail(line, f"group {show(group)}: host name {show(pattern)} must be a string (quote numbers)")
    try:
        names, port = hostpattern.parse(pattern)
    except hostpattern.PatternError as exc:
        graph.fail(line, f"group {show(group)}: host {show(pattern)}: {exc}")
    if hvars is None:
        hvars = {}
    if not isinstance(hvars, dict):
        graph.fail(line, f"host {show(pattern)}: expected a mapping of variables or nothing, got {type_name(hvars)}")
    for var in hvars:
        _check_var(graph, var, line_of(hvars, var))
    for host in names:
        if not hostpattern.valid_name(host):
            graph.fail(line, f"host name {show(host)} is not allowed: use {hostpattern.NAME_RULE}")
        new = host not in graph.hosts
        node = graph.add_host(host, group, line)
        if new and port is not None:
            node.vars["ansible_port"] = port
            node.var_lines["ansible_port"] = line
        # ansible's set_variable looks the name up among groups first: vars of a
        # host named like an existing group land on that group (and it warns).
        as_group = host in graph.groups
        if hvars and as_group:
            warnings.append(
                f"{graph.path}:{line}: host {show(host)} has the name of a group: "
                f"its vars apply to group {show(host)}, as in ansible"
            )
        for var, val in hvars.items():
            if as_group:
                graph.set_group_var(host, var, val, line_of(hvars, var))
            else:
                node.vars[var] = val
                node.var_lines[var] = line_of(hvars, var)


def _check_var(graph: Graph, var, line) -> None:
    if not isinstance(var, str) or not var:
        graph.fail(line, f"variable name {show(var)} must be a non-empty string")
