"""The deployed lab layer (k26ops/lab/deployed.py): labs whose hosts boot with the
lab recipe already deployed, from a layer built once and cached by what decides
what a deploy writes. The cache logic runs on a real recipe and its real release
ids; the layer itself on real lab hosts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from k26ops.errors import UserError
from labtools.invoke import k26ops_json, lab_ssh
from labtools.recipes import LAB_RECIPE, recipe_with_extra_patch


def test_a_cached_layer_is_rebuilt_when_the_release_id_changes(tmp_path, monkeypatch):
    """Same key: the cached layer, no build. Another release (the lab recipe plus one
    patch): a new layer is built. The first one is still found for its own key."""
    from k26ops.lab import deployed
    from k26ops.release import recipe
    from k26ops.steps.release import expected_state

    monkeypatch.setenv("K26OPS_ROOTFS_CACHE", str(tmp_path / "cache" / "rootfs"))
    image = tmp_path / "debian-bookworm-test"
    built = []

    def build(dest, log):  # what the real build_layer leaves: files under dest, its META
        built.append(dest.name)
        (dest / "opt").mkdir()
        (dest / "opt" / "made").write_text(str(len(built)))
        return {"engine_port": 1}

    first = deployed.ensure(image, build, recipe_name=LAB_RECIPE)
    assert len(built) == 1 and (first / "opt" / "made").read_text() == "1"
    assert deployed.ensure(image, build, recipe_name=LAB_RECIPE) == first and len(built) == 1

    changed = recipe_with_extra_patch(tmp_path / "changed", "layer")
    old_id, new_id = (expected_state(recipe.load(r))["release_id"] for r in (LAB_RECIPE, changed))
    assert old_id != new_id
    second = deployed.ensure(image, build, recipe_name=changed)
    assert len(built) == 2 and second != first and (second / "opt" / "made").read_text() == "2"
    assert json.loads((second / deployed.META).read_text())["key"]["release_id"] == new_id
    assert deployed.ensure(image, build, recipe_name=LAB_RECIPE) == first and len(built) == 2


def test_a_half_built_layer_is_never_used_and_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    from k26ops.lab import deployed

    monkeypatch.setenv("K26OPS_ROOTFS_CACHE", str(tmp_path / "cache" / "rootfs"))
    image = tmp_path / "debian-bookworm-test"
    k = deployed.key(image, LAB_RECIPE)
    deployed.layer_dir(k).mkdir(parents=True)  # a dir of the right name, no META: a killed build's
    assert deployed.cached(k) is None

    def failing(dest, log):
        (dest / "partial").write_text("x")
        raise RuntimeError("deploy failed")

    with pytest.raises(RuntimeError, match="deploy failed"):
        deployed.ensure(image, failing, recipe_name=LAB_RECIPE)
    assert deployed.cached(k) is None
    assert not deployed.layer_dir(k).with_name(deployed.layer_dir(k).name + ".building").exists()


def test_the_unit_gets_the_hosts_own_port_and_only_that(tmp_path):
    from k26ops.lab import deployed

    layer = tmp_path / "layer"
    unit = layer / deployed.UNIT_PATH
    unit.parent.mkdir(parents=True)
    text = "[Service]\nExecStart=/opt/k26ops/releases/current/venv/bin/python -m m --port 61892\nX=61892\n"
    unit.write_text(text)
    (layer / deployed.META).write_text(json.dumps({"engine_port": 61892}))
    assert deployed.host_unit(layer, 45001) == text.replace("--port 61892", "--port 45001")
    (layer / deployed.META).write_text(json.dumps({"engine_port": 7}))
    with pytest.raises(UserError, match="remove the layer to rebuild it"):
        deployed.host_unit(layer, 45001)


def test_deployed_hosts_are_converged_serving_and_each_its_own():
    """Two hosts on the deployed layer: the engine serves on each host's own port from
    boot, a deploy changes nothing, no run's state is left, and identities differ."""
    from labtools.labs import private_lab

    with private_lab(2, "deployed", deployed=True) as lab:
        seen = {}
        for h in lab.hosts:
            out = lab_ssh(
                lab.dir,
                h.port,
                "cat /etc/machine-id; hostname; "
                "systemctl show -p ActiveState --value k26-engine.service; "
                "systemctl show -p NRestarts --value k26-engine.service; "
                "grep -o -- '--port [0-9]*' /etc/systemd/system/k26-engine.service; "
                "ls -A /opt/k26ops/state; cat /etc/ssh/k26ops/ssh_host_ed25519_key.pub",
            ).stdout.split("\n")
            seen[h.name] = out
            assert out[2:4] == ["active", "0"], out
            assert out[4] == f"--port {h.engine_port}", out
            assert not [f for f in out[5:-2] if f.startswith(("lock.owner", "service"))], out
        ids, names, keys = ({v[i] for v in seen.values()} for i in (0, 1, -2))
        assert len(ids) == len(names) == len(keys) == 2, seen
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids

        rc, data = k26ops_json("deploy", env=lab.env())
        assert rc == 0, data
        for name, h in data["hosts"].items():
            assert h["status"] == "ok" and not [c for s in h["steps"] for c in s["changes"]], (name, h)
        rc, st = k26ops_json("status", env=lab.env())
        assert rc == 0 and {h["engine_state"] for h in st["hosts"].values()} == {"serving"}, st

        # what one host writes stays its own: not on the other, not in the layer
        lab_ssh(lab.dir, lab.hosts[0].port, "touch /opt/k26ops/releases/current/k26ops-lab-written")
        assert lab_ssh(lab.dir, lab.hosts[1].port, "ls /opt/k26ops/releases/current/k26ops-lab-written").returncode != 0
        layer = json.loads((lab.dir / "lab.json").read_text())["deployed_layer"]
        assert not list(Path(layer).rglob("k26ops-lab-written"))


