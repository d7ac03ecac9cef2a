"""Where hosts get a release's wheels (k26ops/release/wheelsource.py): from a relay
host of the batch (peer), from the package index (index), or pushed by the
control node (the default). A relay cannot change a byte: hashes decide."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.labs import private_lab
from labtools.ports import free_port_block

ENGINE_STEPS = "name: engine\nsteps:\n  - cuda_toolkit: {}\n  - release: {keep: 3}\n"
WH = "/opt/k26ops/wheelhouse"


def _inventory(lab, path: Path, group_vars: dict, **per_host: dict) -> Path:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(group_vars)
    for host, extra in per_host.items():
        inv["hosts"][host]["vars"].update(extra)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def peer_lab():
    d = Path(tempfile.mkdtemp(prefix="k26ops-test-peer-", dir="/var/tmp"))  # outlives each test's tmp_path
    with private_lab(3, "peer") as lab:
        (d / "engine.yml").write_text(ENGINE_STEPS)
        ports = free_port_block(3, start=36000, stop=40000)
        inv = _inventory(
            lab,
            d / "inventory.yml",
            {"wheel_source": "peer"},
            **{f"lab{i + 1}": {"wheel_peer_port": ports + i} for i in range(3)},
        )
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
    manifest = json.loads(lab.ssh("lab2", "cat /opt/k26ops/releases/current/manifest.json", timeout=120).strip())
    for w in manifest["wheels"]:  # the fetched wheels are the control node's bytes
        assert lab.ssh("lab3", f"sha256sum {WH}/{w['name']}", timeout=120).strip().split()[0] == w["sha256"]
    # the relay's server is stopped with the batch: nothing listens on its port, no temp files
    assert lab.ssh(
        "lab1", f"ss -ltnH 'sport = :{ports}' | wc -l; ls -A {WH} | grep -c k26ops-fetch; true", timeout=120
    ).strip().split() == ["0", "0"]
    assert "relay.pid" not in lab.ssh("lab1", f"ls -A {WH}", timeout=120).strip()


def test_a_wheel_changed_on_the_relay_is_refused_by_hash(peer_lab):
    lab, inv, playbook, ports = peer_lab
    rid = lab.ssh("lab3", "readlink /opt/k26ops/releases/current", timeout=120).strip()
    engine = json.loads(lab.ssh("lab3", "cat /opt/k26ops/releases/current/manifest.json", timeout=120).strip())[
        "engine"
    ]["wheel"]
    # A compromised relay: lab1 appends to the engine wheel the moment it arrives (a real systemd path unit).
    lab.ssh(
        "lab1",
        f"""rm -f {WH}/{engine["name"]}
