"""Baseline files checked on read (issue 35.5), host-free: a real git baselines
repository on the control node, written by k26ops' own commit_snapshot with
records of the shape `snapshot` writes, then one file broken in one tag.

Each command that needs the broken tag says one line naming the tag and the
file and exits 2 before any host; the other tags keep working; a gate whose
figure is missing, NaN or not finite fails closed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from k26ops.baselines import drift, rollback
from k26ops.baselines.repo import Baselines
from k26ops.baselines.validate import BaselineCorrupt
from k26ops.enginebench import figures as figs
from k26ops.enginebench.stored import stored_benches
from k26ops.errors import UserError
from labtools.invoke import cli, cli_json

RID = "sglang-0.5.23-lab-0123456789ab"


def record(host: str, tag: str) -> dict:
    """A host record of the shape k26ops.baselines.snapshot writes."""
    return {
        "host": host,
        "tag": tag,
        "taken_at": 1764600000.0,
        "release_id": RID,
        "releases_root": "/opt/k26ops/releases",
        "site_packages": "venv/lib/python3.11/site-packages",
        "unit": {
            "name": "k26-engine.service",
            "path": "/etc/systemd/system/k26-engine.service",
            "file": "unit/k26-engine.service",
            "sha256": "ab" * 32,
        },
        "env": {
            "path": "/etc/k26ops/sglang.env",
            "file": "env/sglang.env",
            "sha256_redacted": "cd" * 32,
            "secret_keys": ["HF_TOKEN"],
            "marker": "<redacted>",
        },
        "patched_files": {"sglang/version.py": "ef" * 32},
        "drift": None,
        "engine": {"source": {"git": "file:///src/sglang", "commit": "1" * 40}},
        "patches": [{"name": "0001-lab.patch"}],
        "shipped_series": ["0001-lab.patch"],
        "engine_argv": [
            "/opt/k26ops/releases/current/venv/bin/python",
            "-m",
            "sglang.launch_server",
            "--port",
            "30000",
        ],
        "cmdline": None,
        "health": "healthy",
        "smoke": {"ok": True, "latency_s": 0.2, "spec_accept_length": 3.2},
        "rebuildable": True,
        "rebuild_check": "",
        "recipe_source": "playbooks/recipes/lab.yml",
    }


def bench(tok_s: float = 200.0, accept: float = 3.2) -> dict:
    """A stored bench of the shape k26ops.enginebench.run.run_host returns."""
    stat = lambda v: {"median": v, "min": v, "max": v, "n": 1}  # noqa: E731
    return {
        "generator": "k26ops-loadgen",
        "generator_why": "",
        "elapsed_s": 3.0,
        "spec": {
            "concurrency": [1],
            "temperatures": [0.0],
            "input_len": 64,
            "output_len": 32,
            "num_prompts": 8,
            "runs": 1,
            "seed": 0,
            "generator": "auto",
        },
        "cells": [
            {
                "concurrency": 1,
                "temperature": 0.0,
                "failed_requests": 0,
                "accept_source": "server_info",
                "figures": {"tok/s": stat(tok_s), "accept": stat(accept)},
            }
        ],
    }


def take(repo: Baselines, tag: str, hosts=("lab1",), broken: dict | None = None) -> None:
    """Commit a snapshot of `hosts` as `tag`; `broken` replaces files' bytes."""
    files = {}
    for h in hosts:
        files[f"hosts/{h}/baseline.json"] = json.dumps(record(h, tag)).encode()
        files[f"hosts/{h}/bench.json"] = json.dumps(bench()).encode()
        files[f"hosts/{h}/unit/k26-engine.service"] = b"[Service]\nExecStart=/bin/true\n"
        files[f"hosts/{h}/env/sglang.env"] = b"HF_TOKEN=<redacted>\n"
        files[f"hosts/{h}/recipe.yml"] = (
            b"engine: {source: {git: 'file:///src/sglang', commit: '" + b"1" * 40 + b"'}}\n"
        )
        files[f"hosts/{h}/engine.lock"] = b"# lock\n"
        files[f"hosts/{h}/patches/0001-lab.patch"] = b""
    index = {
        "tag": tag,
        "hosts": {h: {"release_id": RID, "health": "healthy", "spec_accept_length": 3.2} for h in hosts},
    }
    files["baseline.json"] = json.dumps(index).encode()
    files.update(broken or {})
    repo.commit_snapshot(files, f"snapshot {tag}", tag, f"baseline {tag}")


