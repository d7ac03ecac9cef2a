"""~/.ssh/config as OpenSSH would apply it (HostName, Port, User, IdentityFile,
ProxyJump), for fields the inventory leaves unset. Read with paramiko; the
path can be changed with $K26OPS_SSH_CONFIG (empty: none), so tests never read
the real one."""

from __future__ import annotations

import os
from pathlib import Path

import paramiko

from k26ops.errors import UserError
from k26ops.inventory.yamlsrc import oneline


def default_path() -> Path | None:
    env = os.environ.get("K26OPS_SSH_CONFIG")
    if env is not None:
        return Path(env) if env else None
    return Path.home() / ".ssh" / "config"


class SSHConfig:
    def __init__(self, path: Path | None):
        self.path = path
        self._config = None
        if path is not None and path.is_file():
            try:
                self._config = paramiko.SSHConfig.from_path(str(path))
            except Exception as exc:  # paramiko raises many kinds on bad input
                raise UserError(oneline(f"{path}: cannot read ssh config: {exc}")) from None

    def lookup(self, name: str) -> dict:
        """Settings ssh_config gives for `name`: hostname, port, user,
        identity_file, gateway (only those it sets)."""
        if self._config is None:
            return {}
        try:
            found = self._config.lookup(name)
        except Exception as exc:
            raise UserError(oneline(f"{self.path}: cannot apply ssh config to {name!r}: {exc}")) from None
        out: dict = {}
        if found.get("hostname") and found["hostname"] != name:
            out["address"] = found["hostname"]
        if "port" in found:
            try:
                out["port"] = int(found["port"])
            except ValueError:
                raise UserError(oneline(f"{self.path}: Port {found['port']!r} for {name!r} is not a number")) from None
        if found.get("user"):
            out["user"] = found["user"]
        if found.get("identityfile"):
            out["identity_file"] = found["identityfile"][0]
        if found.get("proxyjump") and found["proxyjump"].lower() != "none":
            out["gateway"] = found["proxyjump"]
        return out
