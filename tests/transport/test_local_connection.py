"""`connection: local`: an inventory host that is this machine, reached without SSH
(real /bin/sh here, real CLI in a subprocess; no GPU on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

from k26ops import inventory
from labtools.invoke import cli

LOCAL = "hosts:\n  here:\n    connection: local\n"


def _inv(tmp_path: Path, text: str = LOCAL) -> Path:
    p = tmp_path / "local.yml"
    p.write_text(text)
    return p


def _os_id() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("ID="):
            return line[3:].strip().strip('"')
    return ""


def test_local_host_needs_no_address(tmp_path):
    h = inventory.load(_inv(tmp_path)).select(None)
    assert [(x.name, x.connection) for x in h] == [("here", "local")]


def test_ssh_host_still_needs_an_address(tmp_path):
    proc = cli("-i", str(_inv(tmp_path, "hosts:\n  there: {user: root}\n")), "facts")
    assert proc.returncode == 2
    assert "no address" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_facts_json_on_the_local_machine(tmp_path):
    proc = cli("-i", str(_inv(tmp_path)), "facts", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    host = json.loads(proc.stdout)["hosts"]["here"]
    assert host["status"] == "ok" and host["commands"] >= 1
    assert host["facts"]["os_release"]["id"] == _os_id()
    assert host["gpus"] == 0  # no GPU here: reported, not a failure of facts


def test_check_runs_on_the_local_machine(tmp_path):
    proc = cli("-i", str(_inv(tmp_path)), "check", "--json", timeout=120)
    host = json.loads(proc.stdout)["hosts"]["here"]
    # It ran here (no GPU, so the preflight fails on gpus), it did not try to connect.
    assert proc.returncode == 1 and host["status"] == "failed"
    assert any(part.startswith("gpus:") for part in host["error"].split("; ")), host["error"]  # the recipe's lock too
    assert "Traceback" not in proc.stderr
