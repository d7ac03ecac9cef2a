"""Which hosts a command acts on when --limit does not say: a playbook's `hosts:`.

An Ansible inventory holds more than GPU hosts (the bastion, the Prometheus
box); deploying the engine to them is never what was meant. The default target
is, in order: the `targets` host pattern of the config file; else the hosts
that set `gpus_per_host` (at any level: the GPU group's vars, as the example
inventory writes it), when any does; else every host (an inventory of GPU hosts
only, as the lab's). `--limit` then narrows the targets, as Ansible's --limit
narrows a play's hosts. `inventory list` shows the targets and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from k26ops.inventory.model import Inventory

MARKER_VAR = "gpus_per_host"


@dataclass
class Targets:
    names: set[str]
    why: str


def targets(inv: Inventory, pattern: str | None = None, source: str = "config") -> Targets:
    if pattern:
        return Targets({h.name for h in inv.select(pattern)}, f"targets = {pattern!r} ({source})")
    marked = {h.name for h in inv.hosts.values() if h.vars.get(MARKER_VAR) is not None}
    if marked:
        return Targets(marked, f"the hosts that set {MARKER_VAR} (set `targets` in the config file to choose)")
    return Targets(set(inv.hosts), f"every host (none sets {MARKER_VAR})")
