"""Inventory: which hosts exist, how to reach them, their groups and variables.

(Placeholder loader for the native shape; the full loader with the Ansible
shape and validation replaces it, keeping this API.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from k26ops.errors import UserError


@dataclass
class Host:
    name: str
    address: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    gateway: str | None = None  # ProxyJump spec: [user@]host[:port]
    known_hosts: str | None = None  # extra known_hosts file (the lab's)
    connection: str = "ssh"  # "ssh" or "local"
    groups: list[str] = field(default_factory=list)
    vars: dict = field(default_factory=dict)


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, list[str]]

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching --limit (comma-separated host or group names), in inventory order."""
        if not limit:
            return list(self.hosts.values())
        wanted: set[str] = set()
        for item in (p.strip() for p in limit.split(",") if p.strip()):
            if item in self.hosts:
                wanted.add(item)
            elif item in self.groups:
                wanted.update(self.groups[item])
            else:
                raise UserError(f"{self.path}: --limit names unknown host or group {item!r}")
        return [h for n, h in self.hosts.items() if n in wanted]


def load(path: Path | str) -> Inventory:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise UserError(f"{path}: cannot read inventory: {exc.strerror}") from None
    hosts = {}
    for name, spec in (data.get("hosts") or {}).items():
        spec = dict(spec or {})
        hvars = {**(data.get("vars") or {}), **(spec.pop("vars", None) or {})}
        hosts[name] = Host(name=name, vars=hvars, groups=["all"], **spec)
    return Inventory(path=path, hosts=hosts, groups={"all": list(hosts)})
