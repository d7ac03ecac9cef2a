"""Where hosts get a release's wheels (k26ops/release/wheelsource.py): from a relay
host of the batch (peer), from the package index (index), or pushed by the
control node (the default). A relay cannot change a byte: hashes decide."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import private_lab
from labtools import free_port_block, k26ops, k26ops_json, lab_ssh

ENGINE_STEPS = "name: engine\nsteps:\n  - cuda_toolkit: {}\n  - release: {keep: 3}\n"
WH = "/opt/k26ops/wheelhouse"


def _inventory(lab, path: Path, group_vars: dict, **per_host: dict) -> Path:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(group_vars)
    for host, extra in per_host.items():
        inv["hosts"][host]["vars"].update(extra)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def _sh(lab, host: str, cmd: str) -> str:
    proc = lab_ssh(lab.dir, lab.port(host), cmd, timeout=120)
    assert proc.returncode == 0, (cmd, proc.stderr)
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def peer_lab():
    d = Path(tempfile.mkdtemp(prefix="k26ops-test-peer-", dir="/var/tmp"))  # outlives each test's tmp_path
    with private_lab(3, "peer") as lab:
        (d / "engine.yml").write_text(ENGINE_STEPS)
        ports = free_port_block(3, start=36000, stop=40000)
        inv = _inventory(lab, d / "inventory.yml", {"wheel_source": "peer"},
                         **{f"lab{i + 1}": {"wheel_peer_port": ports + i} for i in range(3)})
        try:
            yield lab, inv, d / "engine.yml", ports
        finally:
            shutil.rmtree(d, ignore_errors=True)


def test_peer_relay_gets_the_wheels_once_and_the_others_fetch_them(peer_lab):
    lab, inv, playbook, ports = peer_lab
    rc, data = k26ops_json("-i", str(inv), "deploy", "--playbook", str(playbook), timeout=1500)
    assert rc == 0, data
    h = data["hosts"]
    # lab1 (first of the batch) received every wheel from the control node (some maybe
    # pushed for the others before its own step asked); the others got them all from lab1
    assert set(h["lab1"].get("wheels", {})) <= {"pushed"}
    got = [h[other]["wheels"] for other in ("lab2", "lab3")]
    assert got[0] == got[1] and set(got[0]) == {"peer"} and got[0]["peer"] >= 8, got  # toolchain + 7 release wheels
    for other in ("lab2", "lab3"):
        assert h[other]["uploaded"] < 1_000_000 < h["lab1"]["uploaded"], (h[other]["uploaded"], h["lab1"]["uploaded"])
    manifest = json.loads(_sh(lab, "lab2", "cat /opt/k26ops/releases/current/manifest.json"))
    for w in manifest["wheels"]:  # the fetched wheels are the control node's bytes
        assert _sh(lab, "lab3", f"sha256sum {WH}/{w['name']}").split()[0] == w["sha256"]
    # the relay's server is stopped with the batch: nothing listens on its port, no temp files
    assert _sh(lab, "lab1", f"ss -ltnH 'sport = :{ports}' | wc -l; ls -A {WH} | grep -c k26ops-fetch; true") \
        .split() == ["0", "0"]
    assert "relay.pid" not in _sh(lab, "lab1", f"ls -A {WH}")


def test_a_wheel_changed_on_the_relay_is_refused_by_hash(peer_lab):
    lab, inv, playbook, ports = peer_lab
    rid = _sh(lab, "lab3", "readlink /opt/k26ops/releases/current")
    engine = json.loads(_sh(lab, "lab3", "cat /opt/k26ops/releases/current/manifest.json"))["engine"]["wheel"]
    # A compromised relay: lab1 appends to the engine wheel the moment it arrives (a real systemd path unit).
    _sh(lab, "lab1", f"""rm -f {WH}/{engine['name']}
