"""Fleet core against real lab hosts: facts, preflight, unreachable hosts, host
keys, black holes, and hostile values that must never run."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import yaml

from labtools.hostile import HOSTILE
from labtools.invoke import k26ops, k26ops_json, lab_ssh


def _inventory(
    lab, tmp_path: Path, extra_hosts: dict | None = None, host_vars: dict | None = None, repeat: int = 1
) -> Path:
    """The lab's inventory, optionally with each host listed `repeat` times and extra hosts."""
    base = yaml.safe_load(lab.inventory.read_text())
    hosts = {}
    for i in range(repeat):
        for name, spec in base["hosts"].items():
            spec = {**spec, "vars": {**spec.get("vars", {}), **(host_vars or {})}}
            hosts[name if repeat == 1 else f"{name}-{i}"] = spec
    hosts.update(extra_hosts or {})
    inv = {"vars": base["vars"], "hosts": hosts}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_facts_json_lists_8_gpus_per_host(lab):
    rc, data = k26ops_json("facts", env=lab.env())
    assert rc == 0, data
    assert set(data["hosts"]) == {h.name for h in lab.hosts}
    for name, r in data["hosts"].items():
        assert r["status"] == "ok"
        f = r["facts"]
        assert f["gpus"]["count"] == 8
        assert {g["compute_cap"] for g in f["gpus"]["gpus"]} == {"12.0"}
        assert f["gpu_topology"]["interconnect"] == "pcie"
        assert f["os_release"]["id"] == "debian"
        assert f["python3"]["version"].startswith("3.")
        assert f["systemd"]["version"] >= 250
        assert r["commands"] == 1  # every fact in one remote call


def test_check_passes_on_the_lab(lab):
    proc = k26ops("check", env=lab.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("pass") >= len(lab.hosts)


def test_check_names_what_is_wrong(lab, tmp_path):
    inv = _inventory(lab, tmp_path, host_vars={"gpus_per_host": 4, "compute_capability": "10.x"})
    rc, data = k26ops_json("-i", str(inv), "check")
    assert rc == 1
    err = data["hosts"]["lab1"]["error"]
    assert "gpus: 8 GPUs, expected 4" in err and "compute_capability: 12.0, expected 10.x" in err


def test_stopped_sshd_is_unreachable_within_connect_timeout_others_finish(scratch_lab, lab, tmp_path):
    port = scratch_lab.base_port
    assert lab_ssh(scratch_lab.dir, port, "systemctl stop ssh.service ssh.socket 2>/dev/null; true").returncode in (
        0,
        255,
    )
    base = yaml.safe_load(scratch_lab.inventory.read_text())["hosts"]["lab1"]
    inv = _inventory(lab, tmp_path, extra_hosts={"dead": base})
    t0 = time.monotonic()
    rc, data = k26ops_json("-i", str(inv), "--connect-timeout", "3", "facts")
    elapsed = time.monotonic() - t0
    assert rc == 1
    assert data["hosts"]["dead"]["status"] == "unreachable"
    assert all(data["hosts"][h.name]["status"] == "ok" for h in lab.hosts)
    assert data["hosts"]["dead"]["elapsed"] < 5
    assert elapsed < 30


def test_regenerated_host_key_is_refused_with_fingerprint(scratch_lab, tmp_path, monkeypatch):
    """A changed key is refused before anything runs: the host is up (it answers
    with its new key) and the same work with the new key known does run, so
    0 commands and no marker mean refused, not unreachable."""
    from k26ops import inventory
    from k26ops.transport.fleet import Fleet, FleetOptions, Outcome

    port = scratch_lab.base_port
    key = scratch_lab.dir / "hosts" / "lab1" / "ssh" / "ssh_host_ed25519_key"
    proc = lab_ssh(
        scratch_lab.dir,
        port,
        "rm -f /etc/ssh/k26ops/ssh_host_ed25519_key* && "
        "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/k26ops/ssh_host_ed25519_key && "
        "(systemctl restart ssh &) ",
    )
    assert proc.returncode == 0, proc.stderr
    new_pub = key.with_suffix(".pub").read_text().split()[1]
    import base64
    import hashlib

    fp = "SHA256:" + base64.b64encode(hashlib.sha256(base64.b64decode(new_pub)).digest()).decode().rstrip("=")
    new_known = tmp_path / "new_known_hosts"  # the host's real new key
    new_known.write_text(f"[127.0.0.1]:{port} ssh-ed25519 {new_pub}\n")
    time.sleep(1.0)
    monkeypatch.setenv("HOME", str(tmp_path))  # only the known_hosts files named here count
    marker = "/root/ran-after-key-change"

    def touch(session):
        session.run(f"touch {marker}", check=True)
        return Outcome(changed=True)

    def run_touch(inv_path: Path):
        fleet = Fleet(inventory.load(inv_path).select(None), FleetOptions(connect_timeout=5))
        try:
            return fleet.run(touch)[0]
        finally:
            fleet.close()

    def marker_on_host() -> bool:
        res = lab_ssh(scratch_lab.dir, port, f"test -e {marker} && echo yes || echo no", known_hosts=new_known)
        assert res.returncode == 0, res.stderr  # reachable: it answers with its new key
        return res.stdout.strip() == "yes"

    rc, data = k26ops_json("facts", env=scratch_lab.env())
    r = data["hosts"]["lab1"]
    assert rc == 1 and r["status"] == "unreachable"
    assert "CHANGED" in r["error"] and fp in r["error"] and r["commands"] == 0
    refused = run_touch(scratch_lab.inventory)
    assert refused.status == "unreachable" and "CHANGED" in refused.error and fp in refused.error
    assert refused.commands == 0
    written = scratch_lab.dir / "hosts/lab1/root/upper" / marker.lstrip("/")  # the host's own writes
    assert not marker_on_host() and not written.exists()
    # --accept-new-host-keys never accepts a changed key.
    rc, data = k26ops_json("--accept-new-host-keys", "facts", env=scratch_lab.env())
    assert rc == 1 and "CHANGED" in data["hosts"]["lab1"]["error"]
    # The same work, with the host's new key known, runs its one command.
    inv = yaml.safe_load(scratch_lab.inventory.read_text())
    inv["hosts"]["lab1"]["known_hosts"] = str(new_known)
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))
    accepted = run_touch(tmp_path / "inv.yml")
    assert accepted.status == "changed" and accepted.commands == 1, accepted
    assert marker_on_host() and written.exists()


