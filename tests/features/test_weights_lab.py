"""`k26ops model sync|verify`, `check` and `deploy` against the recipe's model manifest on
real lab hosts (issue 44): rsync between the hosts over their real sshd, a sync cut with
Ctrl-C and run again, one byte changed, one shard truncated.

One private 3-host lab for the module; the tests run in order on it. The hosts' model
is synced to /srv/k26/model (writable; the lab's own /models/Kimi-K2.6 is the fixture,
bound read-only, and is the origin here: `lab1:/models/Kimi-K2.6`, a path on a host)."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from k26ops.lab import model_fixture
from k26ops.weights import manifest as mf
from labtools import REPO
from labtools.invoke import k26ops, k26ops_json
from labtools.labs import private_lab

MODEL = "/srv/k26/model"
ORIGIN = "lab1:/models/Kimi-K2.6"
SHARD2, SHARD3 = model_fixture.FILES[3], model_fixture.FILES[4]
M = mf.load(REPO / "playbooks/recipes/lab.model")


@pytest.fixture(scope="module")
def lab():
    with private_lab(3, "weights") as running:
        yield running


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    data = yaml.safe_load(lab.inventory.read_text())
    data["vars"]["model_path"] = MODEL
    p = tmp_path_factory.mktemp("weights") / "inventory.yml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(p)


def verified(lab, host: str, model: str = MODEL) -> set[str]:
    """The shards the host's record vouches for (its sha256 checked)."""
    rec = mf.record_path("/opt/k26ops/state", model)
    text = lab.ssh(host, f"cat {rec} 2>/dev/null || true")
    return {p for p, r in (json.loads(text)["files"] if text.strip() else {}).items() if r.get("sha256")}


