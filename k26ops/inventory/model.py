"""What the rest of k26ops sees: hosts with effective connection fields, groups
with their (transitive) members, and the warnings the load produced."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from k26ops.engine.secret_policy import SecretPolicy
from k26ops.errors import UserError


@dataclass
class Host:
    name: str
    address: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    gateway: str | None = None  # ProxyJump spec: [user@]host[:port][,...]
    known_hosts: str | None = None  # extra known_hosts file (the lab's)
    connection: str = "ssh"  # "ssh" or "local"
    become: bool = False  # run every command as root through `sudo -n` (see k26ops.transport.ssh)
    groups: list[str] = field(default_factory=list)  # transitive, incl. "all"
    vars: dict = field(default_factory=dict)  # merged, precedence applied
    notes: list[str] = field(default_factory=list)  # unevaluated values etc.
    unresolved: list[str] = field(default_factory=list)  # fields holding Jinja/vault
    origins: dict[str, str] = field(default_factory=dict)  # field -> "group gpu, line 7"
    vault_used: list[str] = field(default_factory=list)  # "FILE:LINE: VAR" of !vault values k26ops reads


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group -> every host in it (transitively)
    warnings: list[str] = field(default_factory=list)
    shape: str = "native"  # or "ansible"
    children: dict[str, list[str]] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)  # group -> its own hosts, in order
    unknown_vars: list[str] = field(default_factory=list)  # also in warnings (k26ops.inventory.variables)
    secret_policy: SecretPolicy = SecretPolicy()  # its secret_vars / secret_patterns (see secret_policy.use)

    def check_strict(self, strict: bool) -> None:
        """--strict: a variable k26ops does not read is an error (exit 2), not a warning."""
        if strict and self.unknown_vars:
            more = f" (and {len(self.unknown_vars) - 1} more)" if len(self.unknown_vars) > 1 else ""
            raise UserError(f"{self.unknown_vars[0]}{more} (--strict)")

    def check_vault(self, hosts: list[Host]) -> None:
        """k26ops never decrypts: a !vault value it would use (hf_token, ansible_host,
        engine_env...) is refused in one line naming where it is, before any host
        is contacted, instead of sending the text `<vault>` (inventory list/show
        still show such values as <vault>; values only other tools read are left alone)."""
        for h in hosts:
            if h.vault_used:
                more = f" (and {len(h.vault_used) - 1} more)" if len(h.vault_used) > 1 else ""
                raise UserError(
                    f"{h.vault_used[0]} is a !vault value and k26ops does not decrypt "
                    f"ansible-vault: give host {h.name} the value in plain text (or, for "
                    f"HF_TOKEN, through this node's environment){more}"
                )

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching --limit, in inventory order (see k26ops.inventory.limit)."""
        # lazy: the --limit grammar's compiled patterns (3-10 ms at CLI start) only when hosts are selected
        from k26ops.inventory.limit import select

        return select(self, limit)

    def host(self, name: str) -> Host:
        """One host by name; an unknown name is a UserError listing near matches."""
        # lazy: as in select
        from k26ops.inventory.limit import unknown

        if name in self.hosts:
            return self.hosts[name]
        raise unknown(self, name, "host")
