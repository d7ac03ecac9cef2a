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

ROOT = Path(__file__).resolve().parents[1]
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


def test_hosts_setting_gpus_per_host_are_the_default_targets():
    assert _selected() == GPU_HOSTS  # before: bastion and prom01 too
    assert _selected("monitoring") == ["rtx01"]  # --limit narrows the targets, as in Ansible


def test_a_limit_of_only_non_targets_is_an_error_naming_them():
    with pytest.raises(UserError, match=r"--limit 'bastion' selects only hosts that are not targets "
                                        r"\(bastion\); the targets are the hosts that set gpus_per_host"):
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