cat > /etc/systemd/system/k26test-tamper.path <<EOF
[Path]
PathExists={WH}/{engine["name"]}
EOF
cat > /etc/systemd/system/k26test-tamper.service <<EOF
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo tampered >> {WH}/{engine["name"]}'
EOF
systemctl daemon-reload && systemctl start k26test-tamper.path""",
        timeout=120,
    ).strip()
    # lab3 must build the release again, so it fetches the engine wheel from the relay
    lab.ssh("lab3", f"rm -rf /opt/k26ops/releases/{rid} {WH}/{engine['name']}", timeout=120).strip()
    try:
        rc, data = k26ops_json(
            "-i", str(inv), "--limit", "lab1,lab3", "deploy", "--playbook", str(playbook), timeout=900
        )
    finally:
        lab.ssh(
            "lab1",
            "systemctl stop k26test-tamper.path; rm -f /etc/systemd/system/k26test-tamper.*; systemctl daemon-reload",
            timeout=120,
        ).strip()
    assert rc == 1, data
    assert (
        lab.ssh("lab1", f"sha256sum {WH}/{engine['name']}", timeout=120).strip().split()[0] != engine["sha256"]
    )  # it was tampered
    err = data["hosts"]["lab3"]["error"]
    assert data["hosts"]["lab3"]["status"] == "failed"
    assert f"wheel {engine['name']} from relay lab1" in err and "refused" in err
    assert f"expects {engine['sha256'][:16]}" in err
    # nothing of the tampered bytes stays on lab3
    assert (
        lab.ssh("lab3", f"ls -A {WH} | grep -c -e k26ops-fetch -e {engine['name']}; true", timeout=120).strip() == "0"
    )
    assert (
        lab.ssh("lab3", f"test -e /opt/k26ops/releases/{rid} && echo present || echo absent", timeout=120).strip()
        == "absent"
    )


def test_bad_wheel_source_values_are_one_line_before_any_host(peer_lab, tmp_path):
    lab, inv, playbook, _ = peer_lab
    for var, value, says in (
        ("wheel_source", "torrent", "must be one of push, index, peer"),
        ("wheel_peer_port", 80, "must be a port number 1024-65535"),
        ("wheel_index_url", "ftp://x", "must be an http(s) URL"),
        ("wheel_peer_address", "a b;rm", "must be an IP address or host name"),
    ):
        bad = _inventory(lab, tmp_path / f"{var}.yml", {var: value})
        proc = k26ops("-i", str(bad), "--limit", "lab2", "deploy", "--playbook", str(playbook))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and var in proc.stderr and says in proc.stderr, proc.stderr


def test_index_mode_hosts_download_the_locked_wheels_themselves(peer_lab, tmp_path):
    """The lab's hosts reach PyPI (through this machine's network and CA bundle):
    the locked wheels come from the index, only the engine wheel (built from the
    pinned commit, on no index) is pushed."""
    lab, _, playbook, _ = peer_lab
    rid = lab.ssh("lab2", "readlink /opt/k26ops/releases/current", timeout=120).strip()
    manifest = json.loads(lab.ssh("lab2", "cat /opt/k26ops/releases/current/manifest.json", timeout=120).strip())
    lab.ssh("lab2", f"rm -rf /opt/k26ops/releases/{rid} {WH}/*.whl", timeout=120).strip()  # toolchain stays installed
    inv = _inventory(lab, tmp_path / "index.yml", {"wheel_source": "index"})
    rc, data = k26ops_json("-i", str(inv), "--limit", "lab2", "deploy", "--playbook", str(playbook), timeout=900)
    assert rc == 0, data
    r = data["hosts"]["lab2"]
    # the locked wheels but the engine's, and uv's wheel (the installer travels as the wheels do)
    assert r["wheels"] == {"index": len(manifest["wheels"]) - 1 + 1, "pushed": 1}, r
    engine = manifest["engine"]["wheel"]
    assert r["uploaded"] < engine_size(lab, engine["name"]) + 200_000
    for w in manifest["wheels"]:
        assert lab.ssh("lab2", f"sha256sum {WH}/{w['name']}", timeout=120).strip().split()[0] == w["sha256"]
    assert lab.ssh("lab2", "readlink /opt/k26ops/releases/current", timeout=120).strip() == rid


def engine_size(lab, name: str) -> int:
    return int(lab.ssh("lab1", f"stat -c %s {WH}/{name}", timeout=120).strip())


# --- a relay that stalls, is refused or is locked (issue 35.6)


def _forget(lab, host: str) -> None:
    """`host` must build its release again, so it fetches every wheel from the relay."""
    rid = lab.ssh(host, "readlink /opt/k26ops/releases/current", timeout=120).strip()
    lab.ssh(host, f"rm -rf /opt/k26ops/releases/{rid} {WH}/*.whl", timeout=120).strip()


def _silent(port: int) -> socket.socket:
    """A peer on the relay's port (so the relay's own server cannot bind it) that
    accepts every connection and never answers."""
    sock = socket.create_server(("127.0.0.1", port))
    held = []

    def accept():
        while True:
            try:
                held.append(sock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return sock


def _agents(lab, host: str) -> str:
    return lab_ssh(
        lab.dir, lab.port(host), "pgrep -af 'Host agent of the wheel relay' | grep -v pgrep; true"
    ).stdout.strip()


def test_ctrl_c_during_a_stalled_relay_returns_at_once_and_leaves_no_agent_then_the_push_takes_over(peer_lab):
    lab, inv, playbook, ports = peer_lab
    _forget(lab, "lab2")
    silent = _silent(ports)  # lab1's wheel_peer_port
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "k26ops",
                "-i",
                str(inv),
                "--limit",
                "lab1,lab2",
                "deploy",
                "--playbook",
                str(playbook),
            ],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 600
            while not _agents(lab, "lab2"):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.3)
            os.kill(proc.pid, signal.SIGINT)
            t0 = time.monotonic()
            out, err = proc.communicate(timeout=120)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130 and "Traceback" not in out + err, (proc.returncode, out, err)
        assert took < 10, f"Ctrl-C took {took:.0f}s"  # the fetch waited for the stalled relay before
        time.sleep(3)  # the agent's watchdog notices the closed channel within a second
        assert _agents(lab, "lab2") == ""
        # again, to the end: the stalled relay fails within READ_TIMEOUT and lab2 gets the push
        t0 = time.monotonic()
        rc, data = k26ops_json(
            "-i", str(inv), "--limit", "lab1,lab2", "deploy", "--playbook", str(playbook), timeout=900
        )
        assert rc == 0, data
        assert set(data["hosts"]["lab2"]["wheels"]) == {"pushed"}, data["hosts"]["lab2"]
    finally:
        silent.close()
    assert _agents(lab, "lab2") == ""


def test_a_locked_or_refused_relay_receives_no_byte_and_the_others_get_the_push(peer_lab, tmp_path):
    lab, inv, playbook, ports = peer_lab
    # another run holds lab1 (the relay): its flock on the host lock
    lab.ssh("lab1", f"rm -rf {WH}", timeout=120).strip()
    pid = lab.ssh(
        "lab1", "flock /opt/k26ops/state/lock sleep 900 </dev/null >/dev/null 2>&1 & echo $!", timeout=120
    ).strip()
    _forget(lab, "lab2")
    try:
        rc, data = k26ops_json(
            "-i", str(inv), "--limit", "lab1,lab2", "deploy", "--playbook", str(playbook), timeout=900
        )
    finally:
        lab.ssh("lab1", f"kill {pid}", timeout=120).strip()
    h = data["hosts"]
    assert rc == 1 and h["lab1"]["status"] == "failed" and "locked" in h["lab1"]["error"], h["lab1"]
    assert h["lab2"]["status"] in ("ok", "changed") and set(h["lab2"]["wheels"]) == {"pushed"}, h["lab2"]
    assert h["lab1"]["uploaded"] == 0
    assert lab.ssh("lab1", f"test -e {WH} && echo present || echo absent", timeout=120).strip() == "absent"
    # a k26ops_root that is not k26ops's (it holds someone's data): refused, and nothing is written there
    lab.ssh("lab1", "mkdir -p /srv/foreign && echo mine > /srv/foreign/data", timeout=120).strip()
    refused = _inventory(
        lab,
        tmp_path / "foreign.yml",
        {"wheel_source": "peer"},
        lab1={"wheel_peer_port": ports, "k26ops_root": "/srv/foreign"},
        lab3={"wheel_peer_port": ports + 2},
    )
    _forget(lab, "lab3")
    rc, data = k26ops_json(
        "-i", str(refused), "--limit", "lab1,lab3", "deploy", "--playbook", str(playbook), timeout=900
    )
    h = data["hosts"]
    assert rc == 1 and "k26ops_root /srv/foreign holds 1 entry" in h["lab1"]["error"], h["lab1"]
    assert h["lab3"]["status"] in ("ok", "changed") and set(h["lab3"]["wheels"]) == {"pushed"}, h["lab3"]
    assert lab.ssh("lab1", "ls -A /srv/foreign", timeout=120).strip() == "data" and h["lab1"]["uploaded"] == 0


# --- what a host prints is bounded on the control node (issue 35.8)


def test_an_agent_printing_1_gb_fails_in_one_line_and_bounded_memory(peer_lab):
    """A python3 on the host that prints 1 GB before the agent's answer: the
    host fails naming itself and the agent, and the control node reads at most
    ssh.OUTPUT_LIMIT (it took 936 MB of memory for this before)."""
    lab, inv, _, _ = peer_lab
    noisy = "/usr/local/bin/k26test-noisy-python3"
    lab.ssh(
        "lab2",
        f"cat > {noisy} <<'EOF'\n#!/bin/sh\nhead -c 1000000000 /dev/zero | tr '\\0' x\n"
        f'exec python3 "$@"\nEOF\nchmod 755 {noisy}',
        timeout=120,
    ).strip()
    script = f"""
import resource
from k26ops import inventory
from k26ops.transport import agents, ssh
host = inventory.load({str(inv)!r}).select("lab2")[0]
session = ssh.connect(host)
try:
    agents.run(session, "ownership", "state", 120, interpreter={noisy!r}, dir="/opt/k26ops", kind="root",
               names=[], marker="m", release_marker="r", root_entries=[])
    print("ANSWERED")
except agents.AgentFailed as exc:
    print("FAILED", exc)
print("MAXRSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parent.parents[1],
        )
    finally:
        lab.ssh("lab2", f"rm -f {noisy}", timeout=120).strip()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0] == "FAILED ownership agent (state) on lab2 printed more than 64 MiB: stopped reading "
        "(an agent answers in one JSON line; is python3 on the host a wrapper that prints?)"
    ), lines
    rss = int(lines[1].split()[1])
    # the reading stops at 64 MiB: the peak stays far below what a whole read needs (1 GB of
    # output took 3x that before; 300 MB took 947 MB), whatever the machine's load
    assert rss < 700_000_000, f"the control node took {rss >> 20} MiB reading it"
