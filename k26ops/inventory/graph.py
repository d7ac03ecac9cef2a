"""Groups, hosts and variable precedence, shared by both inventory shapes.

The rules are ansible-inventory's, so an Ansible inventory means the same here:
`all` is the root of every group, `ungrouped` holds hosts in no other group,
group names are global, a group's depth is its longest path from `all`, and
variables merge all < shallower group < deeper group < host (ties by
`ansible_group_priority`, then name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from k26ops.errors import UserError
from k26ops.inventory.yamlsrc import oneline, show


class At(int):
    """A line number that knows its file: an inventory may be many files
    (a directory, group_vars/, host_vars/), and a message must name the right one.
    It is an int everywhere else (formatting, comparisons)."""

    file: Path

    def __new__(cls, line: int, file: Path):
        self = super().__new__(cls, line)
        self.file = file
        return self


def file_of(line, default: Path) -> Path:
    return getattr(line, "file", default)


@dataclass
class _Node:
    """What a group and a host both have: their own vars (inline, then from
    group_vars/ or host_vars/ files) and the line each was written on."""

    name: str
    line: int | None = None
    vars: dict = field(default_factory=dict)
    var_lines: dict = field(default_factory=dict)
    file_vars: dict = field(default_factory=dict)  # from group_vars/ or host_vars/ files
    file_lines: dict = field(default_factory=dict)  # their lines (At: file and line)


@dataclass
class GroupNode(_Node):
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    host_set: set = field(default_factory=set)  # the same names: membership in O(1) at 200k hosts
    depth: int = 0
    priority: int = 1  # ansible_group_priority: orders groups of equal depth


@dataclass
class HostNode(_Node):
    fields: dict = field(default_factory=dict)  # native shape: field -> (value, line)
    groups: list[str] = field(default_factory=list)  # direct groups


@dataclass
class Origin:
    """Where a value came from, for messages and `inventory show`."""

    level: str  # "host", "group NAME", "all", "ssh_config", "host name"
    line: int | None = None  # an At when the value is from another file than the inventory
    var: str | None = None


class Graph:
    def __init__(self, path: Path):
        self.path = path
        self.groups: dict[str, GroupNode] = {}
        self.hosts: dict[str, HostNode] = {}
        self.group("all")
        self.group("ungrouped")
        self.add_child("all", "ungrouped")

    def fail(self, line: int | None, message: str):
        where = f"{file_of(line, self.path)}:{line}" if line else f"{self.path}"
        raise UserError(oneline(f"{where}: {message}"))

    def stamp(self, file: Path) -> None:
        """Mark every plain line number set so far as one of `file` (after each
        inventory file of a directory is parsed)."""
        for node in [*self.groups.values(), *self.hosts.values()]:
            for k, line in node.var_lines.items():
                if line is not None and not isinstance(line, At):
                    node.var_lines[k] = At(line, file)
            if node.line is not None and not isinstance(node.line, At):
                node.line = At(node.line, file)

    def group(self, name: str, line: int | None = None) -> GroupNode:
        node = self.groups.get(name)
        if node is None:
            node = self.groups[name] = GroupNode(name, line)
        elif node.line is None:
            node.line = line
        return node

    def host(self, name: str, line: int | None = None) -> HostNode:
        node = self.hosts.get(name)
        if node is None:
            node = self.hosts[name] = HostNode(name, line)
        return node

    def set_group_var(self, group: str, var: str, value, line: int | None) -> None:
        """As ansible: `ansible_group_priority` sets the priority, it is not a var."""
        g = self.group(group)
        if var == "ansible_group_priority":
            try:
                g.priority = int(value)
            except (TypeError, ValueError):
                self.fail(line, f"group {show(group)}: ansible_group_priority must be an integer, got {show(value)}")
            return
        g.vars[var] = value
        g.var_lines[var] = line

    def add_child(self, parent: str, child: str, line: int | None = None) -> None:
        if child == parent or child in self.ancestors(parent):
            self.fail(line, f"group {show(child)} as a child of {show(parent)} makes a loop of groups")
        p, c = self.group(parent), self.group(child)
        if child not in p.children:
            p.children.append(child)
            c.parents.append(parent)

    def add_host(self, host: str, group: str, line: int | None = None) -> HostNode:
        node = self.host(host, line)
        g = self.group(group)
        if host not in g.host_set:
            g.hosts.append(host)
            g.host_set.add(host)
            node.groups.append(group)
        return node

    def ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.groups[name].parents) if name in self.groups else []
        while todo:
            g = todo.pop()
            if g not in seen:
                seen.add(g)
                todo.extend(self.groups[g].parents)
        return seen

    def finish(self) -> None:
        """ansible's reconcile: parentless groups go under `all`; `ungrouped`; depths."""
        for name in list(self.groups):
            if name != "all" and not self.groups[name].parents:
                self.add_child("all", name, self.groups[name].line)
        ungrouped = self.groups["ungrouped"]
        for host in self.hosts.values():
            others = set(self.member_of(host.name)) - {"all", "ungrouped"}
            if others and "ungrouped" in host.groups:
                host.groups.remove("ungrouped")
                ungrouped.host_set.discard(host.name)
            elif not others and "ungrouped" not in host.groups:
                self.add_host(host.name, "ungrouped")
        ungrouped.hosts = [h for h in ungrouped.hosts if h in ungrouped.host_set]
        self._depths()

    def _depths(self) -> None:
        """Longest path from `all` (the graph is acyclic: add_child refuses loops)."""
        for g in self.groups.values():
            g.depth = 0
        todo = ["all"]
        while todo:
            parent = self.groups[todo.pop()]
            for child in parent.children:
                c = self.groups[child]
                if c.depth < parent.depth + 1:
                    c.depth = parent.depth + 1
                    todo.append(child)

    def member_of(self, host: str) -> list[str]:
        """Every group of `host`, transitively, in precedence order (all first)."""
        direct = self.hosts[host].groups
        names = set(direct)
        for g in direct:
            names |= self.ancestors(g)
        return sorted(names, key=self._rank)

    def _rank(self, name: str):
        g = self.groups[name]
        return (g.depth, g.priority, name)

    def group_hosts(self, name: str) -> list[str]:
        """Hosts of a group and of all its descendants, in inventory order."""
        wanted: set[str] = set()
        todo, seen = [name], set()
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            wanted.update(self.groups[g].hosts)
            todo.extend(self.groups[g].children)
        return [h for h in self.hosts if h in wanted]

    def merged_vars(self, host: str) -> tuple[dict, dict[str, Origin]]:
        """Ansible's order (VariableManager with the default precedence): inline
        vars of `all`, then of the host's groups; then group_vars/all, then the
        groups' group_vars files; then the host's inline vars, then host_vars.
        So group_vars/all.yml beats a child group's inline vars, as in ansible."""
        values: dict = {}
        origins: dict[str, Origin] = {}
        groups = [self.groups[g] for g in self.member_of(host)]
        h = self.hosts[host]
        layers = [(g, g.vars, "all" if g.name == "all" else f"group {g.name}") for g in groups]
        layers += [(g, g.file_vars, f"group_vars/{g.name}") for g in groups]
        layers += [(h, h.vars, "host"), (h, h.file_vars, f"host_vars/{host}")]
        for node, layer, level in layers:
            for k, v in layer.items():
                values[k] = v
                origins[k] = Origin(level, node.var_lines.get(k) if layer is node.vars else node.file_lines.get(k), k)
        return values, origins