def test_unknown_host_key_refused_unless_trust_on_first_use(lab, tmp_path):
    base = yaml.safe_load(lab.inventory.read_text())
    spec = dict(base["hosts"]["lab1"])
    spec["known_hosts"] = str(tmp_path / "empty_known_hosts")
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"hosts": {"lab1": spec}}))
    rc, data = k26ops_json("-i", str(inv), "facts", env={"HOME": str(tmp_path)})
    assert rc == 1 and "unknown host key" in data["hosts"]["lab1"]["error"]
    assert "SHA256:" in data["hosts"]["lab1"]["error"]
    rc, data = k26ops_json("-i", str(inv), "--accept-new-host-keys", "facts", env={"HOME": str(tmp_path)})
    assert rc == 0, data
    recorded = (tmp_path / "empty_known_hosts").read_text()
    assert f"[127.0.0.1]:{lab.hosts[0].port} ssh-ed25519" in recorded
    rc, data = k26ops_json("-i", str(inv), "facts", env={"HOME": str(tmp_path)})
    assert rc == 0  # now known


def _black_hole():
    """A loopback listener that accepts and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    conns = []

    def accept():
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, conns


def test_twenty_hosts_with_a_black_hole_take_about_one_deadline(lab, tmp_path):
    srv, _ = _black_hole()
    try:
        port = srv.getsockname()[1]
        inv = _inventory(
            lab,
            tmp_path,
            repeat=7,
            extra_hosts={
                "blackhole": {
                    "address": "127.0.0.1",
                    "port": port,
                    "user": "root",
                    "identity_file": str(lab.dir / "id_ed25519"),
                    "known_hosts": str(lab.dir / "known_hosts"),
                }
            },
        )
        hosts = yaml.safe_load(inv.read_text())["hosts"]
        assert len(hosts) >= 20
        t0 = time.monotonic()
        rc, data = k26ops_json("-i", str(inv), "--connect-timeout", "4", "--forks", "32", "facts")
        elapsed = time.monotonic() - t0
    finally:
        srv.close()
    assert rc == 1
    assert data["hosts"]["blackhole"]["status"] == "unreachable"
    assert any(w in data["hosts"]["blackhole"]["error"] for w in ("banner", "timed out", "handshake"))
    ok = [n for n, r in data["hosts"].items() if r["status"] == "ok"]
    assert len(ok) == len(hosts) - 1
    assert elapsed < 4 * 3, f"took {elapsed:.1f}s"  # about one deadline, not 20


def test_deadline_fails_a_slow_host_and_not_the_others(lab, tmp_path):
    """A host whose work hangs is cut at --deadline; the others finish."""
    from k26ops import inventory
    from k26ops.transport.fleet import Fleet, FleetOptions, Outcome

    inv = inventory.load(lab.inventory)
    hosts = inv.select(None)

    def work(session):
        if session.host.name == "lab1":
            session.run("sleep 30", timeout=60)
        session.run("true")
        return Outcome()

    t0 = time.monotonic()
    fleet = Fleet(hosts, FleetOptions(deadline=3))
    results = {r.host: r for r in fleet.run(work)}
    fleet.close()
    assert time.monotonic() - t0 < 10
    assert results["lab1"].status == "failed" and "deadline" in results["lab1"].error
    assert all(results[h.name].status == "ok" for h in hosts[1:])


def test_hostile_inventory_values_never_run_on_the_host(lab, tmp_path):
    """Path variables are data: a hostile one is refused at load (one line naming
    the host and variable), so nothing reaches the host."""
    for i, value in enumerate(HOSTILE):
        inv = _inventory(lab, tmp_path, host_vars={"model_path": value, "releases_root": value})
        proc = k26ops("-i", str(inv), "--limit", "lab1", "--json", "facts")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "host 'lab1': releases_root " in proc.stderr or "host 'lab1': model_path " in proc.stderr
    inv = _inventory(lab, tmp_path, host_vars={"model_path": "/srv/m-1/K2.6_b+x", "releases_root": "/srv/r@x"})
    proc = k26ops("-i", str(inv), "--limit", "lab1", "--json", "facts")
    assert proc.returncode == 0, proc.stderr
    import json

    disk = json.loads(proc.stdout)["hosts"]["lab1"]["facts"]["disk_free"]
    assert "/srv/m-1/K2.6_b+x" in disk and "/srv/r@x" in disk  # measured as the literal paths
    check = lab_ssh(lab.dir, lab.hosts[0].port, "ls /tmp/PWNED* 2>/dev/null | wc -l")
    assert check.stdout.strip() == "0"
    assert not list(Path("/tmp").glob("PWNED*"))
