"""Deploy part 1 against real lab hosts: pip CUDA 13 toolchain with a real nvcc,
the patched sglang release built in its own directory, atomic `current`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from labtools import (REPO, harmless_patch, k26ops, k26ops_json, lab_base, lab_recipe_copy, lab_ssh,
                      write_series)

ENGINE_STEPS = "name: engine\nsteps:\n  - cuda_toolkit: {}\n  - release: {keep: 3}\n"
TREE_HASH = ("cd /opt/k26ops/releases/current/venv/lib/python3*/site-packages && "
             "find sglang -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum")


@pytest.fixture(scope="module")
def engine_playbook(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("pb") / "engine.yml"
    p.write_text(ENGINE_STEPS)
    return p


def _inventory(lab, tmp_path: Path, **host_vars) -> Path:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(host_vars)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _recipe(tmp_path: Path, extra_patches: list[tuple[str, str]]) -> Path:
    """The lab recipe with its own series: the shipped patches plus `extra_patches`."""
    series = tmp_path / "patches" / "series"
    series.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, text in extra_patches:
        (series.parent / name).write_text(text)
        lines.append(name)
    write_series(series, lines)
    return lab_recipe_copy(tmp_path / "recipe.yml", series)


def _remote(lab, host: str, cmd: str) -> str:
    proc = lab_ssh(lab.dir, lab.port(host), cmd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _extra_patch_text(site: Path) -> str:
    return harmless_patch("test patch")


def test_deploy_builds_verified_release_and_converges(lab, engine_playbook):
    env = lab.env()
    rc, data = k26ops_json("--limit", "lab1,lab2", "deploy", "--playbook", str(engine_playbook), env=env)
    assert rc == 0, data
    rid = data["hosts"]["lab1"]["release"]
    assert rid.startswith("sglang0.5.23-") and data["hosts"]["lab2"]["release"] == rid
    for host in ("lab1", "lab2"):
        r = data["hosts"][host]
        assert r["status"] in ("changed", "ok")
        assert _remote(lab, host, "readlink /opt/k26ops/releases/current") == rid
        manifest = json.loads(_remote(lab, host, "cat /opt/k26ops/releases/current/manifest.json"))
        assert manifest["release_id"] == rid
        assert manifest["overlay"]["ref"] == "refs/pull/29907/head"
        # the host's patched files are exactly what the manifest records
        for rel, sha in manifest["patched_files"].items():
            got = _remote(lab, host, f"sha256sum {manifest['site_packages']}/{rel}").split()[0]
            assert got == sha
        patched = _remote(lab, host, f"grep -c speculative_ddtree_budget {manifest['site_packages']}/"
                                     "sglang/srt/model_executor/model_runner.py")
        assert int(patched) >= 1
        # the real nvcc 13.0 toolchain, verified for sm_120
        out = _remote(lab, host, "/opt/k26ops/toolchain/cuda-13.0/bin/nvcc --version; "
                                 "cat /opt/k26ops/toolchain/cuda-13.0/k26ops-verified")
        assert "release 13.0" in out and "sm_120" in out
    # again: nothing to change, few remote commands, nothing rebuilt
    before = _remote(lab, "lab1", "stat -c %Y /opt/k26ops/releases/current/manifest.json")
    rc, data = k26ops_json("--limit", "lab1,lab2", "deploy", "--playbook", str(engine_playbook), env=env)
    assert rc == 0, data
    for host in ("lab1", "lab2"):
        r = data["hosts"][host]
        assert r["status"] == "ok"
        assert all(not s["changed"] for s in r["steps"])
        assert r["commands"] <= 6, r["commands"]
    assert _remote(lab, "lab1", "stat -c %Y /opt/k26ops/releases/current/manifest.json") == before


def test_check_on_changed_recipe_lists_changes_and_changes_nothing(lab, engine_playbook, tmp_path):
    import sglang_release
    recipe = _recipe(tmp_path, [("extra.patch", _extra_patch_text(sglang_release.site_packages()))])
    inv = _inventory(lab, tmp_path, recipe=str(recipe))
    k26ops_json("--limit", "lab1", "deploy", "--playbook", str(engine_playbook), env=lab.env())
    current = _remote(lab, "lab1", "readlink /opt/k26ops/releases/current")
    listing = _remote(lab, "lab1", "ls /opt/k26ops/releases")
    rc, data = k26ops_json("-i", str(inv), "--limit", "lab1", "deploy", "--check", "--playbook",
                           str(engine_playbook))
    assert rc == 0, data
    r = data["hosts"]["lab1"]
    new = r["release"]
    assert new != current
    changes = [c for s in r["steps"] for c in s["changes"]]
    assert any(c.startswith(f"build release {new}") for c in changes)
    assert f"switch current: {current} -> {new}" in changes
    assert _remote(lab, "lab1", "readlink /opt/k26ops/releases/current") == current
    assert _remote(lab, "lab1", "ls /opt/k26ops/releases") == listing


def test_patch_that_does_not_apply_changes_no_file(lab, engine_playbook, tmp_path):
    broken = (f"Base: {lab_base()}\nA patch whose context is not in the file.\n"
              "--- a/sglang/version.py\n+++ b/sglang/version.py\n"
              "@@ -1,2 +1,3 @@\n this line is not there\n nor this one\n+# never\n")
    recipe = _recipe(tmp_path, [("broken.patch", broken)])
    inv = _inventory(lab, tmp_path, recipe=str(recipe))
    k26ops_json("--limit", "lab1", "deploy", "--playbook", str(engine_playbook), env=lab.env())
    current = _remote(lab, "lab1", "readlink /opt/k26ops/releases/current")
    tree = _remote(lab, "lab1", TREE_HASH)
    listing = _remote(lab, "lab1", "ls -a /opt/k26ops/releases")
    proc = k26ops("-i", str(inv), "--limit", "lab1", "--json", "deploy", "--playbook", str(engine_playbook))
    assert proc.returncode == 1
    err = json.loads(proc.stdout)["hosts"]["lab1"]["error"]
    assert "broken.patch" in err and "sglang/version.py" in err and "hunk 1" in err
    assert _remote(lab, "lab1", "readlink /opt/k26ops/releases/current") == current
    assert _remote(lab, "lab1", TREE_HASH) == tree
    assert _remote(lab, "lab1", "ls -a /opt/k26ops/releases") == listing


def test_wheels_are_downloaded_once_for_all_hosts(lab, engine_playbook, tmp_path):
    import sglang_release
    recipe = _recipe(tmp_path, [("once.patch", _extra_patch_text(sglang_release.site_packages())
                                 .replace("k26ops test patch", "k26ops download-once test"))])
    inv = _inventory(lab, tmp_path, recipe=str(recipe))
    wh = tmp_path / "wheelhouse"
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(engine_playbook),
                           env={"K26OPS_WHEELHOUSE": str(wh)})
    assert rc == 0, data
    hosts = list(data["hosts"])
    assert len(hosts) == len(lab.hosts) >= 2
    assert all(any(s["step"] == "release" and s["changed"] for s in data["hosts"][h]["steps"]) for h in hosts)
    downloads = [json.loads(line) for line in (wh / "downloads.log").read_text().splitlines()]
    sets = [tuple(d["requirements"]) for d in downloads]
    # one download per distinct wheel set, however many hosts needed it
    assert sets.count(("sglang==0.5.23",)) == 1
    assert len(sets) == len(set(sets))
    # and every host installed from the pushed wheel, without an index
    for h in hosts:
        assert "sglang-0.5.23-" in _remote(lab, h, "ls /opt/k26ops/wheelhouse")
