"""--limit is Ansible's host-pattern language: for each pattern below, k26ops
selects exactly the hosts ansible-core itself selects with `--limit` on the
same multi-group inventory, and refuses (one line, exit 2) what Ansible refuses
(with Ansible's `host_pattern_mismatch = error`, the setting k26ops follows)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from k26ops.cli import cli
from k26ops.errors import UserError
from k26ops.inventory import load

ROOT = Path(__file__).resolve().parent.parents[1]
INV = ROOT / "tests/data/inventories/ansible-patterns.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("ansible-inventory") is None and not os.environ.get("CI"),
    reason="ansible-core (test extra) not installed",
)

PATTERNS = [
    "all",
    "*",
    "gpu",
    "gpu:!b300",
    "gpu:&monitoring",
    "gpu,!b300",
    "gpu,&monitoring",
    "rtxpro6000[0]",
    "rtxpro6000[1:3]",
    "rtxpro6000[-1]",
    "rtxpro6000[3:]",
    "rtxpro6000[1:0]",
    "gpu[0:1]",
    "gpu[2:]",
    "gpu[0]:web",
    "rtx0[1:3]",
    "rtx[01:03]",
    "~rtx0[12]",
    "~b300-[ab]",
    "~.*\\.example\\.com",
    "~(rtx|b300)",
    "*.example.com",
    "rtx*",
    "rtx0?",
    "web:db",
    "web,db",
    "web , db",
    "all:!staging",
    "staging:&prod",
    "!staging",
    "&monitoring",
    "monitoring:!rtx01",
    "b300-[a:b]",
    "10.0.0.5",
    "10.0.0.5:22",
    "prom01.example.com",
    "db*:&staging",
    "gpu:monitoring:!rtx0*",
    "ungrouped",
    "al*",
    "nosuch",
    "gpu:nosuch",
    "rtxpro6000[9]",
    "rtx0[1-2]",
    "~(",
    "~example",
    "~0[12]",
    "web[0]:&prod",
    "*[0:2]",
    "rtx01:&rtx02",
]

# Runs ansible-core's own InventoryManager (the code behind `ansible -l`): one
# process for every pattern. Prints {pattern: sorted hosts | {"error": text}}.
ANSIBLE_SCRIPT = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.inventory.manager import InventoryManager
path, patterns = sys.argv[1], json.loads(sys.argv[2])
out = {}
for p in patterns:
    im = InventoryManager(loader=DataLoader(), sources=[path])
    try:
        im.subset(p)
        out[p] = sorted(h.name for h in im.get_hosts("all"))
    except Exception as exc:
        out[p] = {"error": str(exc)}
print(json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")


def _ansible_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_CONFIG=str(home / "none.cfg"),
        ANSIBLE_INVENTORY_ENABLED="yaml",
        ANSIBLE_HOST_PATTERN_MISMATCH="error",
        ANSIBLE_NOCOLOR="1",
    )
    return env


@pytest.fixture(scope="module")
def ansible_hosts(tmp_path_factory):
    home = tmp_path_factory.mktemp("ansible-home")
    listfile = home / "limit.txt"
    listfile.write_text("rtx02\nweb*\n\n")
    patterns = PATTERNS + [f"@{listfile}", f"@{listfile}:!web2.example.com"]
    proc = subprocess.run(
        [sys.executable, "-c", ANSIBLE_SCRIPT, str(INV), json.dumps(patterns)],
        env=_ansible_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=home,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), patterns


def _k26ops(inv, pattern):
    try:
        return sorted(h.name for h in inv.select(pattern))
    except UserError as exc:
        assert "\n" not in str(exc)
        return {"error": str(exc)}


def test_at_least_25_patterns_some_refused():
    assert len(PATTERNS) >= 25


def test_same_hosts_as_ansible_for_every_pattern(ansible_hosts):
    expected, patterns = ansible_hosts
    inv = load(INV, ssh_config=None)
    differ = {}
    for p in patterns:
        want, got = expected[p], _k26ops(inv, p)
        if want == []:  # ansible's commands refuse an empty selection ("no hosts to target"): so does k26ops
            want = {"error": "no hosts"}
        if isinstance(want, dict) or isinstance(got, dict):
            if not (isinstance(want, dict) and isinstance(got, dict)):
                differ[p] = (want, got)
        elif want != got:
            differ[p] = (want, got)
    assert not differ, differ
    # and the comparison means something: most patterns select hosts, a few are refused
    assert sum(bool(expected[p]) and isinstance(expected[p], list) for p in patterns) >= 30
    assert sum(isinstance(expected[p], dict) for p in patterns) >= 4


def test_the_harness_agrees_with_the_ansible_command(tmp_path, ansible_hosts):
    """The InventoryManager script above gives what `ansible -l` lists."""
    expected, _ = ansible_hosts
    for p in ("gpu:!b300", "rtxpro6000[1:3]"):
        proc = subprocess.run(
            ["ansible", "all", "-i", str(INV), "-l", p, "--list-hosts"],
            env=_ansible_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        listed = sorted(line.strip() for line in proc.stdout.splitlines()[1:] if line.strip())
        assert listed == expected[p]


LOOPBACK = """\
hosts:
  a: {address: 127.0.0.1, port: 1}
  b: {address: 127.0.0.1, port: 1}
groups:
  g: {hosts: [a, b]}
"""


@pytest.mark.parametrize(
    "args",
    [
        ["status", "-l", "nosuch"],
        ["-l", "a[1:3]", "status"],
        ["inventory", "list", "-l", "~("],
        ["logs", "-l", "g[5]"],
        ["-l", "~a[", "status"],
    ],
)  # Ansible reads ~a[ as ~a: refused here
def test_refused_patterns_are_one_line_exit_2(tmp_path, args):
    inv = tmp_path / "inv.yml"  # loopback only: nothing listens on port 1
    inv.write_text(LOOPBACK)
    res = CliRunner().invoke(cli, ["-i", str(inv), "--connect-timeout", "1", *args])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("k26ops: error: ")


def _leaves(group, path=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _leaves(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def test_every_command_takes_the_global_options_in_its_own_place():
    """--json and -v everywhere; -i/-l/-f where the command uses them (globalopts.USES), and
    then both spellings; -C/-D beside --check/--diff."""
    from k26ops.cli.globalopts import uses

    flags = {"inventory": ("-i", "--inventory"), "limit": ("-l", "--limit"), "forks": ("-f", "--forks")}
    for path, cmd in _leaves(cli):
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"--json", "-v"} <= opts, (path, opts)
        for attr, spellings in flags.items():
            assert (set(spellings) <= opts) == (attr in uses(" ".join(path))), (path, attr, opts)
        assert ("--check" in opts) == ("-C" in opts) and ("--diff" in opts) == ("-D" in opts), path


def test_global_options_after_the_command_take_effect(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(LOOPBACK)
    res = CliRunner().invoke(
        cli, ["--connect-timeout", "1", "status", "-i", str(inv), "-l", "g:!b", "-f", "2", "--json"]
    )
    assert list(json.loads(res.stdout)["hosts"]) == ["a"]
    res = CliRunner().invoke(cli, ["-i", str(inv), "config", "show", "-f", "3", "--json"])
    assert json.loads(res.stdout)["settings"]["forks"] == {"value": 3, "source": "--forks"}
