"""The native k26ops shape, the shipped examples, precedence, fields from vars,
ssh_config fallbacks, --limit selection and the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from k26ops.cli import cli
from k26ops.inventory import Host, Inventory, Vault, load

ROOT = Path(__file__).resolve().parent.parents[1]
EXAMPLE = ROOT / "inventory/example-rtxpro6000.yml"

LAB = """\
hosts:
  lab1: {address: 127.0.0.1, port: 2221, user: root, identity_file: /x/id_ed25519,
         known_hosts: /x/known_hosts}
  lab2: {address: 127.0.0.1, port: 2222, user: root, identity_file: /x/id_ed25519,
         known_hosts: /x/known_hosts}
  lab3: {address: 127.0.0.1, port: 2223, user: root, identity_file: /x/id_ed25519,
         known_hosts: /x/known_hosts}
groups:
  lab:
    hosts: [lab1, lab2, lab3]
    vars: {gpus_per_host: 8, fake_gpus: true}
"""


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")


def _write(tmp_path, text, name="inv.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_lab_shape(tmp_path):
    inv = load(_write(tmp_path, LAB))
    assert isinstance(inv, Inventory) and inv.shape == "native"
    # fake_gpus is read by nothing: loaded and shown, with a warning (k26ops.inventory.variables)
    assert (
        inv.warnings == inv.unknown_vars == [f"{inv.path}:11: group lab: fake_gpus: unknown; k26ops does not read it"]
    )
    assert list(inv.hosts) == ["lab1", "lab2", "lab3"]
    h = inv.hosts["lab2"]
    assert isinstance(h, Host)
    assert (h.address, h.port, h.user, h.identity_file, h.known_hosts, h.gateway, h.connection) == (
        "127.0.0.1",
        2222,
        "root",
        "/x/id_ed25519",
        "/x/known_hosts",
        None,
        "ssh",
    )
    assert h.groups == ["all", "lab"]
    assert h.vars == {"gpus_per_host": 8, "fake_gpus": True}
    assert inv.groups["lab"] == ["lab1", "lab2", "lab3"]
    assert inv.groups["all"] == ["lab1", "lab2", "lab3"]
    assert inv.groups["ungrouped"] == []


def test_example_rtxpro6000():
    inv = load(EXAMPLE)
    assert inv.warnings == []
    rtx = inv.select("rtxpro6000")
    assert [h.name for h in rtx] == ["rtx-a01", "rtx-a02", "rtx-a03"]
    for h in rtx:
        assert h.vars["gpus_per_host"] == 8
        assert h.vars["compute_capability"] == "12.0"
        assert h.gateway == "ops@bastion.gpu.example.internal:22"
        assert h.user == "k26ops"
        assert h.vars["model_path"] == "/srv/models/Kimi-K2.6"
        assert set(h.groups) == {"all", "engines", "rtxpro6000"}
    assert inv.hosts["rtx-a03"].port == 2222 and inv.hosts["rtx-a01"].port is None
    for h in inv.select("b300"):
        assert h.vars["compute_capability"] == "10.0"
        assert h.vars["model_path"] == "/nvme/models/Kimi-K2.6"  # group beats all


def test_precedence_and_fields_from_vars(tmp_path):
    inv = load(
        _write(
            tmp_path,
            """\
vars: {user: alluser, port: 1000, color: all, gateway: jump@b1}
hosts:
  a: {address: 10.0.0.1, vars: {color: host, port: 1003}}
  b: {address: 10.0.0.2, port: 1004, vars: {port: 9999}}
  c: {address: 10.0.0.3, groups: [solo]}
groups:
  parent:
    vars: {user: parentuser, port: 1001, color: parent}
    children: [child]
  child:
    hosts: [a, b]
    vars: {port: 1002, color: child, address: 10.9.9.9}
