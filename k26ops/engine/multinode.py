"""Multi-node tensor parallel: a group of hosts forming one engine.

A host whose vars set `tp_group: GROUP` is one node of the engine formed by
that inventory group's hosts, in inventory order: `nnodes` is the group's
size, `node_rank` the host's position, and `dist_init_addr` the first host's
address with `dist_init_port` (default 5000). These become the engine's
`--nnodes`, `--node-rank` and `--dist-init-addr`. Only rank 0 serves HTTP,
so health and smoke run there (its health covers the whole engine: it is
ready only when every node joined).
"""

from __future__ import annotations

from k26ops.errors import UserError
from k26ops.hostvars import Var, declare

DEFAULT_DIST_INIT_PORT = 5000

declare(
    __name__,
    "multi-node",
    Var("tp_group", "str (group)", None, "this host is one node of the engine formed by that group's hosts"),
    Var("dist_init_port", "int", DEFAULT_DIST_INIT_PORT, "port of --dist-init-addr on the first node"),
)
# Set by `assign` from tp_group; k26ops.engine.profile passes them to the engine.
ENGINE_VARS = declare(
    __name__,
    "multi-node",
    Var("nnodes", "int", None, "--nnodes (normally set by tp_group)", "set from tp_group"),
    Var("node_rank", "int", None, "--node-rank (normally set by tp_group)", "set from tp_group"),
    Var("dist_init_addr", "str", None, "--dist-init-addr (normally set by tp_group)", "set from tp_group"),
)


def assign(inv, hosts) -> None:
    """Fill nnodes/node_rank/dist_init_addr into the vars of hosts with `tp_group`."""
    for h in hosts:
        group = h.vars.get("tp_group")
        if not group:
            continue
        peers = inv.groups.get(str(group))
        if peers is None:
            raise UserError(f"{inv.path}: host {h.name}: tp_group {group!r} is not a group of this inventory")
        peers = [p for p in inv.hosts if p in set(peers)]  # inventory order
        if h.name not in peers:
            raise UserError(f"{inv.path}: host {h.name}: tp_group {group!r} does not contain it")
        first = inv.hosts[peers[0]]
        port = h.vars.get("dist_init_port", DEFAULT_DIST_INIT_PORT)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise UserError(f"{inv.path}: host {h.name}: dist_init_port must be a port number, got {port!r}")
        if len(peers) > 1:
            h.vars.update(nnodes=len(peers), node_rank=peers.index(h.name), dist_init_addr=f"{first.address}:{port}")


def serves_http(host_vars: dict) -> bool:
    """Rank 0 (or a single-node engine) serves the HTTP API."""
    return int(host_vars.get("node_rank") or 0) == 0