@pytest.fixture
def repo(tmp_path):
    r = Baselines(tmp_path / "baselines")
    take(r, "good")
    return r


BROKEN = {
    "index-not-json": ("baseline.json", b'{"hosts": {'),
    "index-hosts-list": ("baseline.json", b'{"hosts": [1, 2]}'),
    "record-not-json": ("hosts/lab1/baseline.json", b"\x00garbage"),
    "record-no-unit": ("hosts/lab1/baseline.json", json.dumps({**record("lab1", "bad"), "unit": None}).encode()),
    "bench-nan": ("hosts/lab1/bench.json", json.dumps(bench(tok_s=math.nan)).encode()),
    "bench-infinite": ("hosts/lab1/bench.json", json.dumps(bench()).replace("200.0", "1e999").encode()),
    "bench-string": ("hosts/lab1/bench.json", json.dumps(bench()).replace("200.0", '"fast"').encode()),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_file_names_its_tag_and_file_and_the_other_tags_still_read(repo, case):
    path, data = BROKEN[case]
    take(repo, "bad", broken={path: data})
    needs = "bench" if "bench" in path else "record" if path.startswith("hosts/") else "index"
    with pytest.raises(BaselineCorrupt) as err:
        if needs == "bench":
            stored_benches(repo.path, "bad")
        else:
            info = repo.tag("bad")
            repo.host_record(info.commit, "lab1")
    line = str(err.value)
    assert "\n" not in line and "'bad'" in line and path in line, line
    # the other tag: its bench, its records and the drift index all still read
    assert stored_benches(repo.path, "good")["lab1"]["cells"]
    assert repo.host_record(repo.tag("good").commit, "lab1")["release_id"] == RID
    warned = []
    index = dict(drift.load_index(repo.path, warn=warned.append))
    assert index["good"]["lab1"]["release_id"] == RID
    if needs == "bench":  # drift reads no bench: the tag still counts
        assert "lab1" in index["bad"] and not warned
    else:  # the broken index leaves its tag out, a broken record only its host
        assert "lab1" not in index.get("bad", {}) and len(warned) == 1 and path in warned[0], warned


def test_rollback_prepares_a_good_tag_beside_a_broken_one_and_refuses_the_broken(repo, tmp_path):
    take(repo, "bad", broken={"hosts/lab1/baseline.json": b'{"release_id": 7}'})
    (tmp_path / "w1").mkdir()
    per_host = rollback.host_baselines(repo, "good", ["lab1"], tmp_path / "w1")
    assert per_host["lab1"]["record"]["release_id"] == RID
    (tmp_path / "w2").mkdir()
    with pytest.raises(BaselineCorrupt, match=r"baseline 'bad': hosts/lab1/baseline.json: `release_id`"):
        rollback.host_baselines(repo, "bad", ["lab1"], tmp_path / "w2")


def test_baselines_delete_refuses_while_a_tag_cannot_be_read(repo):
    """Its releases are unknown: unpinning on a guess could free a release it needs."""
    take(repo, "bad", broken={"baseline.json": b"[]"})
    with pytest.raises(UserError, match=r"baseline 'bad': baseline.json: expected a JSON object"):
        repo.releases_by_host(without={"good"})
    assert repo.releases_by_host(without={"bad"}) == {"lab1": [RID]}


def inventory(tmp_path: Path) -> Path:
    """One host no test connects to: every refusal below comes before any host."""
    p = tmp_path / "inv.yml"
    p.write_text("hosts:\n  lab1:\n    address: 127.0.0.1\n    port: 1\n")
    return p


@pytest.mark.parametrize(
    "args",
    [["bench", "--compare", "bad"], ["deploy", "--canary", "1", "--gate", "bad"], ["rollback", "--tag", "bad"]],
    ids=["bench-compare", "gate", "rollback"],
)
def test_cli_commands_needing_a_broken_tag_exit_2_in_one_line(repo, tmp_path, args):
    take(
        repo,
        "bad",
        broken={"hosts/lab1/bench.json": json.dumps(bench(tok_s=math.nan)).encode(), "hosts/lab1/baseline.json": b"{"},
    )
    proc = cli("-i", str(inventory(tmp_path)), *args, "--baselines", str(repo.path), timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("k26ops: error: baseline 'bad': hosts/lab1/"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "measured,stored",
    [(math.nan, 200.0), (200.0, math.nan), (math.inf, 200.0), (None, 200.0), (200.0, 0.0), ("fast", 200.0)],
)
def test_the_gate_fails_closed_on_a_figure_it_cannot_compare(measured, stored):
    cur, base = bench(), bench(tok_s=stored)
    cur["cells"][0]["figures"]["tok/s"]["median"] = measured
    v = figs.gate_verdict(cur, base, ["tok/s@c1/t0", "accept@c1/t0"], 5.0)
    assert not v["ok"], v
    assert v["failed"][0]["figure"] == "tok/s@c1/t0"
    line = figs.gate_line("lab1", v)
    assert line.startswith("gate failed on lab1: tok/s@c1/t0 ") and "median" in line, line


def test_the_gate_fails_closed_on_a_figure_measured_but_missing():
    cur = bench()
    del cur["cells"][0]["figures"]["accept"]
    v = figs.gate_verdict(cur, bench(), ["tok/s@c1/t0", "accept@c1/t0"], 5.0)
    assert not v["ok"] and v["failed"] == [{"figure": "accept@c1/t0", "why": "not measured"}]


def test_the_gate_still_passes_and_fails_on_real_numbers():
    assert figs.gate_verdict(bench(tok_s=198.0), bench(), ["tok/s@c1/t0"], 5.0)["ok"]
    slow = figs.gate_verdict(bench(tok_s=112.0), bench(), ["tok/s@c1/t0"], 5.0)  # 44% slower
    assert not slow["ok"] and slow["failed"][0]["worse_pct"] == 44.0


def test_baselines_list_shows_every_tag_and_names_the_broken_one(repo):
    take(repo, "bad", broken={"baseline.json": b'{"hosts": {"lab1": {"release_id": null}}}'})
    proc = cli("--json", "baselines", "list", "--baselines", str(repo.path), timeout=120)
    rc, doc = cli_json("baselines", "list", "--baselines", str(repo.path), timeout=120)  # the one shape
    assert rc == 0 and proc.returncode == 0, (proc.stdout, proc.stderr)
    rows = {r["tag"]: r for r in doc["tags"]}
    assert rows["good"]["hosts"] == ["lab1"] and "error" not in rows["good"]
    assert rows["bad"]["error"] == "baseline 'bad': baseline.json: host lab1: `release_id` is missing or not a string"
    assert proc.stderr.strip() == "k26ops: warning: " + rows["bad"]["error"]


def test_a_damaged_git_object_is_one_line_and_spoils_only_its_tag(repo, tmp_path):
    """A loose object of one tag overwritten (a disk fault, a bad copy): `baselines show` and
    `rollback --tag` of that tag say one line naming it (issue 42: a traceback before), the
    listing and status's index go on with the other tags."""
    take(repo, "later")
    g = repo.repo.git
    blob = g.rev_parse("later:hosts/lab1/baseline.json")
    assert blob != g.rev_parse("good:hosts/lab1/baseline.json")
    obj = repo.path / ".git" / "objects" / blob[:2] / blob[2:]
    obj.chmod(0o644)
    obj.write_bytes(b"garbage")
    for args in (["baselines", "show", "later"], ["rollback", "--tag", "later"]):
        proc = cli("-i", str(inventory(tmp_path)), *args, "--baselines", str(repo.path), timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "baseline tag later: hosts/lab1/baseline.json: a git object of" in lines[0], (
            args,
            proc.stderr,
        )
        assert f"git -C {repo.path} fsck" in lines[0]
    warned = []
    index = drift.load_index(repo.path, warn=warned.append)
    assert [t for t, _ in index] == ["later", "good"] and index[0][1] == {} and index[1][1], index
    assert len(warned) == 1 and "baseline tag later" in warned[0], warned