""",
        )
    )
    a, b, c = inv.hosts["a"], inv.hosts["b"], inv.hosts["c"]
    assert (a.port, a.user, a.vars["color"], a.address) == (1003, "parentuser", "host", "10.0.0.1")
    assert b.port == 1004  # an explicit host field beats the host's vars
    assert (c.port, c.user, c.vars["color"], c.gateway) == (1000, "alluser", "all", "jump@b1")
    assert a.groups == ["all", "parent", "child"]
    assert inv.groups["parent"] == ["a", "b"]
    assert a.origins["user"] == "group parent, var user, line 8"
    assert c.groups == ["all", "solo"]


def test_port_and_user_stay_none_without_inventory_or_ssh_config(tmp_path):
    h = load(_write(tmp_path, "hosts: {a: {address: 10.0.0.1}}\n")).hosts["a"]
    assert (h.port, h.user, h.identity_file, h.gateway) == (None, None, None, None)


def test_ssh_config_fills_unset_fields(tmp_path, monkeypatch):
    cfg = _write(
        tmp_path,
        """\
Host gpu-alias
  HostName 10.7.0.1
  Port 2022
  User cfguser
  IdentityFile /keys/id_cfg
  ProxyJump jump@bastion
Host 10.0.0.*
  User subnetuser
""",
        "ssh_config",
    )
    monkeypatch.setenv("K26OPS_SSH_CONFIG", str(cfg))
    inv = load(
        _write(
            tmp_path,
            """\
all:
  hosts:
    gpu-alias:
    other:
      ansible_host: 10.0.0.5
      ansible_user: invuser
    third:
      ansible_host: 10.0.0.6
""",
        )
    )
    g = inv.hosts["gpu-alias"]
    assert (g.address, g.port, g.user, g.identity_file, g.gateway) == (
        "10.7.0.1",
        2022,
        "cfguser",
        "/keys/id_cfg",
        "jump@bastion",
    )
    assert g.origins["port"] == "ssh_config"
    assert inv.hosts["other"].user == "invuser"  # the inventory wins
    assert inv.hosts["third"].user == "subnetuser"
    # an explicit path overrides the environment; None means no ssh_config
    assert load(inv.path, ssh_config=None).hosts["gpu-alias"].port is None
    native = load(_write(tmp_path, "hosts: {gpu-alias: {}}\n", "n.yml"))
    assert native.hosts["gpu-alias"].address == "10.7.0.1"  # HostName satisfies address


def test_vault_and_jinja_kept_with_notes(tmp_path):
    inv = load(
        _write(
            tmp_path,
            """\
all:
  vars:
    token: !vault |
      $ANSIBLE_VAULT;1.1;AES256
      6162
  hosts:
    a:
      ansible_host: "{{ lookup('env', 'ADDR') }}"
      ansible_port: "{{ port_var }}"
      model: "{{ base }}/m"
""",
        )
    )
    a = inv.hosts["a"]
    assert a.address == "{{ lookup('env', 'ADDR') }}"
    assert a.port is None
    assert sorted(a.unresolved) == ["address", "port"]
    assert isinstance(a.vars["token"], Vault)
    assert "vars.token is a !vault value, not decrypted (shown as <vault>)" in a.notes
    assert "vars.model is a Jinja expression, kept as written: '{{ base }}/m'" in a.notes
    assert any(n.startswith("port is a Jinja expression, not evaluated") for n in a.notes)


def test_native_vault_values_load(tmp_path):
    inv = load(
        _write(
            tmp_path,
            "hosts:\n  a:\n    address: 10.0.0.1\n    vars:\n      hf_token: !vault $ANSIBLE_VAULT;1.1;AES256 6162\n",
        )
    )
    assert repr(inv.hosts["a"].vars["hf_token"]) == "<vault>"


@pytest.mark.parametrize(
    "limit, names",
    [
        (None, ["a1", "a2", "b1", "b2", "x"]),
        ("", ["a1", "a2", "b1", "b2", "x"]),
        ("a1", ["a1"]),
        ("ga", ["a1", "a2"]),
        ("ga,b1", ["a1", "a2", "b1"]),
        (" b1 , ga ", ["a1", "a2", "b1"]),
        ("a?", ["a1", "a2"]),
        ("b*", ["b1", "b2"]),
        ("a*", ["a1", "a2", "b1", "b2", "x"]),  # as in ansible, `a*` also matches group `all`
        ("g*", ["a1", "a2", "b1", "b2"]),
        ("all,!x", ["a1", "a2", "b1", "b2"]),
        ("gall,&ga", ["a1", "a2"]),
        ("gall,!a1", ["a2", "b1", "b2"]),
        ("~^b\\d$", ["b1", "b2"]),
        ("x", ["x"]),  # a host and a group of the same name: both match
        ("*", ["a1", "a2", "b1", "b2", "x"]),
    ],
)
def test_limit(limit, names, tmp_path):
    inv = load(
        _write(
            tmp_path,
            """\
