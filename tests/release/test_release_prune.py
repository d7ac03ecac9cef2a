"""Prune deletes only what k26ops made: a releases_root that holds other data is
refused before anything is written, and in a k26ops-owned one, foreign entries
stay while `--check` and the report name every release prune removes (real lab
host; each new test fails on the code before this change: it deleted foreign
entries and named nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from labtools.invoke import k26ops
from labtools.recipes import recipe_with_extra_patch

HOST = "lab3"
RELEASE_ONLY = "name: r\nsteps:\n  - release: {keep: 2}\n"


def inv(lab, tmp_path: Path, name: str, **host_vars) -> Path:
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["hosts"][HOST]["vars"].update(host_vars)
    p = tmp_path / f"{name}.yml"
    p.write_text(yaml.safe_dump(doc))
    return p


def run(lab, inventory: Path, playbook: Path, *extra: str):
    proc = k26ops("-i", str(inventory), "--limit", HOST, "--json", "deploy", "--playbook", str(playbook), *extra)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else proc


def test_foreign_directory_is_refused_and_untouched(lab, tmp_path):
    pb = tmp_path / "r.yml"
    pb.write_text(RELEASE_ONLY)
    lab.ssh(
        HOST,
        "rm -rf /srv/data && mkdir -p /srv/data/Kimi-K2.6 /srv/data/other-model && "
        "echo w > /srv/data/Kimi-K2.6/model.safetensors && echo n > /srv/data/notes.txt",
    )
    before = lab.ssh(HOST, "find /srv/data | sort")
    try:
        rc, data = run(lab, inv(lab, tmp_path, "data", releases_root="/srv/data"), pb)
        assert rc == 1
        err = data["hosts"][HOST]["error"]
        assert "releases_root /srv/data holds 3 entries k26ops did not make" in err and "Kimi-K2.6" in err
        rc, data = run(lab, inv(lab, tmp_path, "root", k26ops_root="/srv/data"), pb)
        assert rc == 1 and "k26ops_root /srv/data holds 3 entries k26ops did not make" in data["hosts"][HOST]["error"]
        assert lab.ssh(HOST, "find /srv/data | sort") == before  # nothing written, nothing deleted
    finally:
        lab.ssh(HOST, "rm -rf /srv/data")


def test_prune_keeps_foreign_entries_and_says_what_it_removes(lab, tmp_path):
    pb = tmp_path / "r.yml"
    pb.write_text(RELEASE_ONLY)
    root = "/srv/k26rel"
    lab.ssh(HOST, f"rm -rf {root}")
    try:
        ids = []
        for label in ("p1", "p2", "p3"):
            recipe = recipe_with_extra_patch(tmp_path / label, label)
            i = inv(lab, tmp_path, label, releases_root=root, recipe=str(recipe))
            if label == "p2":  # the directory is k26ops's now; someone puts data in it anyway
                lab.ssh(
                    HOST,
                    f"test -f {root}/.k26ops-owned && mkdir -p {root}/models-backup && "
                    f"echo keep > {root}/models-backup/x && mkdir -p {root}/sglang-looks-like-a-release",
                )
            if label == "p3":
                rc, data = run(lab, i, pb, "--check")
                assert rc == 0, data
                changes = [c for s in data["hosts"][HOST]["steps"] for c in s["changes"]]
                assert f"prune 1 old release(s) (keep 2, k26ops releases only): {ids[0]}" in changes, changes
            rc, data = run(lab, i, pb)
            assert rc == 0, data
            ids.append(data["hosts"][HOST]["release"])
        listing = set(lab.ssh(HOST, f"ls -A {root}").split())
        assert listing == {".k26ops-owned", "current", ids[1], ids[2], "models-backup", "sglang-looks-like-a-release"}
        assert lab.ssh(HOST, f"cat {root}/models-backup/x").strip() == "keep"
        changes = [c for s in data["hosts"][HOST]["steps"] for c in s["changes"]]
        assert any(c.startswith("prune 1 old release(s)") and ids[0] in c for c in changes)
    finally:
        lab.ssh(HOST, f"rm -rf {root}")
