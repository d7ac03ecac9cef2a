"""A custom `k26ops_root` is honoured end to end, on a real lab host: the
toolchain fact looks where the toolchain step installs, the disk check
measures the releases root under it, releases, the lab stand-in, the host
lock and the pinned releases (written under that lock) live there, and nothing
is made under the default /opt/k26ops."""

from __future__ import annotations

import yaml

from k26ops.host import preflight
from labtools.invoke import k26ops_json, lab_ssh
from labtools.labs import private_lab

ROOT = "/srv/k26-custom-root"


def test_a_custom_root_is_used_everywhere_and_a_second_deploy_is_converged():
    with private_lab(1, "root") as lab:
        inv = yaml.safe_load(lab.inventory.read_text())
        inv["vars"]["k26ops_root"] = ROOT
        path = lab.dir / "custom-root.yml"
        path.write_text(yaml.safe_dump(inv, sort_keys=False))
        env = {**lab.env(), "K26OPS_INVENTORY": str(path)}
        host = lab.hosts[0].name

        rc, first = k26ops_json("deploy", env=env)
        assert rc == 0, first
        assert first["hosts"][host]["status"] == "changed"

        rc, again = k26ops_json("deploy", env=env)
        assert rc == 0, again
        steps = {s["step"]: s for s in again["hosts"][host]["steps"]}
        # the toolchain the first deploy installed under the custom root is found
        assert steps["cuda_toolkit"]["changed"] is False, steps["cuda_toolkit"]
        assert again["hosts"][host]["status"] == "ok"

        rc, check = k26ops_json("check", env=env)
        checks = {c["check"]: c for c in check["hosts"][host]["checks"]}
        assert checks["disk_releases"]["detail"].startswith(f"{ROOT}/releases:"), checks["disk_releases"]

        rc, facts = k26ops_json("facts", env=env)
        nvcc = facts["hosts"][host]["facts"]["cuda_toolkit"]
        assert nvcc and any(i["path"].startswith(f"{ROOT}/toolchain/") for i in nvcc["installs"]), nvcc

        ssh = lambda c: lab_ssh(lab.dir, lab.port(host), c).stdout  # noqa: E731
        release = ssh(f"readlink {ROOT}/releases/current").strip()
        assert release.startswith("sglang-")
        assert ssh(f"cat {ROOT}/releases/{release}/manifest.json").strip()
        assert f"{ROOT}/releases/current/venv/bin/python" in ssh("systemctl cat k26-engine.service")
        assert "cuda-13.0" in ssh(f"ls {ROOT}/toolchain")
        assert ssh(f"ls {ROOT}/lab/k26ops_lab_engine.py").strip()  # the lab stand-in too
        # the host lock is taken in <root>/state (its owner file gone after a clean release)
        assert ssh(
            f"test -f {ROOT}/state/lock && echo lock; ls {ROOT}/state/lock.owner 2>&1 >/dev/null | wc -l"
        ).split() == ["lock", "1"]

        # A run holding <root>/state/lock keeps deploy and snapshot's pin away.
        ssh(f"systemd-run --unit=k26-hold-lock flock {ROOT}/state/lock sleep 300")
        try:
            rc, held = k26ops_json("deploy", env=env)
            assert rc != 0 and "locked by another k26ops run" in held["hosts"][host]["error"], held
            env["K26OPS_BASELINES"] = str(lab.dir / "baselines")
            rc, snap = k26ops_json("snapshot", "--tag", "while-locked", env=env)
            assert rc == 1 and "locked by another k26ops run" in snap["pin_errors"][host], snap
            assert ssh(f"cat {ROOT}/state/pinned-releases 2>/dev/null || true") == ""
        finally:
            ssh("systemctl stop k26-hold-lock")
        # ... and once it is free, the snapshot pins the release under the custom root
        rc, snap = k26ops_json("snapshot", "--tag", "unlocked", env=env)
        assert rc == 0 and snap["hosts"][host]["pinned"], snap
        assert ssh(f"cat {ROOT}/state/pinned-releases").split() == [release]

        # nothing of k26ops' own under the default root (the lab's stand-in module aside)
        assert ssh("ls -A /opt/k26ops 2>/dev/null | grep -vx lab || true").strip() == ""
        assert ssh("ls -A /opt/k26ops 2>/dev/null || true").strip() == ""


def test_preflight_layout_follows_the_root():
    e = preflight.expectations({"k26ops_root": "/data/k26"})
    assert e["releases_root"] == "/data/k26/releases"
    assert preflight.expectations({"k26ops_root": "/data/k26", "releases_root": "/x"})["releases_root"] == "/x"
    names = {f.name: f.command for f in preflight.host_facts({"k26ops_root": "/data/k26"})}
    assert "/data/k26/toolchain/cuda-*/bin/nvcc" in names["cuda_toolkit"]
    assert "/data/k26/releases" in names["disk_free"]