def test_a_sync_cut_with_ctrl_c_then_run_again_fetches_only_what_was_not_verified(lab, inv):
    cmd = [sys.executable, "-m", "k26ops", "-i", inv, "model", "sync", "--origin", ORIGIN, "--bwlimit", "4"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(len([p for p in verified(lab, h) if p.endswith(".safetensors")]) for h in ("lab1", "lab2", "lab3")) >= 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    before = {h: verified(lab, h) for h in ("lab1", "lab2", "lab3")}
    assert 2 <= sum(len(v) for v in before.values()) < 15, before
    for h in ("lab1", "lab2", "lab3"):  # this run's keys are gone from every host, the cut left its partial files
        assert "k26ops-model-sync" not in lab.ssh(h, "cat /root/.ssh/authorized_keys"), h
        assert lab.ssh(h, "ls /opt/k26ops/state/model-sync 2>/dev/null | wc -l").strip() == "0"
    partial = lab.ssh("lab1", f"ls {MODEL}/.k26ops-partial; ls {MODEL}")
    assert "safetensors" in partial
    rc, doc = k26ops_json("-i", inv, "model", "sync", "--origin", ORIGIN, timeout=600)
    assert rc == 0, doc
    for h, have in before.items():
        row = doc["hosts"][h]
        assert row["have"] == len(have) and row["fetched"] == 5 - len(have), (h, row, have)
        assert verified(lab, h) == {e.path for e in M.entries}
    assert doc["bytes_through_control_node"] == 0
    assert doc["bytes_from_origin"] <= M.total  # each byte from the origin at most once, the rest host to host
    rc, doc = k26ops_json("-i", inv, "model", "sync", "--origin", ORIGIN, timeout=600)
    assert rc == 0 and all(r["fetched"] == 0 for r in doc["hosts"].values()) and doc["bytes_from_origin"] == 0


def test_one_byte_changed_is_named_by_verify_full_and_check_refuses_it(lab, inv):
    rc, doc = k26ops_json("-i", inv, "model", "verify", "--full", timeout=300)
    assert rc == 0 and all(r["hashed"] == 0 for r in doc["hosts"].values()), doc  # the sync's record vouches
    lab.ssh("lab2", f"printf 'Z' | dd of={MODEL}/{SHARD2} bs=1 seek=4096 conv=notrunc status=none")
    rc, doc = k26ops_json("-i", inv, "model", "verify", timeout=300)  # fast: sizes agree; the record says it changed
    assert rc == 0 and doc["hosts"]["lab2"]["changed_files"] == 1 and doc["hosts"]["lab1"]["changed_files"] == 0
    rc, doc = k26ops_json("-i", inv, "check", timeout=300)
    err = doc["hosts"]["lab2"]["error"]
    assert rc == 1 and f"weights: {MODEL}: {SHARD2} changed since its last sha256 check" in err, doc
    assert doc["hosts"]["lab1"]["status"] != "failed" or "weights" not in (doc["hosts"]["lab1"]["error"] or "")
    rc, doc = k26ops_json("-i", inv, "--limit", "lab2", "deploy", timeout=600)  # the deploy's preflight too
    err = doc["hosts"]["lab2"]["error"]
    assert (
        rc == 1
        and err.startswith(f"preflight: weights: {MODEL}: {SHARD2} changed since its last sha256 check")
        and err.endswith("; nothing was changed")
    ), doc
    rc, doc = k26ops_json("-i", inv, "model", "verify", "--full", timeout=300)
    err = doc["hosts"]["lab2"]["error"]
    assert rc == 1 and err.startswith(f"{MODEL}: {SHARD2}: sha256 ") and M.by_path()[SHARD2].sha256 in err, doc
    assert doc["hosts"]["lab1"]["status"] == "ok" and doc["hosts"]["lab1"]["hashed"] == 0


def test_a_truncated_shard_is_refused_by_check_and_deploy_before_any_change(lab, inv):
    size = M.by_path()[SHARD3].size
    lab.ssh("lab3", f"truncate -s 1000000 {MODEL}/{SHARD3}")
    line = f"weights: {MODEL}: {SHARD3} is truncated: expected {size} bytes, found 1000000"
    rc, doc = k26ops_json("-i", inv, "--limit", "lab3", "check", timeout=300)
    assert rc == 1 and line in doc["hosts"]["lab3"]["error"] and "\n" not in doc["hosts"]["lab3"]["error"], doc
    # what a deploy would change: releases, units, the model; the deploy takes the host lock and
    # marks k26ops_root its own (.k26ops-owned) before its preflight, as every deploy does
    state = (
        "ls -a /opt/k26ops /etc/systemd/system 2>&1 | grep -v '^.k26ops-owned$'; "
        f"cat /root/.ssh/authorized_keys; ls -l --time-style=+%s {MODEL}"
    )
    before = lab.ssh("lab3", state)
    rc, doc = k26ops_json("-i", inv, "--limit", "lab3", "deploy", timeout=600)
    assert rc == 1 and doc["hosts"]["lab3"]["error"] == f"preflight: {line}; nothing was changed", doc
    assert lab.ssh("lab3", state) == before


def test_sync_repairs_what_it_wrote_and_never_replaces_a_file_it_did_not_write(lab, inv, tmp_path):
    rc, doc = k26ops_json("-i", inv, "model", "sync", "--origin", ORIGIN, timeout=600)
    assert rc == 0, doc
    assert doc["hosts"]["lab2"]["fetched"] == 1 and doc["hosts"]["lab3"]["fetched"] == 1  # the changed, the truncated
    assert doc["hosts"]["lab1"]["fetched"] == 0
    rc, doc = k26ops_json("-i", inv, "model", "verify", "--full", "--force", timeout=300)
    assert rc == 0 and all(r["hashed"] == 5 for r in doc["hosts"].values()), doc
    # a copy someone put there by hand, with a wrong config.json: refused, untouched
    other = "/srv/k26/other"
    lab.ssh("lab2", f"mkdir -p {other} && echo '{{}}' > {other}/config.json")
    data = yaml.safe_load(open(inv).read())
    data["vars"]["model_path"] = other
    inv2 = tmp_path / "other.yml"
    inv2.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, doc = k26ops_json("-i", str(inv2), "--limit", "lab2", "model", "sync", "--origin", ORIGIN, timeout=600)
    err = doc["hosts"]["lab2"]["error"]
    assert (
        rc == 1
        and err.startswith(f"{other}/config.json (3 bytes) is not the manifest's")
        and "k26ops did not write it" in err
    ), doc
    assert lab.ssh("lab2", f"cat {other}/config.json; ls {other}").split() == ["{}", "config.json"]


def test_the_release_and_the_baseline_record_the_model_manifest(lab, inv, tmp_path):
    rc, doc = k26ops_json("-i", inv, "--limit", "lab1", "deploy", timeout=900)
    assert rc == 0, doc
    rel = json.loads(lab.ssh("lab1", "cat /opt/k26ops/releases/current/manifest.json"))
    assert rel["model"] == {"name": "lab-random-f16", "manifest_sha256": M.sha256, "files": 5, "bytes": M.total}, rel
    env = {"K26OPS_BASELINES": str(tmp_path / "baselines")}
    rc, doc = k26ops_json("-i", inv, "--limit", "lab1", "snapshot", "--tag", "weights-known-good", env=env, timeout=300)
    assert rc == 0, doc
    base = tmp_path / "baselines" / "hosts" / "lab1"
    rec = json.loads((base / "baseline.json").read_text())
    assert rec["model"]["manifest_sha256"] == M.sha256 == rec["model"]["release_manifest_sha256"], rec["model"]
    assert mf.load(base / "model.manifest").sha256 == M.sha256
    # status and check show the manifest and the last full verify (the repair test's verify --full --force)
    rc, doc = k26ops_json("-i", inv, "--limit", "lab1", "status", timeout=300)
    w = doc["hosts"]["lab1"]["weights"]
    assert w["release_manifest"] == M.sha256 and w["last_full"]["manifest"] == M.sha256, w
    assert doc["hosts"]["lab1"]["weights_short"] == f"{M.sha256[:8]} full {w['last_full']['at']}"
    rc, doc = k26ops_json("-i", inv, "--limit", "lab1", "check", timeout=300)
    detail = {c["check"]: c["detail"] for c in doc["hosts"]["lab1"]["checks"]}["weights"]
    assert detail.startswith(
        f"{MODEL}: 5 files, 0.1 GB as manifest {M.sha256[:12]} (lab-random-f16); "
        f"last full verify {w['last_full']['at']}, 5 of 5 files unchanged since"
    ), detail


class OriginHandler(http.server.BaseHTTPRequestHandler):
    """Test stand-in for an HTTP(S) mirror and for the Hub's download URLs (the Hub cannot be
    reached here): the lab model's files at /mirror/PATH and /ORG/REPO/resolve/REV/PATH, with
    `Range: bytes=N-` (what curl -C - sends to resume); it records each request's path and headers."""

    seen: list = []

    def do_GET(self):
        parts = self.path.split("/")
        rel = "/".join(parts[2:]) if parts[1] == "mirror" else "/".join(parts[5:])
        OriginHandler.seen.append((self.path, dict(self.headers)))
        f = model_fixture.cache_dir() / rel
        if not f.is_file():
            self.send_error(404)
            return
        data = f.read_bytes()
        start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *a):
        pass


