"""The default target (34.2): the equivalent of a playbook's `hosts:`, so the
bastion and the Prometheus box of an Ansible inventory are never deploy targets
unless asked for. No host is contacted: selection fails or succeeds before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from k26ops.cli import cli
from k26ops.cli.context import Settings
from k26ops.errors import UserError

ROOT = Path(__file__).resolve().parent.parents[1]
EXAMPLE = ROOT / "inventory/example-ansible.yml"
GPU_HOSTS = ["rtx01", "rtx02", "rtx03", "b300-a", "b300-b"]


@pytest.fixture(autouse=True)
def _no_config(monkeypatch, tmp_path):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")
    monkeypatch.setenv("K26OPS_CONFIG", str(tmp_path / "config.toml"))
    (tmp_path / "config.toml").write_text("")


def _selected(limit=None) -> list[str]:
    _inv, hosts = Settings(inventory=str(EXAMPLE)).select(limit)
    return [h.name for h in hosts]


@pytest.fixture(autouse=True)
def _example_without_vault(tmp_path, monkeypatch):
    """The example's hf_token is a !vault value, which selecting hosts refuses
    (test_vault_value_k26ops_reads_is_refused_when_hosts_are_selected)."""
    text = (ROOT / "inventory/example-ansible.yml").read_text()
    start = text.index("        hf_token: !vault")
    end = text.index("    monitoring:")
    p = tmp_path / "example.yml"
    p.write_text(text[:start] + text[end:])
    monkeypatch.setattr(__import__(__name__), "EXAMPLE", p)


def test_hosts_setting_gpus_per_host_are_the_default_targets():
    assert _selected() == GPU_HOSTS  # before: bastion and prom01 too
    assert _selected("monitoring") == ["rtx01"]  # --limit narrows the targets, as in Ansible


def test_a_limit_of_only_non_targets_is_an_error_naming_them():
    with pytest.raises(
        UserError,
        match=r"--limit 'bastion' selects only hosts that are not targets "
        r"\(bastion\); the targets are the hosts that set gpus_per_host",
    ):
        _selected("bastion")
    result = CliRunner().invoke(cli, ["-i", str(EXAMPLE), "-l", "bastion", "facts"])
    assert result.exit_code == 2 and "not targets" in result.stderr


def test_config_targets_pattern_wins(tmp_path):
    (tmp_path / "config.toml").write_text('targets = "monitoring:bastion"\n')
    assert _selected() == ["rtx01", "prom01", "bastion"]
    result = CliRunner().invoke(cli, ["-i", str(EXAMPLE), "config", "show"])
    assert "targets          monitoring:bastion  (config" in result.stdout


def test_inventory_without_gpus_per_host_targets_every_host(tmp_path):
    p = tmp_path / "inv.yml"
    p.write_text("hosts: {a: {address: 127.0.0.1}, b: {address: 127.0.0.2}}\n")
    _inv, hosts = Settings(inventory=str(p)).select(None)
    assert [h.name for h in hosts] == ["a", "b"]


def test_inventory_list_shows_targets_and_why():
    result = CliRunner().invoke(cli, ["-i", str(EXAMPLE), "inventory", "list"])
    assert result.exit_code == 0, result.stderr
    assert "targets: 5 of 7 hosts: the hosts that set gpus_per_host" in result.stdout
    assert "not targets (only with a config `targets` pattern naming them): prom01, bastion" in result.stdout
    doc = json.loads(CliRunner().invoke(cli, ["-i", str(EXAMPLE), "inventory", "list", "--json"]).stdout)
    assert doc["targets"] == GPU_HOSTS and "gpus_per_host" in doc["targets_why"]


def test_vault_value_k26ops_reads_is_refused_when_hosts_are_selected(tmp_path):
    """Before: hf_token: !vault went to the hosts' env file as the text `<vault>`."""
    example = ROOT / "inventory/example-ansible.yml"
    with pytest.raises(
        UserError,
        match=rf"^{example}:28: hf_token is a !vault value and k26ops "
        r"does not decrypt ansible-vault: give host rtx01",
    ):
        Settings(inventory=str(example)).select(None)
    result = CliRunner().invoke(cli, ["-i", str(example), "inventory", "list"])  # shown, not refused
    assert result.exit_code == 0 and "vars.hf_token is a !vault value" in result.stdout
    p = tmp_path / "other.yml"  # a vault value only another tool reads is left alone
    p.write_text(
        "all:\n  vars:\n    db_password: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n      6162\n"
        "    ansible_become_password: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n      6163\n"
        "  hosts: {a: {ansible_host: 127.0.0.1}}\n"
    )
    _inv, hosts = Settings(inventory=str(p)).select(None)
    assert [h.name for h in hosts] == ["a"]
