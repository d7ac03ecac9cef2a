"""k26ops reads every Ansible-shape test inventory exactly as ansible-inventory
does: same hosts, same (transitive) group membership, same effective
address/port/user/become. Runs the real ansible-inventory from ansible-core."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from k26ops.cli import cli

ROOT = Path(__file__).resolve().parent.parents[1]
DATA = ROOT / "tests/data/inventories"
# Directory inventories, INI, and a hosts.yml with group_vars/host_vars beside it (34.1).
LAYOUTS = [
    DATA / "ansible-dir",
    DATA / "ansible-dir/hosts.yml",
    DATA / "ansible-ini-dir",
    DATA / "ansible-ini-dir/hosts",
]
FILES = sorted(DATA.glob("ansible-*.yml")) + [ROOT / "inventory/example-ansible.yml"] + LAYOUTS

pytestmark = pytest.mark.skipif(
    shutil.which("ansible-inventory") is None and not os.environ.get("CI"),
    reason="ansible-core (test extra) not installed",
)


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")


def _ansible_list(path: Path, home: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_CONFIG=str(home / "none.cfg"),
        ANSIBLE_INVENTORY_ENABLED="yaml,ini" if path in LAYOUTS else "yaml",
        ANSIBLE_INVENTORY_UNPARSED_FAILED="true",
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.run(
        ["ansible-inventory", "-i", str(path), "--list"], env=env, capture_output=True, text=True, timeout=120, cwd=home
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def ansible_out(tmp_path_factory):
    """ansible-inventory's answers for FILES: run once for these inventories' bytes and
    this ansible-core, then read from the test cache (15 ansible starts, 8-16 s); any
    change to a file under tests/data/inventories, the example, ansible-core or this
    checkout's path (it is in the messages) runs them again."""
    import hashlib
    import importlib.metadata

    import sglang_release

    digest = hashlib.sha256(f"{importlib.metadata.version('ansible-core')}\0{ROOT}\0".encode())
    for f in sorted([*DATA.rglob("*"), ROOT / "inventory/example-ansible.yml"]):
        if f.is_file():
            digest.update(f"{f.relative_to(ROOT)}\0".encode() + f.read_bytes() + b"\0")
    cached = sglang_release.CACHE / "ansible-inventory" / f"{digest.hexdigest()[:24]}.json"
    if cached.exists():
        saved = json.loads(cached.read_text())
        return {f: tuple(saved[str(f)]) for f in FILES}
    home = tmp_path_factory.mktemp("ansible-home")
    with ThreadPoolExecutor(8) as pool:
        out = dict(zip(FILES, pool.map(lambda p: _ansible_list(p, home), FILES)))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({str(f): list(v) for f, v in out.items()}))
    tmp.rename(cached)
    return out


def _expected(listing: dict) -> dict:
    """host -> groups (transitive, with all), address, port, user, per ansible."""
    children = {g: d.get("children", []) for g, d in listing.items() if g != "_meta"}
    direct = {g: d.get("hosts", []) for g, d in listing.items() if g != "_meta"}
    hostvars = listing.get("_meta", {}).get("hostvars", {})

    def descendants(g, seen=None):
        seen = seen if seen is not None else set()
        for c in children.get(g, []):
            if c not in seen:
                seen.add(c)
                descendants(c, seen)
        return seen

    hosts: dict = {}
    for g in direct:
        for h in direct[g]:
            hosts.setdefault(h, {"groups": {"all"}})
    for g in children.keys() | direct.keys():
        for member in {g} | descendants(g):
            for h in direct.get(member, []):
                hosts[h]["groups"].add(g)
    for h, info in hosts.items():
        hv = hostvars.get(h, {})
        info["address"] = hv.get("ansible_ssh_host", hv.get("ansible_host", h))
        port = hv.get("ansible_ssh_port", hv.get("ansible_port"))
        info["port"] = int(port) if port is not None else None
        info["user"] = hv.get("ansible_ssh_user", hv.get("ansible_user"))
        info["become"] = str(hv.get("ansible_become", False)).lower() in ("y", "yes", "on", "1", "true", "t")
    return hosts


def _k26ops_list(path: Path) -> dict:
    result = CliRunner().invoke(cli, ["--inventory", str(path), "inventory", "list", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(p.parents[1])) for p in FILES])