hosts:
  a1: {address: 10.0.0.1}
  a2: {address: 10.0.0.2}
  b1: {address: 10.0.0.3}
  b2: {address: 10.0.0.4}
  x: {address: 10.0.0.5}
groups:
  ga: {hosts: [a1, a2]}
  gb: {hosts: [b1, b2]}
  gall: {children: [ga, gb]}
  x: {hosts: [x]}
""",
        )
    )
    assert [h.name for h in inv.select(limit)] == names


def test_ansible_connection_and_unknown_connection_warns(tmp_path):
    inv = load(
        _write(
            tmp_path,
            """\
all:
  hosts:
    here: {ansible_connection: local}
    box: {ansible_connection: docker}
""",
        )
    )
    assert inv.hosts["here"].connection == "local"
    assert inv.warnings == [
        f"{inv.path}: host 'box': ansible_connection 'docker' is not one k26ops can use (ssh or local)"
    ]


def test_cli_json_shape(tmp_path):
    path = _write(tmp_path, LAB)
    result = CliRunner().invoke(
        cli, ["--json", "-i", str(path), "--limit", "lab1,lab3", "inventory", "list"], catch_exceptions=False
    )
    assert result.exit_code == 0
    assert result.stderr == f"k26ops: warning: {path}:11: group lab: fake_gpus: unknown; k26ops does not read it\n"
    doc = json.loads(result.stdout)
    assert list(doc["hosts"]) == ["lab1", "lab3"]
    assert doc["hosts"]["lab1"] == {
        "address": "127.0.0.1",
        "port": 2221,
        "user": "root",
        "identity_file": "/x/id_ed25519",
        "gateway": None,
        "known_hosts": "/x/known_hosts",
        "connection": "ssh",
        "become": False,
        "groups": ["all", "lab"],
        "vars": {"gpus_per_host": 8, "fake_gpus": True},
        "notes": [],
    }
    assert doc["groups"]["lab"] == ["lab1", "lab3"]


def test_cli_json_nulls_and_odd_values(tmp_path):
    path = _write(
        tmp_path,
        """\
all:
  hosts:
    a:
      when: 2024-05-01
      big: .inf
      tags: !!set {x, y}
      loop: &l [1, *l]
      token: !vault abc
""",
    )
    result = CliRunner().invoke(cli, ["-i", str(path), "inventory", "list", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    a = json.loads(result.stdout)["hosts"]["a"]
    assert (a["port"], a["user"], a["address"]) == (None, None, "a")
    assert a["groups"] == ["all", "ungrouped"]
    assert a["vars"] == {
        "when": "2024-05-01",
        "big": "inf",
        "tags": ["x", "y"],
        "loop": [1, "<recursive>"],
        "token": "<vault>",
    }


def test_cli_human_output_and_show(tmp_path):
    path = _write(
        tmp_path,
        """\
all:
  vars: {pw: !vault abc}
  children:
    gpus:
      host: {typo: }
      hosts:
        "gpu[1:2]":
          ansible_host: 10.0.0.9
          ansible_port: 2200
          label: "[bold]not markup[/bold]"
""",
    )
    result = CliRunner().invoke(cli, ["-i", str(path), "inventory", "list"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stderr == (
        f"k26ops: warning: {path}:5: group 'gpus': ignoring key 'host' "
        f"(did you mean 'hosts'? ansible reads only vars, children and "
        f"hosts)\n"
    )
    out = result.stdout
    for text in (
        "gpu1",
        "gpu2",
        "10.0.0.9",
        "2200",
        "all, gpus",
        "[bold]not markup[/bold]",
        "note: gpu1, gpu2: vars.pw is a !vault value, not decrypted",
    ):
        assert text in out, text
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["-i", str(path), "inventory", "show", "gpu2"], catch_exceptions=False
    )
    assert result.exit_code == 0
    assert "host, var ansible_port, line 9" in result.stdout
    result = CliRunner().invoke(cli, ["-i", str(path), "--json", "inventory", "show", "gpu2"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert doc["hosts"]["gpu2"]["port"] == 2200
    assert doc["hosts"]["gpu2"]["origins"]["address"] == "host, var ansible_host, line 8"