@pytest.fixture
def origin_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OriginHandler)  # the lab hosts share loopback
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    OriginHandler.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _inv_at(inv: str, tmp_path, model: str) -> str:
    data = yaml.safe_load(open(inv).read())
    data["vars"]["model_path"] = model
    p = tmp_path / (model.strip("/").replace("/", "-") + ".yml")
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(p)


def test_an_http_mirror_origin_resumes_a_cut_download_with_curl(lab, inv, tmp_path, origin_server):
    model, shard = "/srv/k26/http", model_fixture.FILES[2]
    half = M.by_path()[shard].size // 2
    lab.ssh(
        "lab3",
        f"mkdir -p {model}/.k26ops-partial && head -c {half} /models/Kimi-K2.6/{shard}"
        f" > {model}/.k26ops-partial/{shard}",
    )
    rc, doc = k26ops_json(
        "-i",
        _inv_at(inv, tmp_path, model),
        "--limit",
        "lab3",
        "model",
        "sync",
        "--origin",
        origin_server + "/mirror/",
        timeout=300,
    )
    assert rc == 0 and doc["hosts"]["lab3"]["fetched"] == 5, doc
    assert doc["bytes_from_origin"] == M.total - half, doc  # the cut half was not fetched again
    ranges = {p.rsplit("/", 1)[-1]: h.get("Range") for p, h in OriginHandler.seen}
    assert ranges[shard] == f"bytes={half}-" and ranges[model_fixture.FILES[3]] is None, ranges
    assert verified(lab, "lab3", model) == {e.path for e in M.entries}


