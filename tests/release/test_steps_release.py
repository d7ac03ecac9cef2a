"""Deploy part 1 against real lab hosts: pip CUDA 13 toolchain with a real nvcc,
the patched sglang release built in its own directory, atomic `current`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from labtools.invoke import k26ops, k26ops_json
from labtools.recipes import harmless_patch, lab_base, lab_recipe_copy, write_series

ENGINE_STEPS = "name: engine\nsteps:\n  - cuda_toolkit: {}\n  - release: {keep: 3}\n"
TREE_HASH = (
    "cd /opt/k26ops/releases/current/venv/lib/python3*/site-packages && "
    "find sglang -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
)


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


def _extra_patch_text(site: Path) -> str:
    return harmless_patch("test patch")


def test_deploy_builds_verified_release_and_converges(lab, engine_playbook):
    env = lab.env()
    rc, data = k26ops_json("--limit", "lab1,lab2", "deploy", "--playbook", str(engine_playbook), env=env)
    assert rc == 0, data
    rid = data["hosts"]["lab1"]["release"]
    from k26ops.release import recipe as rc

    lab_recipe = rc.load("lab")
    assert rid.startswith(f"sglang-{lab_recipe.git.commit[:12]}-") and data["hosts"]["lab2"]["release"] == rid
    for host in ("lab1", "lab2"):
        r = data["hosts"][host]
        assert r["status"] in ("changed", "ok")
        assert lab.ssh(host, "readlink /opt/k26ops/releases/current").strip() == rid
        manifest = json.loads(lab.ssh(host, "cat /opt/k26ops/releases/current/manifest.json").strip())
        assert manifest["release_id"] == rid
        # built from the pinned commit, its own wheel, the lock: no overlay of one code base onto another
        eng = manifest["engine"]
        assert eng["base"] == lab_recipe.base and eng["source"]["commit"] == lab_recipe.git.commit
        assert eng["source"]["built"] == "pip wheel on the control node" and "overlay" not in manifest
        assert eng["lock"]["file"] == "lab.lock" and eng["lock"]["wheels"] == 6
        wheel = eng["wheel"]["name"]
        assert lab.ssh(host, f"sha256sum /opt/k26ops/wheelhouse/{wheel}").strip().split()[0] == eng["wheel"]["sha256"]
        # the venv holds exactly the engine wheel and the locked wheels, installed with hashes
        pkgs = lab.ssh(
            host,
            "/opt/k26ops/releases/current/venv/bin/python -m pip list --format=freeze "
            "--exclude pip --exclude setuptools",
        ).strip()
        locked = {
            n.lower().replace("_", "-"): v
            for n, v, _ in __import__("k26ops.release.enginelock", fromlist=["x"]).load(lab_recipe.lock_path).entries
        }
        got = dict(line.lower().replace("_", "-").split("==") for line in pkgs.splitlines() if "==" in line)
        assert got == {**locked, "sglang": "0.5.23+lab"}, got
        reqs = lab.ssh(host, "cat /opt/k26ops/releases/current/k26ops/requirements.txt").strip().splitlines()
        assert len(reqs) == 7 and all("===" in r and "--hash=sha256:" in r for r in reqs), reqs
        # the host's patched files are exactly what the manifest records
        for rel, sha in manifest["patched_files"].items():
            got = lab.ssh(host, f"sha256sum {manifest['site_packages']}/{rel}").strip().split()[0]
            assert got == sha
        patched = lab.ssh(
            host,
            f"grep -c PATCHED_BY_LAB_SERIES {manifest['site_packages']}/sglang/srt/speculative/ddtree_lab_fixture.py",
        ).strip()
        # the lab series: its marker patch and the API-key redaction of the start-up log
        assert int(patched) == 1 and sorted(manifest["patched_files"]) == [
            "sglang/srt/entrypoints/engine.py",
            "sglang/srt/speculative/ddtree_lab_fixture.py",
        ]
        # the real nvcc 13.0 toolchain, verified for sm_120
        out = lab.ssh(
            host,
            "/opt/k26ops/toolchain/cuda-13.0/bin/nvcc --version; cat /opt/k26ops/toolchain/cuda-13.0/k26ops-verified",
        ).strip()
        assert "release 13.0" in out and "sm_120" in out
    # again: nothing to change, few remote commands, nothing rebuilt
    before = lab.ssh("lab1", "stat -c %Y /opt/k26ops/releases/current/manifest.json").strip()
    rc, data = k26ops_json("--limit", "lab1,lab2", "deploy", "--playbook", str(engine_playbook), env=env)
    assert rc == 0, data
    for host in ("lab1", "lab2"):
        r = data["hosts"][host]
        assert r["status"] == "ok"
        assert all(not s["changed"] for s in r["steps"])
        assert r["commands"] <= 2, r["commands"]  # the lock; one agent for ownership, facts, release state
    assert lab.ssh("lab1", "stat -c %Y /opt/k26ops/releases/current/manifest.json").strip() == before


def test_check_on_changed_recipe_lists_changes_and_changes_nothing(lab, engine_playbook, tmp_path):
    import sglang_release

    recipe = _recipe(tmp_path, [("extra.patch", _extra_patch_text(sglang_release.site_packages()))])
    inv = _inventory(lab, tmp_path, recipe=str(recipe))
    k26ops_json("--limit", "lab1", "deploy", "--playbook", str(engine_playbook), env=lab.env())
    current = lab.ssh("lab1", "readlink /opt/k26ops/releases/current").strip()
    listing = lab.ssh("lab1", "ls /opt/k26ops/releases").strip()
    rc, data = k26ops_json("-i", str(inv), "--limit", "lab1", "deploy", "--check", "--playbook", str(engine_playbook))
    assert rc == 0, data
    r = data["hosts"]["lab1"]
    new = r["release"]
    assert new != current
    changes = [c for s in r["steps"] for c in s["changes"]]
    assert any(c.startswith(f"build release {new}") for c in changes)
    assert f"switch current: {current} -> {new}" in changes
    assert lab.ssh("lab1", "readlink /opt/k26ops/releases/current").strip() == current
    assert lab.ssh("lab1", "ls /opt/k26ops/releases").strip() == listing


def test_patch_that_does_not_apply_changes_no_file(lab, engine_playbook, tmp_path):
    broken = (
        f"Base: {lab_base()}\nA patch whose context is not in the file.\n"
        "--- a/sglang/version.py\n+++ b/sglang/version.py\n"
        "@@ -1,2 +1,3 @@\n this line is not there\n nor this one\n+# never\n"
    )
    recipe = _recipe(tmp_path, [("broken.patch", broken)])
    inv = _inventory(lab, tmp_path, recipe=str(recipe))
    k26ops_json("--limit", "lab1", "deploy", "--playbook", str(engine_playbook), env=lab.env())
    current = lab.ssh("lab1", "readlink /opt/k26ops/releases/current").strip()
    tree = lab.ssh("lab1", TREE_HASH).strip()
    listing = lab.ssh("lab1", "ls -a /opt/k26ops/releases").strip()
    proc = k26ops("-i", str(inv), "--limit", "lab1", "--json", "deploy", "--playbook", str(engine_playbook))
    assert proc.returncode == 1
    err = json.loads(proc.stdout)["hosts"]["lab1"]["error"]
    assert "broken.patch" in err and "sglang/version.py" in err and "hunk 1" in err
    assert lab.ssh("lab1", "readlink /opt/k26ops/releases/current").strip() == current
    assert lab.ssh("lab1", TREE_HASH).strip() == tree
    assert lab.ssh("lab1", "ls -a /opt/k26ops/releases").strip() == listing


def test_wheels_are_downloaded_once_for_all_hosts(lab, engine_playbook, tmp_path):
    import sglang_release

    recipe = _recipe(
        tmp_path,
        [
            (
                "once.patch",
                _extra_patch_text(sglang_release.site_packages()).replace(
                    "k26ops test patch", "k26ops download-once test"
                ),
            )
        ],
    )
    inv = _inventory(lab, tmp_path, recipe=str(recipe))
    wh = tmp_path / "wheelhouse"
    rc, data = k26ops_json(
        "-i", str(inv), "deploy", "--playbook", str(engine_playbook), env={"K26OPS_WHEELHOUSE": str(wh)}
    )
    assert rc == 0, data
    hosts = list(data["hosts"])
    assert len(hosts) == len(lab.hosts) >= 2
    assert all(any(s["step"] == "release" and s["changed"] for s in data["hosts"][h]["steps"]) for h in hosts)
    downloads = [json.loads(line) for line in (wh / "downloads.log").read_text().splitlines()]
    sets = [tuple(d["requirements"]) for d in downloads]
    # one download per distinct wheel set (the lock's wheels once), however many hosts needed it
    from k26ops.release import enginelock
    from k26ops.release import recipe as rc

    lock = enginelock.load(rc.load("lab").lock_path)
    assert sets.count(tuple(enginelock.requirement_lines(lock.entries))) == 1
    assert len(sets) == len(set(sets))
    # and every host installed from the pushed wheels (the engine's, built once), without an index
    for h in hosts:
        listing = lab.ssh(h, "ls /opt/k26ops/wheelhouse").strip()
        assert "sglang-0.5.23+lab-py3-none-any.whl" in listing and "requests-" in listing


def test_registry_source_still_deploys_and_a_patch_for_another_base_is_refused(lab, engine_playbook, tmp_path):
    """The registry path (sglang 0.5.23 from the index, --no-deps) on the same hosts;
    then a lab-base series holding a patch written for 0.5.23: refused, nothing changed."""
    inv = _inventory(lab, tmp_path, recipe="lab-registry")
    rc, data = k26ops_json("-i", str(inv), "--limit", "lab1", "deploy", "--playbook", str(engine_playbook))
    assert rc == 0, data
    rid = data["hosts"]["lab1"]["release"]
    assert rid.startswith("sglang0.5.23-")
    manifest = json.loads(lab.ssh("lab1", f"cat /opt/k26ops/releases/{rid}/manifest.json").strip())
    assert manifest["engine"]["base"] == "sglang==0.5.23"
    # the locked set, exactly: lab-registry.lock holds the one sglang wheel `install: no-deps` installs
    from k26ops.release import enginelock
    from k26ops.release import recipe as recipe_mod

    lock = enginelock.load(recipe_mod.load("lab-registry").lock_path)
    assert manifest["engine"]["lock"] == {"file": "lab-registry.lock", "sha256": lock.sha256, "wheels": 1}
    assert [w["sha256"] for w in manifest["wheels"]] == [lock.entries[0][2]]
    assert manifest["engine"]["source"] == {"registry": "sglang==0.5.23", "install": "no-deps"}
    k26ops_json("--limit", "lab1", "deploy", "--playbook", str(engine_playbook), env=lab.env())  # back to the lab
    current = lab.ssh("lab1", "readlink /opt/k26ops/releases/current").strip()
    listing = lab.ssh("lab1", "ls -a /opt/k26ops/releases").strip()
    wrong = harmless_patch("wrong base").replace(f"Base: {lab_base()}", "Base: sglang==0.5.23")
    recipe = _recipe(tmp_path, [("wrong.patch", wrong)])
    proc = k26ops(
        "-i",
        str(_inventory(lab, tmp_path, recipe=str(recipe))),
        "--limit",
        "lab1",
        "--json",
        "deploy",
        "--playbook",
        str(engine_playbook),
    )
    assert proc.returncode == 1
    err = json.loads(proc.stdout)["hosts"]["lab1"]["error"]
    assert "patch wrong.patch is written for sglang==0.5.23, the deployed base is " + lab_base() in err
    assert "nothing was applied" in err and "\n" not in err
    assert lab.ssh("lab1", "readlink /opt/k26ops/releases/current").strip() == current
    assert lab.ssh("lab1", "ls -a /opt/k26ops/releases").strip() == listing
