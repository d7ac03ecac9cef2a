"""Global options shared by every command."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import click

from k26ops import config, inventory
from k26ops.engine import multinode, secret_policy
from k26ops.errors import UserError
from k26ops.inventory.targets import targets
from k26ops.transport.fleet import FleetOptions


def lab_dir_record() -> Path:
    """Where `lab up` writes the directory of the lab it started ($XDG_STATE_HOME/k26ops/lab-dir)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(state) / "k26ops" / "lab-dir"


def remember_lab_dir(directory: Path | None) -> None:
    """After `lab up --dir D`, later commands find D without K26OPS_LAB_DIR;
    None forgets it (`lab down --purge` of that lab)."""
    rec = lab_dir_record()
    if directory is None:
        rec.unlink(missing_ok=True)
        return
    rec.parent.mkdir(parents=True, exist_ok=True)
    tmp = rec.with_suffix(".tmp")
    tmp.write_text(str(Path(directory).resolve()) + "\n")
    tmp.replace(rec)


def default_lab_dir() -> Path:
    """$K26OPS_LAB_DIR, else the directory the last `lab up` used (while it
    exists), else ~/.local/share/k26ops/lab."""
    if os.environ.get("K26OPS_LAB_DIR"):
        return Path(os.environ["K26OPS_LAB_DIR"])
    try:
        remembered = Path(lab_dir_record().read_text().strip())
    except (OSError, ValueError):
        remembered = None
    if remembered and remembered.is_absolute() and remembered.is_dir():
        return remembered
    return Path.home() / ".local/share/k26ops/lab"


def load_inventory(path) -> inventory.Inventory:
    """The CLI's one way to load an inventory: its secret policy (secret_vars,
    secret_patterns) is put in force before anything is printed or sent."""
    inv = inventory.load(path)
    secret_policy.use(inv.secret_policy)
    return inv


@dataclass
class Settings:
    inventory: str | None = None
    limit: str | None = None
    as_json: bool = False
    verbose: int = 0
    lab_dir: str | None = None
    forks: int = 16
    deadline: float = 3600.0
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    strict: bool = False  # unknown inventory variables are an error
    warnings: tuple = ()  # the loaded inventory's warnings, for --json output
    sources: dict = field(default_factory=dict)  # setting -> "--forks", "config PATH", "default"...
    said: set = field(default_factory=set, repr=False)  # warnings already printed (a command selects often)
    loaded: dict = field(default_factory=dict, repr=False)  # (path, mtime, size) -> Inventory: one read per command

    @property
    def lab_path(self) -> Path:
        return Path(self.lab_dir) if self.lab_dir else default_lab_dir()

    def inventory_path(self) -> Path:
        """--inventory, else $K26OPS_INVENTORY, else the running lab's inventory."""
        if self.inventory:
            return Path(self.inventory)
        lab_inv = self.lab_path / "inventory.yml"
        if lab_inv.exists():
            return lab_inv
        raise UserError(
            "no inventory: pass --inventory PATH, set K26OPS_INVENTORY, or start the lab with `k26ops lab up`"
        )

    def targets(self, inv):
        """The hosts commands act on by default (k26ops.inventory.targets): the
        config file's `targets` pattern, else the hosts setting gpus_per_host."""
        pattern = config.load().get("targets")
        return targets(inv, pattern, f"config {config.config_path()}")

    def only_targets(self, inv, hosts: list, pattern: str | None) -> list:
        """`hosts` (after --limit) that are targets; a --limit that selects only
        hosts outside the targets is an error naming them, never a silent no-op."""
        t = self.targets(inv)
        kept = [h for h in hosts if h.name in t.names]
        if hosts and not kept:
            names = ", ".join(h.name for h in hosts[:5]) + (" ..." if len(hosts) > 5 else "")
            raise UserError(
                f"{inv.path}: --limit {pattern!r} selects only hosts that are not targets "
                f"({names}); the targets are {t.why}"
            )
        return kept

    def fleet_options(self):
        return FleetOptions(
            forks=self.forks,
            deadline=self.deadline,
            connect_timeout=self.connect_timeout,
            accept_new_host_keys=self.accept_new_host_keys,
        )

    def selected_hosts(self):
        """The inventory's hosts after --limit (UserError on a bad inventory or limit)."""
        inv, hosts = self.select(self.limit)
        if not hosts:
            raise UserError(f"{inv.path}: no hosts selected")
        return hosts

    def select(self, pattern: str | None):
        """(inventory, its hosts matching `pattern` with their multi-node vars filled);
        the inventory's warnings go to stderr, each once per command. The one place
        hosts are selected."""
        path = self.inventory_path()
        try:
            st = path.stat()
            key = (str(path), st.st_mtime_ns, st.st_size)
        except OSError:
            key = None  # inventory.load names the problem
        inv = self.loaded.get(key) if key else None
        if inv is None:
            inv = load_inventory(path)
            if key:
                self.loaded.clear()
                self.loaded[key] = inv
        else:
            secret_policy.use(inv.secret_policy)  # as load_inventory does for a fresh one
        for w in getattr(inv, "warnings", []):
            if w not in self.said:
                self.said.add(w)
                click.echo(f"k26ops: warning: {w}", err=True)
        inv.check_strict(self.strict)
        self.warnings = tuple(inv.warnings)
        hosts = self.only_targets(inv, inv.select(pattern), pattern)
        inv.check_vault(hosts)
        multinode.assign(inv, hosts)
        if any(h.vars.get("gateways") for h in hosts):
            # lazy: the gateway's steps (about 10 ms) only for an inventory whose hosts name one
            from k26ops.steps.gateway import drain_targets

            drain_targets(inv, hosts)
        return inv, hosts