def test_same_hosts_groups_address_port_user_become_as_ansible_inventory(path, ansible_out):
    listing, _ = ansible_out[path]
    expected = _expected(listing)
    ours = _k26ops_list(path)["hosts"]
    assert list(ours) == list(ours)  # order is ours; the set must match
    assert set(ours) == set(expected)
    for name, exp in expected.items():
        got = ours[name]
        assert set(got["groups"]) == exp["groups"], name
        assert got["address"] == exp["address"], name
        assert got["port"] == exp["port"], name
        assert got["user"] == exp["user"], name
        assert got["become"] is exp["become"], name


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(p.parents[1])) for p in FILES])
def test_same_merged_vars_as_ansible_inventory(path, ansible_out):
    """Variable precedence (all < parent < child < host, priority, name) matches."""
    listing, _ = ansible_out[path]
    hostvars = listing.get("_meta", {}).get("hostvars", {})
    ours = _k26ops_list(path)["hosts"]
    for name, got in ours.items():
        exp = {
            k: ("<vault>" if isinstance(v, dict) and "__ansible_vault" in v else v)
            for k, v in hostvars.get(name, {}).items()
        }
        assert got["vars"] == exp, name


def test_ignored_group_keys_warned_like_ansible(ansible_out):
    path = DATA / "ansible-typo.yml"
    _, ansible_err = ansible_out[path]
    assert "Skipping unexpected key (host) in group (gpus)" in ansible_err
    assert "Skipping 'notagroup'" in ansible_err
    result = CliRunner().invoke(cli, ["-i", str(path), "inventory", "list"], catch_exceptions=False)
    assert result.exit_code == 0
    warnings = result.stderr.splitlines()
    assert (
        f"k26ops: warning: {path}:4: group 'gpus': ignoring key 'host' (did you mean "
        f"'hosts'? ansible reads only vars, children and hosts)" in warnings
    )
    assert any("'var'" in w and "did you mean 'vars'?" in w for w in warnings)
    assert any("'notagroup'" in w and "not a valid group definition" in w for w in warnings)


def test_group_vars_typos_warned_once_with_file_and_line():
    """A typo in group_vars/ is named with its own file:line, once (not once per host)."""
    result = CliRunner().invoke(cli, ["-i", str(DATA / "ansible-dir"), "inventory", "list"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    typo = [w for w in result.stderr.splitlines() if "releases_dir" in w]
    assert typo == [
        f"k26ops: warning: {DATA}/ansible-dir/group_vars/gpu/main.yml:2: group gpu: "
        f"releases_dir: unknown; did you mean releases_root?"
    ], result.stderr
    result = CliRunner().invoke(
        cli, ["--strict", "-i", str(DATA / "ansible-ini-dir/hosts"), "inventory", "list"], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert f"{DATA}/ansible-ini-dir/group_vars/gpu.yml:2: group gpu: gpus_per_hots: unknown" in result.stderr


def test_show_names_the_group_vars_file_a_value_came_from():
    result = CliRunner().invoke(
        cli, ["-i", str(DATA / "ansible-dir"), "inventory", "show", "rtx02", "--json"], catch_exceptions=False
    )
    origins = json.loads(result.stdout)["hosts"]["rtx02"]["origins"]
    assert origins["address"] == f"host_vars/rtx02, var ansible_host, {DATA}/ansible-dir/host_vars/rtx02.yml:1"
    assert origins["become"].startswith("group_vars/all, var ansible_become, ") and origins["become"].endswith(
        "group_vars/all/10-base.yml:1"
    )


def test_a_vars_file_encrypted_whole_is_refused_in_one_line(tmp_path):
    shutil.copytree(DATA / "ansible-dir", tmp_path / "inv")
    vault = tmp_path / "inv/group_vars/gpu/vault.yml"
    vault.write_text("$ANSIBLE_VAULT;1.1;AES256\n6162636465666768\n")
    result = CliRunner().invoke(cli, ["-i", str(tmp_path / "inv"), "inventory", "list"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"k26ops: error: {vault}: encrypted whole with ansible-vault")


def test_ini_errors_name_file_and_line(tmp_path):
    p = tmp_path / "hosts.ini"
    p.write_text("[gpu:children]\nrtx\n")
    result = CliRunner().invoke(cli, ["-i", str(p), "inventory", "list"])
    assert result.exit_code == 2
    assert f"{p}:2: group 'rtx' is used here but never defined" in result.stderr
