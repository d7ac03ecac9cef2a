"""`k26ops baselines delete` and `baselines repin` on the real lab: two
snapshots of different releases, deleting the older tag unpins only its
release (the directory stays for the next deploy's prune), an unknown tag or
--check changes nothing, a release another tag records stays pinned, and an
unreachable host keeps its stale pins while the tag deletion stands, until
`repin` fixes it.

Works on lab2 of the shared lab with an engine port and a releases root of its
own; at the end the engine unit, env file, service state and that releases
root are removed and lab2's pinned-releases is put back as it was found.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.ports import free_port_block
from labtools.recipes import recipe_with_extra_patch

HOST = "lab2"
RELEASES = "/opt/k26ops/test-delete-releases"
PINS = "/opt/k26ops/state/pinned-releases"
UNIT = "/etc/systemd/system/k26-engine.service"
OLD, NEW, AGAIN, LAST = "k26-old", "k26-new", "k26-again", "k26-last"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def pins(lab) -> list[str]:
    return lab.ssh(HOST, f"cat {PINS}").split()


def current(lab) -> str:
    return lab.ssh(HOST, f"readlink {RELEASES}/current").strip()


def untouched(lab, env) -> tuple:
    """Everything delete/repin could change: the repository's refs and the host's pins and current."""
    repo = env["repo"]
    return (
        git(repo, "for-each-ref") + git(repo, "rev-parse", "HEAD") + git(repo, "status", "--porcelain"),
        lab.ssh(HOST, f"cat {PINS}; ls -la {PINS}"),
        current(lab),
    )


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    """lab2 deployed twice (two releases), snapshot after each: OLD records r1, NEW r2."""
    d = tmp_path_factory.mktemp("delete")
    found = lab_ssh(lab.dir, lab.port(HOST), f"cat {PINS}")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["hosts"][HOST]["vars"].update(engine_port=free_port_block(1, start=41000, stop=45000), releases_root=RELEASES)
    base = d / "inventory.yml"
    base.write_text(yaml.safe_dump(inv))
    inv["vars"]["recipe"] = str(recipe_with_extra_patch(d, "delete-test"))
    changed = d / "changed-inventory.yml"
    changed.write_text(yaml.safe_dump(inv))
    e = {**lab.env(), "K26OPS_INVENTORY": str(base), "K26OPS_BASELINES": str(d / "baselines")}
    state = {"env": e, "base": base, "repo": d / "baselines", "dir": d}
    try:
        for key, inventory, tag in (("r1", base, OLD), ("r2", changed, NEW)):
            rc, data = k26ops_json("-i", str(inventory), "--limit", HOST, "deploy", env=e)
            assert rc == 0, data
            state[key] = data["hosts"][HOST]["release"]
            rc, data = k26ops_json("--limit", HOST, "snapshot", "--tag", tag, env=e)
            assert rc == 0 and data["hosts"][HOST]["pinned"], data
        assert state["r1"] != state["r2"]
        yield state
    finally:
        restore = f"printf %s {shlex.quote(found.stdout)} > {PINS}" if found.returncode == 0 else f"rm -f {PINS}"
        lab_ssh(
            lab.dir,
            lab.port(HOST),
            f"systemctl disable --now k26-engine.service; rm -f {UNIT} /etc/k26ops/sglang.env; "
            f"rm -rf {RELEASES} /opt/k26ops/state/service; {restore}; systemctl daemon-reload; "
            "systemctl reset-failed k26-engine.service 2>/dev/null; true",
        )


def test_delete_older_tag_unpins_only_its_release(lab, env):
    r1, r2, repo = env["r1"], env["r2"], env["repo"]
    assert {r1, r2} <= set(pins(lab))
    old_commit = git(repo, "rev-parse", f"{OLD}^{{commit}}").strip()
    cur = current(lab)
    rc, data = k26ops_json("baselines", "delete", OLD, env=env["env"])
    assert rc == 0, data
    assert data["tags"] == [OLD] and not data["check"] and data["stale_pins"] == {}
    assert list(data["hosts"]) == [HOST]  # only the host the tag recorded
    h = data["hosts"][HOST]
    assert h["status"] == "changed" and h["unpinned"] == [r1] and r2 in h["pins"] and r1 not in h["pins"]
    assert git(repo, "tag", "--list").split() == [NEW]
    git(repo, "cat-file", "-e", old_commit)  # only the tag went; the commit stays in history
    on_host = pins(lab)
    assert r1 not in on_host and r2 in on_host
    lab.ssh(HOST, f"test -f {RELEASES}/{r1}/manifest.json")  # not deleted here: the next deploy's prune frees it
    assert current(lab) == cur
    assert not lab.ssh(HOST, "ls -A /opt/k26ops/state | grep -F .pinned-releases. || true").strip()  # no temp left


def test_unknown_tag_is_one_line_and_changes_nothing(lab, env):
    before = untouched(lab, env)
    proc = k26ops("baselines", "delete", NEW, "no-such-tag", env=env["env"])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "no-such-tag" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert untouched(lab, env) == before
    assert NEW in git(env["repo"], "tag", "--list").split()


def test_check_changes_nothing(lab, env):
    r2 = env["r2"]
    before = untouched(lab, env)
    proc = k26ops("baselines", "delete", "--check", "--diff", NEW, env=env["env"])
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert f"would delete tag(s) {NEW}" in proc.stdout
    assert f"would change: unpin {r2}" in proc.stdout and f"\n-{r2}\n" in proc.stdout  # the pins diff
    assert untouched(lab, env) == before
    rc, data = k26ops_json("baselines", "delete", "--check", NEW, env=env["env"])
    assert rc == 0 and data["check"] and data["hosts"][HOST]["unpinned"] == [r2], data
    rc, data = k26ops_json("--limit", HOST, "baselines", "repin", "--check", env=env["env"])
    assert rc == 0 and data["hosts"][HOST]["status"] == "ok", data  # pins already match the tags
    assert untouched(lab, env) == before


def test_a_release_another_tag_records_stays_pinned(lab, env):
    r2 = env["r2"]
    rc, data = k26ops_json("--limit", HOST, "snapshot", "--tag", AGAIN, env=env["env"])
    assert rc == 0 and data["hosts"][HOST]["release"] == r2, data
    rc, data = k26ops_json("baselines", "delete", NEW, env=env["env"])
    assert rc == 0, data
    h = data["hosts"][HOST]
    assert h["status"] == "ok" and h["unpinned"] == [] and r2 in h["pins"], h
    assert r2 in pins(lab)
    left = git(env["repo"], "tag", "--list").split()
    assert NEW not in left and AGAIN in left


def test_unreachable_host_keeps_the_deletion_and_repin_fixes_it(lab, env):
    r2 = env["r2"]
    rc, data = k26ops_json("--limit", HOST, "snapshot", "--tag", LAST, env=env["env"])
    assert rc == 0 and data["hosts"][HOST]["release"] == r2, data
    tags = git(env["repo"], "tag", "--list").split()  # delete them all: r2 is needed by none
    with socket.socket() as s:  # a loopback port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    inv = yaml.safe_load(env["base"].read_text())
    inv["hosts"][HOST]["port"] = closed
    dead = env["dir"] / "dead-inventory.yml"
    dead.write_text(yaml.safe_dump(inv))
    cur = current(lab)
    proc = k26ops("--json", "-i", str(dead), "--connect-timeout", "3", "baselines", "delete", *tags, env=env["env"])
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    data = json.loads(proc.stdout)
    assert list(data["hosts"]) == [HOST] and data["hosts"][HOST]["status"] == "unreachable", data
    assert HOST in data["stale_pins"] and "Traceback" not in proc.stderr
    assert f"{HOST}: pins not rewritten" in proc.stderr
    assert (
        f"k26ops baselines repin --limit {HOST}" in proc.stderr and "do not run `baselines delete` again" in proc.stderr
    )
    assert git(env["repo"], "tag", "--list").split() == []  # the deletion stands (control-node state)
    assert r2 in pins(lab)  # stale: the host was not reached
    proc = k26ops("--limit", HOST, "baselines", "repin", env=env["env"])
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert f"unpin {r2}" in proc.stdout and "next deploy's prune" in proc.stdout
    assert r2 not in pins(lab)
    lab.ssh(HOST, f"test -f {RELEASES}/{r2}/manifest.json")
    assert current(lab) == cur
    rc, data = k26ops_json("--limit", HOST, "baselines", "repin", env=env["env"])
    assert rc == 0 and data["hosts"][HOST]["status"] == "ok" and data["hosts"][HOST]["pins"] == [], data
