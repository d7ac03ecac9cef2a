"""Every bad inventory is one line on stderr naming file, line and key/value,
with exit code 2 and no traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from k26ops.cli import cli

ADDR = "hosts:\n  gpu1: {address: 10.0.0.1}\n"

CASES = {
    # name: (inventory text, expected message after "k26ops: error: {path}")
    "unknown host key": (
        "hosts:\n  gpu1:\n    address: 10.0.0.1\n    adress: 10.0.0.2\n",
        ":4: host 'gpu1': unknown key 'adress' (did you mean 'address'?)",
    ),
    "unknown top key": (ADDR + "hsots: {}\n", ":3: unknown key 'hsots' (did you mean 'hosts'?)"),
    "unknown group key": (
        ADDR + "groups:\n  g:\n    host: [gpu1]\n",
        ":5: group 'g': unknown key 'host' (did you mean 'hosts'?)",
    ),
    "port not a number": (
        'hosts:\n  gpu1:\n    address: 10.0.0.1\n    port: "22x"\n',
        ":4: host 'gpu1': port must be an integer 1..65535, got '22x' (from host, port)",
    ),
    "port out of range": (
        "hosts:\n  gpu1:\n    address: 10.0.0.1\n    port: 70000\n",
        ":4: host 'gpu1': port must be an integer 1..65535, got 70000 (from host, port)",
    ),
    "native port is a string": (
        'hosts:\n  gpu1:\n    address: 10.0.0.1\n    port: "2222"\n',
        ":4: host 'gpu1': port must be an integer 1..65535, got '2222' (from host, port)",
    ),
    "port from group vars": (
        ADDR + "groups:\n  g:\n    hosts: [gpu1]\n    vars:\n      port: 0\n",
        ":7: host 'gpu1': port must be an integer 1..65535, got 0 (from group g, port)",
    ),
    "ansible_port a bool": (
        "all:\n  hosts:\n    a:\n      ansible_port: true\n",
        ":4: host 'a': port must be an integer 1..65535, got True (from host, ansible_port)",
    ),
    "native hosts a list": ("hosts:\n  - gpu1\n", ":1: hosts must be a mapping, got a list"),
    "ansible hosts a list": (
        "all:\n  hosts:\n    - gpu1\n",
        ":2: group 'all': hosts must be a mapping, got a list (Ansible's YAML "
        "shape lists hosts as keys: `hosts: {a:, b:}`)",
    ),
    "missing address": (
        "hosts:\n  gpu1:\n    user: root\n",
        ":2: host 'gpu1': no address (set address:, or a HostName in ssh config)",
    ),
    "null host in native": (
        "hosts:\n  gpu1:\n",
        ":2: host 'gpu1': no address (set address:, or a HostName in ssh config)",
    ),
    "duplicate host": (
        ADDR + "  gpu1: {address: 10.0.0.2}\n",
        ":3:3: YAML error: duplicate key 'gpu1' (first at line 2)",
    ),
    "duplicate key in ansible shape": (
        "all:\n  hosts:\n    a:\n  hosts:\n    c:\n",
        ":4:3: YAML error: duplicate key 'hosts' (first at line 2)",
    ),
    "yaml syntax": (
        "hosts:\n  gpu1: {address: 10.0.0.1\n  gpu2: x\n",
        ":3:7: YAML error: expected ',' or '}', but got ':' (while parsing a flow mapping)",
    ),
    "tab indent": (
        "hosts:\n\tgpu1: {}\n",
        ":2:1: YAML error: found character '\\t' that cannot start any token (while scanning for the next token)",
    ),
    "empty file": ("", ": inventory is empty"),
    "only comments": ("# nothing here\n", ": inventory is empty"),
    "top-level list": ("- a\n- b\n", ":1: inventory must be a mapping at the top level, got a list"),
    "top-level string": ("hello\n", ":1: inventory must be a mapping at the top level, got a string"),
    "group lists unknown host": (
        ADDR + "groups:\n  g:\n    hosts: [gpu2]\n",
        ":5: group 'g' lists host 'gpu2', which is not under hosts: (near: gpu1)",
    ),
    "unknown child group": (
        ADDR + "groups:\n  g:\n    children: [h]\n",
        ":5: group 'g' lists child group 'h', which is not defined",
    ),
    "group loop": (
        "all:\n  children:\n    a:\n      children:\n        b:\n          children:\n            a:\n",
        ":5: group 'b' as a child of 'a' makes a loop of groups",
    ),
    "hostile host name": (
        'all:\n  hosts:\n    "gpu1;reboot":\n',
        ":3: host name 'gpu1;reboot' is not allowed: use letters, digits and . _ - : @ % + (not starting with - or .)",
    ),
    "integer host name": ("all:\n  hosts:\n    1:\n", ":3: group 'all': host name 1 must be a string (quote numbers)"),
    "bad range": (
        "all:\n  hosts:\n    gpu[1:x]:\n",
        ":3: group 'all': host 'gpu[1:x]': host range [1:x] must be numbers or single letters",
    ),
    "huge range": (
        "all:\n  hosts:\n    gpu[1:99999999]:\n",
        ":3: group 'all': host 'gpu[1:99999999]': host range [1:99999999] expands to more than 10000 hosts",
    ),
    "address with shell": (
        'hosts:\n  gpu1: {address: "10.0.0.1; reboot"}\n',
        ":2: host 'gpu1': address '10.0.0.1; reboot' has spaces, control "
        "characters or a leading '-' (from host, address)",
    ),
    "address like an option": (
        'hosts:\n  gpu1: {address: "-oProxyCommand=x"}\n',
        ":2: host 'gpu1': address '-oProxyCommand=x' has spaces, control "
        "characters or a leading '-' (from host, address)",
    ),
    "bad connection": (
        "hosts:\n  gpu1: {address: 10.0.0.1, connection: docker}\n",
        ":2: host 'gpu1': connection must be ssh or local, got 'docker'",
    ),
    "unknown tag": (
        "hosts:\n  gpu1: !foo {address: 10.0.0.1}\n",
        ":2:9: YAML error: could not determine a constructor for the tag '!foo'",
    ),
    "plugin config": ("plugin: aws_ec2\n", ":1: this is an inventory plugin configuration, not a YAML inventory"),
    "vars a list": (
        "hosts:\n  gpu1: {address: 10.0.0.1, vars: [a]}\n",
        ":2: host 'gpu1': vars must be a mapping, got a list",
    ),
    "user an integer": (
        "hosts:\n  gpu1: {address: 10.0.0.1, user: 5}\n",
        ":2: host 'gpu1': user must be a non-empty string, got an integer (from host, user)",
    ),
    "two documents": (
        "hosts: {}\n---\nhosts: {}\n",
        ":2:1: YAML error: but found another document (expected a single document in the stream)",
    ),
    "newline in a key": (
        'hosts:\n  "gpu\\n1": {address: 10.0.0.1}\n',
        ":2: host name 'gpu\\n1' is not allowed: use letters, digits and . _ - : @ % + (not starting with - or .)",
    ),
    "priority not a number": (
        "all:\n  children:\n    g:\n      vars:\n        ansible_group_priority: high\n",
        ":5: group 'g': ansible_group_priority must be an integer, got 'high'",
    ),
    # issue 42: `check` said ok, deploy said `invalid literal for int()` naming nothing
    "engine_port not a number": (
        "hosts:\n  gpu1:\n    address: 10.0.0.1\n    vars: {engine_port: abc}\n",
        ":4: host gpu1: engine_port: 'abc' is not a whole number",
    ),
    "number var not a number": (
        "vars:\n  selftest_min_tflops: fast\nhosts:\n  gpu1: {address: 10.0.0.1}\n",
        ":2: vars: selftest_min_tflops: 'fast' is not a number",
    ),
}


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")


def _run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_inventory_is_one_line_naming_file_and_line(name, tmp_path):
    text, expected = CASES[name]
    path = tmp_path / "inv.yml"
    path.write_text(text)
    result = _run("--inventory", str(path), "inventory", "list")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"k26ops: error: {path}{expected}\n"


def test_not_utf8(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_bytes(b"hosts:\n  \xff\xfe: 1\n")
    result = _run("-i", str(path), "inventory", "list")
    assert (result.exit_code, result.stderr) == (2, f"k26ops: error: {path}: inventory is not UTF-8 text (byte 9)\n")


def test_missing_file_and_directory(tmp_path):
    missing = tmp_path / "nope.yml"
    result = _run("-i", str(missing), "inventory", "list")
    assert (result.exit_code, result.stderr) == (
        2,
        f"k26ops: error: {missing}: cannot read inventory: No such file or directory\n",
    )
    result = _run("-i", str(tmp_path), "inventory", "list")  # a directory is an inventory (34.1); empty, refused
    assert (result.exit_code, result.stderr) == (
        2,
        f"k26ops: error: {tmp_path}: inventory directory holds no inventory file\n",
    )


def test_unreadable_file(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_path / "inv.yml"
    path.write_text(ADDR)
    path.chmod(0)
    result = _run("-i", str(path), "inventory", "list")
    assert (result.exit_code, result.stderr) == (
        2,
        f"k26ops: error: {path}: cannot read inventory: Permission denied\n",
    )


@pytest.mark.parametrize(
    "limit, expected",
    [
        ("gpu9", ": no host or group named 'gpu9' (near: gpu1, gpu2)"),
        ("gpu1,gpux", ": no host or group named 'gpux' (near: gpu1, gpu2)"),
        ("rackk", ": no host or group named 'rackk' (near: rack)"),
        ("zzz*", ": --limit pattern 'zzz*' matches no host or group"),
        ("gpu1,!gpu1", ": --limit 'gpu1,!gpu1' selects no hosts"),
        ("empty", ": --limit 'empty' selects no hosts"),
    ],
)
def test_bad_limit(limit, expected, tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(
        "hosts:\n  gpu1: {address: 10.0.0.1}\n  gpu2: {address: 10.0.0.2}\n"
        "groups:\n  rack: {hosts: [gpu1, gpu2]}\n  empty:\n"
    )
    result = _run("-i", str(path), "--limit", limit, "inventory", "list")
    assert (result.exit_code, result.stderr) == (2, f"k26ops: error: {path}{expected}\n")


def test_bad_regex_limit(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(ADDR)
    result = _run("-i", str(path), "inventory", "list", "--limit", "~gpu[")
    assert result.exit_code == 2
    assert result.stderr.startswith("k26ops: error: --limit '~gpu[': bad regular expression: ")
    assert result.stderr.count("\n") == 1


def test_show_unknown_host(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(ADDR)
    result = _run("-i", str(path), "inventory", "show", "gpu2")
    assert (result.exit_code, result.stderr) == (2, f"k26ops: error: {path}: no host named 'gpu2' (near: gpu1)\n")


def test_bad_ssh_config_port(tmp_path, monkeypatch):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host 10.0.0.*\n  Port twenty\n")
    monkeypatch.setenv("K26OPS_SSH_CONFIG", str(cfg))
    path = tmp_path / "inv.yml"
    path.write_text(ADDR)
    result = _run("-i", str(path), "inventory", "list")
    assert result.exit_code == 2
    assert result.stderr == f"k26ops: error: {cfg}: Port 'twenty' for '10.0.0.1' is not a number\n"
