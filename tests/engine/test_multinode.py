"""A group of hosts as one tensor-parallel engine: --nnodes/--node-rank/--dist-init-addr
derived from the inventory group, checked against the real 0.5.23 flags on lab hosts."""

from __future__ import annotations

import re

import pytest
import yaml

from k26ops import inventory
from k26ops.engine import multinode
from k26ops.errors import UserError
from labtools.invoke import k26ops


def _inv(tmp_path, text: str):
    p = tmp_path / "inv.yml"
    p.write_text(text)
    return inventory.load(p, ssh_config=False)


def test_ranks_follow_inventory_order_and_first_host_is_the_rendezvous(tmp_path):
    inv = _inv(
        tmp_path,
        """
hosts:
  gpu-a: {address: 10.0.0.11}
  gpu-b: {address: 10.0.0.12}
  gpu-c: {address: 10.0.0.13}
  solo: {address: 10.0.0.20}
groups:
  k26-tp16: {hosts: [gpu-b, gpu-a], vars: {tp_group: k26-tp16, dist_init_port: 5123}}
""",
    )
    hosts = inv.select(None)
    multinode.assign(inv, hosts)
    v = {h.name: h.vars for h in hosts}
    assert (v["gpu-a"]["nnodes"], v["gpu-a"]["node_rank"], v["gpu-a"]["dist_init_addr"]) == (2, 0, "10.0.0.11:5123")
    assert (v["gpu-b"]["nnodes"], v["gpu-b"]["node_rank"], v["gpu-b"]["dist_init_addr"]) == (2, 1, "10.0.0.11:5123")
    assert "nnodes" not in v["solo"] and "nnodes" not in v["gpu-c"]
    assert multinode.serves_http(v["gpu-a"]) and not multinode.serves_http(v["gpu-b"])


def test_unknown_group_is_one_line_naming_host_and_group(tmp_path):
    inv = _inv(tmp_path, "hosts:\n  a: {address: 10.0.0.1, vars: {tp_group: nope}}\n")
    with pytest.raises(UserError, match=r"inv.yml: host a: tp_group 'nope' is not a group of this inventory"):
        multinode.assign(inv, inv.select(None))


def test_group_engine_renders_node_flags_on_lab_hosts(lab, tmp_path):
    base = yaml.safe_load(lab.inventory.read_text())
    names = [h.name for h in lab.hosts[:2]]
    base["groups"]["tp"] = {"hosts": names, "vars": {"tp_group": "tp"}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(base))
    proc = k26ops("-i", str(path), "--limit", names[1], "deploy", "--check", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # the unit (new or changed) runs node 1 of 2 with the first host as rendezvous;
    # the flags passed the check against the release's real sglang sources
    assert re.search(r"^\+ExecStart=.*--nnodes 2 --node-rank 1 --dist-init-addr 127\.0\.0\.1:5000", out, re.M), out