def test_the_hub_origin_asks_for_the_pinned_revision_with_the_token_never_in_output(lab, inv, tmp_path, origin_server):
    model, rev, token = "/srv/k26/hub", "0123456789abcdef0123456789abcdef01234567", "hf_k26opsTestToken0123"
    proc = k26ops(
        "--json",
        "-i",
        _inv_at(inv, tmp_path, model),
        "--limit",
        "lab3",
        "model",
        "sync",
        "--origin",
        f"hf://moonshotai/Kimi-K2.6@{rev}",
        timeout=300,
        env={"HF_ENDPOINT": origin_server, "HF_TOKEN": token},
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["hosts"]["lab3"]["fetched"] == 5, (proc.stdout, proc.stderr)
    assert sorted(p for p, _h in OriginHandler.seen) == sorted(
        f"/moonshotai/Kimi-K2.6/resolve/{rev}/{e.path}" for e in M.entries
    )
    assert {h.get("Authorization") for _p, h in OriginHandler.seen} == {f"Bearer {token}"}
    assert token not in proc.stdout + proc.stderr
    assert lab.ssh("lab3", f"grep -rl {token} /opt/k26ops /root {model} 2>/dev/null || true").strip() == ""


def test_a_host_short_of_disk_space_is_refused_before_any_byte_moves(lab, inv, tmp_path):
    model = "/srv/small/model"
    lab.ssh("lab2", "mkdir -p /srv/small && mount -t tmpfs -o size=30m tmpfs /srv/small")  # 30 MB for 63 MB
    try:
        rc, doc = k26ops_json(
            "-i", _inv_at(inv, tmp_path, model), "--limit", "lab2", "model", "sync", "--origin", ORIGIN, timeout=300
        )
        err = doc["hosts"]["lab2"]["error"]
        assert (
            rc == 1
            and err.startswith(f"{model}: 0.0 GB free, the 5 missing file(s) need 0.1 GB")
            and err.endswith("nothing fetched")
        ), doc
        assert doc["bytes_from_origin"] == 0 and doc.get("bytes_between_hosts") == 0
        assert lab.ssh("lab2", f"find {model} -type f | wc -l").strip() == "0"
        assert "k26ops-model-sync" not in lab.ssh("lab1", "cat /root/.ssh/authorized_keys")
    finally:
        lab.ssh("lab2", "umount /srv/small")


def test_the_manifest_made_from_a_copy_on_a_host_is_the_committed_one(inv, tmp_path):
    out = tmp_path / "from-host.model"
    rc, doc = k26ops_json("-i", inv, "model", "manifest", "lab1:/models/Kimi-K2.6", "-o", str(out), timeout=300)
    assert rc == 0 and doc["sha256"] == M.sha256 and doc["files"] == 5, doc
    assert mf.load(out).entries == M.entries and mf.load(out).source == "host:lab1:/models/Kimi-K2.6"
    proc = k26ops("-i", inv, "model", "manifest", "lab1:/models/nope", timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == "k26ops: error: lab1: /models/nope is not a directory", (
        proc.stderr
    )