def test_links_into_the_layers_store_copy_no_data_up():
    """A release build hard-links the uv store's files (the layer's, ~90 MB) into its
    venv: on a deployed host that copies up metadata, not the files' data (overlayfs
    metacopy), so a host's first new release does not copy the whole store into its
    upper dir (30 s under load without it). The linked files read as the layer's."""
    from labtools.labs import private_lab

    with private_lab(1, "metacopy", deployed=True) as lab:
        h = lab.hosts[0]
        layer = Path(json.loads((lab.dir / "lab.json").read_text())["deployed_layer"])
        upper = lab.dir / "hosts" / h.name / "root" / "upper" / "opt" / "k26ops"

        out = lab_ssh(
            lab.dir,
            h.port,
            "cp -al /opt/k26ops/store /opt/k26ops/store-linked && "
            "f=$(find /opt/k26ops/store -type f -size +100k | head -n 1) && "
            'sha256sum "$f" "/opt/k26ops/store-linked${f#/opt/k26ops/store}" | cut -d\' \' -f1',
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        sums = out.stdout.split()
        assert len(sums) == 2 and sums[0] == sums[1], out.stdout
        # every file now has an entry in the host's upper dir (the link needs one); a copied
        # file holds its size in blocks there, a metacopy entry none (its data stays below)
        big = [p for p in layer.glob("opt/k26ops/store/**/*") if p.is_file() and p.lstat().st_size > 64 << 10]
        assert sum(p.lstat().st_size for p in big) > 20 << 20, len(big)
        copied = [
            p
            for p in big
            if (upper / p.relative_to(layer / "opt" / "k26ops")).lstat().st_blocks * 512 >= p.lstat().st_size // 2
        ]
        assert not copied, f"{len(copied)} of {len(big)} store files copied up, e.g. {copied[0]}"


def test_a_build_removes_old_layers_but_the_newest_and_recently_used(tmp_path, monkeypatch):
    """Every change of the sources makes a new ~600 MB layer: a build keeps the newest
    few, and any a lab booted on lately (it may still run on it)."""
    import os
    import time

    from k26ops.lab import deployed

    monkeypatch.setenv("K26OPS_ROOTFS_CACHE", str(tmp_path / "cache" / "rootfs"))
    root = deployed.cache_root()
    now = time.time()
    ages_h = {"a": 10, "b": 20, "c": 30, "d": 40, "recent": 1, "half.building": 50}
    for name, age in ages_h.items():
        (root / name).mkdir(parents=True)
        stamp = root / name / (deployed.META if "building" not in name else "x")
        stamp.write_text("{}")
        os.utime(stamp if "building" not in name else root / name, (now - age * 3600,) * 2)
    new = root / "new"
    new.mkdir()
    deployed._collect(keep=new, log=lambda m: None)
    assert sorted(p.name for p in root.iterdir()) == ["a", "new", "recent"]