cat > /etc/systemd/system/k26test-tamper.path <<EOF
[Path]
PathExists={WH}/{engine['name']}
EOF
cat > /etc/systemd/system/k26test-tamper.service <<EOF
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo tampered >> {WH}/{engine['name']}'
EOF
systemctl daemon-reload && systemctl start k26test-tamper.path""")
    # lab3 must build the release again, so it fetches the engine wheel from the relay
    _sh(lab, "lab3", f"rm -rf /opt/k26ops/releases/{rid} {WH}/{engine['name']}")
    try:
        rc, data = k26ops_json("-i", str(inv), "--limit", "lab1,lab3", "deploy", "--playbook", str(playbook),
                               timeout=900)
    finally:
        _sh(lab, "lab1", "systemctl stop k26test-tamper.path; rm -f /etc/systemd/system/k26test-tamper.*; "
                         "systemctl daemon-reload")
    assert rc == 1, data
    assert _sh(lab, "lab1", f"sha256sum {WH}/{engine['name']}").split()[0] != engine["sha256"]  # it was tampered
    err = data["hosts"]["lab3"]["error"]
    assert data["hosts"]["lab3"]["status"] == "failed"
    assert f"wheel {engine['name']} from relay lab1" in err and "refused" in err
    assert f"expects {engine['sha256'][:16]}" in err
    # nothing of the tampered bytes stays on lab3
    assert _sh(lab, "lab3", f"ls -A {WH} | grep -c -e k26ops-fetch -e {engine['name']}; true") == "0"
    assert _sh(lab, "lab3", f"test -e /opt/k26ops/releases/{rid} && echo present || echo absent") == "absent"


def test_bad_wheel_source_values_are_one_line_before_any_host(peer_lab, tmp_path):
    lab, inv, playbook, _ = peer_lab
    for var, value, says in (("wheel_source", "torrent", "must be one of push, index, peer"),
                             ("wheel_peer_port", 80, "must be a port number 1024-65535"),
                             ("wheel_index_url", "ftp://x", "must be an http(s) URL"),
                             ("wheel_peer_address", "a b;rm", "must be an IP address or host name")):
        bad = _inventory(lab, tmp_path / f"{var}.yml", {var: value})
        proc = k26ops("-i", str(bad), "--limit", "lab2", "deploy", "--playbook", str(playbook))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and var in proc.stderr and says in proc.stderr, proc.stderr


def test_index_mode_hosts_download_the_locked_wheels_themselves(peer_lab, tmp_path):
    """The lab's hosts reach PyPI (through this machine's network and CA bundle):
    the locked wheels come from the index, only the engine wheel (built from the
    pinned commit, on no index) is pushed."""
    lab, _, playbook, _ = peer_lab
    rid = _sh(lab, "lab2", "readlink /opt/k26ops/releases/current")
    manifest = json.loads(_sh(lab, "lab2", "cat /opt/k26ops/releases/current/manifest.json"))
    _sh(lab, "lab2", f"rm -rf /opt/k26ops/releases/{rid} {WH}/*.whl")  # toolchain stays installed
    inv = _inventory(lab, tmp_path / "index.yml", {"wheel_source": "index"})
    rc, data = k26ops_json("-i", str(inv), "--limit", "lab2", "deploy", "--playbook", str(playbook), timeout=900)
    assert rc == 0, data
    r = data["hosts"]["lab2"]
    # the locked wheels but the engine's, and uv's wheel (the installer travels as the wheels do)
    assert r["wheels"] == {"index": len(manifest["wheels"]) - 1 + 1, "pushed": 1}, r
    engine = manifest["engine"]["wheel"]
    assert r["uploaded"] < engine_size(lab, engine["name"]) + 200_000
    for w in manifest["wheels"]:
        assert _sh(lab, "lab2", f"sha256sum {WH}/{w['name']}").split()[0] == w["sha256"]
    assert _sh(lab, "lab2", "readlink /opt/k26ops/releases/current") == rid


def engine_size(lab, name: str) -> int:
    return int(_sh(lab, "lab1", f"stat -c %s {WH}/{name}"))
