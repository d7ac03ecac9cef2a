"""Baselines on the real lab: deploy, `snapshot --tag k26-baseline-working`,
change the engine (another patch) and deploy, `rollback --tag` back (switch
path, then the rebuild path after the release directory was deleted), drift in
`k26ops status`, refusals that write nothing, the user's uncommitted work in
the baselines repository kept, and no secret value anywhere in the repository.

Works on lab1 of the shared lab only, with an engine port of its own; at the
end the engine unit, env file and pins are removed again (releases stay: the
other lab tests tolerate them).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from k26ops.steps.warmstart import MILESTONES
from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.ports import free_port_block
from labtools.recipes import recipe_with_extra_patch

TAG = "k26-baseline-working"
TOKEN = "hf_BASELINESECRET_0a1b2c3d4e5f"
HOST = "lab1"
UNIT = "/etc/systemd/system/k26-engine.service"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def host_state(lab) -> dict:
    """What rollback must restore: release, its patched files' hashes, unit text."""
    cur = lab.ssh(HOST, "readlink /opt/k26ops/releases/current").strip()
    m = json.loads(lab.ssh(HOST, "cat /opt/k26ops/releases/current/manifest.json"))
    files = " ".join(f"{m['site_packages']}/{p}" for p in sorted(m["patched_files"]))
    hashes = {
        line.split()[1][len(m["site_packages"]) + 1 :]: line.split()[0]
        for line in lab.ssh(HOST, f"sha256sum {files}").splitlines()
    }
    return {"release": cur, "hashes": hashes, "unit": lab.ssh(HOST, f"cat {UNIT}")}


def refs(repo: Path) -> str:
    return git(repo, "for-each-ref") + git(repo, "rev-parse", "HEAD") + git(repo, "status", "--porcelain")


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    """Inventories (base, changed engine) with an HF token, and a baselines dir."""
    d = tmp_path_factory.mktemp("baselines")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"]["hf_token"] = TOKEN
    inv["hosts"][HOST]["vars"]["engine_port"] = free_port_block(1, start=36000, stop=40000)
    base = d / "inventory.yml"
    base.write_text(yaml.safe_dump(inv))
    # the changed engine: the lab recipe plus one more patch
    recipe_with_extra_patch(d, "baseline-test")
    inv["vars"]["recipe"] = str(d / "changed.yml")
    changed = d / "changed-inventory.yml"
    changed.write_text(yaml.safe_dump(inv))
    e = {**lab.env(), "K26OPS_INVENTORY": str(base), "K26OPS_BASELINES": str(d / "baselines")}
    yield {"env": e, "base": base, "changed": changed, "repo": d / "baselines"}
    # lab1 as the lab left it: no engine unit, no pins (releases are tolerated by the other tests)
    lab_ssh(
        lab.dir,
        lab.port(HOST),
        "systemctl disable --now k26-engine.service; rm -f "
        + UNIT
        + " /etc/k26ops/sglang.env /opt/k26ops/state/pinned-releases; systemctl daemon-reload",
    )


def deploy(env, inventory) -> dict:
    rc, data = k26ops_json("-i", str(inventory), "--limit", HOST, "deploy", env=env["env"])
    assert rc == 0, data
    return data["hosts"][HOST]


def status(env, code: int = 0) -> dict:
    rc, data = k26ops_json("--limit", HOST, "status", env=env["env"])
    assert rc == code, data
    return data["hosts"][HOST]


def test_snapshot_records_the_running_engine(lab, env):
    deploy(env, env["base"])
    before = host_state(lab)
    t0 = time.monotonic()
    rc, data = k26ops_json(
        "--limit", HOST, "snapshot", "--tag", TAG, "-m", "stand-in healthy, before the probe", env=env["env"]
    )
    took = time.monotonic() - t0
    assert rc == 0, data
    print(f"\nsnapshot of 1 host: {took:.1f}s (command), {data['elapsed_s']}s inside")
    h = data["hosts"][HOST]
    assert h["release"] == before["release"] and h["health"] == "healthy" and h["pinned"]
    assert h["accept"] is not None and h["files"] == len(before["hashes"]) >= 1
    assert h["commands"] <= 4, h["commands"]  # gather + smoke (the deploy's agent) + pin (+ the lock-free connect)
    repo = env["repo"]
    shown = git(repo, "show", TAG)
    assert f"tag {TAG}" in shown and "stand-in healthy" in shown and "all healthy" in shown
    assert before["release"] in shown and "accept" in shown
    rec = json.loads(git(repo, "show", f"{TAG}:hosts/{HOST}/baseline.json"))
    assert rec["patched_files"] == before["hashes"] and rec["rebuildable"], rec["rebuild_check"]
    # the smoke result of both requests, greedy and sampled, is part of the baseline
    assert rec["smoke"]["greedy"]["sampling"] == {"temperature": 0} and rec["smoke"]["greedy"]["ok"]
    assert rec["smoke"]["sampled"]["sampling"]["temperature"] == 0.7 and rec["smoke"]["sampled"]["ok"]
    assert rec["smoke"]["sampled"]["spec_accept_length"] > 1
    assert "T=0.7: " in shown  # the commit message's per-host line
    assert git(repo, "show", f"{TAG}:hosts/{HOST}/unit/k26-engine.service") == before["unit"]
    env_file = git(repo, "show", f"{TAG}:hosts/{HOST}/env/sglang.env")
    assert "HF_TOKEN=<redacted>" in env_file
    manifest = json.loads(git(repo, "show", f"{TAG}:hosts/{HOST}/manifest.json"))
    assert manifest["release_id"] == before["release"] and manifest["packages"]["sglang"] == "0.5.23+lab"
    # provenance: the engine's source commit, wheel and lock, and the lock itself to rebuild from
    from k26ops.release import recipe as rc

    lab_recipe = rc.load("lab")
    eng = manifest["engine"]
    assert eng["base"] == lab_recipe.base and eng["source"]["commit"] == lab_recipe.git.commit
    assert eng["lock"]["sha256"] == hashlib.sha256(lab_recipe.lock_path.read_bytes()).hexdigest()
    assert len(eng["wheel"]["sha256"]) == 64 and eng["wheel"]["name"].startswith("sglang-0.5.23+lab-")
    assert git(repo, "show", f"{TAG}:hosts/{HOST}/engine.lock") == lab_recipe.lock_path.read_text()
    assert f"lock   lab.lock  sha256 {eng['lock']['sha256']}" in shown
    for path, sha in before["hashes"].items():  # the patched sources themselves
        blob = subprocess.run(
            ["git", "-C", str(repo), "show", f"{TAG}:hosts/{HOST}/files/{path}"], capture_output=True, check=True
        ).stdout
        assert hashlib.sha256(blob).hexdigest() == sha
    facts = json.loads(git(repo, "show", f"{TAG}:hosts/{HOST}/facts.json"))
    assert facts["gpu_count"] == 8 and facts["driver"]
    assert "venv/bin/python" in git(repo, "show", f"{TAG}:hosts/{HOST}/engine-cmdline.txt")
    assert before["release"] in lab.ssh(HOST, "cat /opt/k26ops/state/pinned-releases").split()
    # status: what runs is this baseline
    assert status(env)["baseline"] == f"= {TAG}"
    # list and show
    rc, listing = k26ops_json("baselines", "list", env=env["env"])
    assert rc == 0 and listing["tags"][0]["tag"] == TAG and listing["tags"][0]["hosts"] == [HOST]
    proc = k26ops("baselines", "show", TAG, env=env["env"])
    assert proc.returncode == 0 and before["release"] in proc.stdout and "sha256" in proc.stdout


def test_no_secret_anywhere_in_the_repository(lab, env):
    repo = env["repo"]
    assert TOKEN in lab.ssh(HOST, "cat /etc/k26ops/sglang.env")  # the host has it
    everything = git(repo, "log", "-p", "--all") + git(repo, "for-each-ref", "--format=%(contents)", "refs/tags")
    objects = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch-all-objects", "--batch"], capture_output=True, check=True
    ).stdout
    assert TOKEN not in everything and TOKEN.encode() not in objects
    assert not subprocess.run(["grep", "-rqF", TOKEN, str(repo)]).returncode == 0


def test_refusals_write_nothing(lab, env):
    repo = env["repo"]
    snap = refs(repo)
    cur = host_state(lab)
    for args, why in (
        (["--tag", TAG], "already exists"),
        (["--tag", "bad..name"], "invalid tag name"),
        (["--tag", "a b"], "invalid tag name"),
        (["--tag", "-x"], "invalid tag name"),
        (["--tag", "x;rm -rf /"], "invalid tag name"),
    ):
        proc = k26ops("--limit", HOST, "snapshot", *args, env=env["env"])
        assert proc.returncode == 2 and why in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    # an unhealthy host: the engine stopped
    lab.ssh(HOST, "systemctl stop k26-engine.service")
    try:
        proc = k26ops("--limit", HOST, "snapshot", "--tag", "while-stopped", env=env["env"])
        assert proc.returncode == 2 and "--allow-unhealthy" in proc.stderr and "lab1: inactive" in proc.stderr
    finally:
        lab.ssh(HOST, "systemctl start k26-engine.service")
    # unknown tag: one line listing the known ones; the host untouched
    proc = k26ops("--limit", HOST, "rollback", "--tag", "no-such-tag", env=env["env"])
    assert proc.returncode == 2 and f"known tags: {TAG}" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert refs(repo) == snap
    after = host_state(lab)
    assert after == cur


def test_change_then_rollback_switches_back(lab, env):
    base = host_state(lab)
    r = deploy(env, env["changed"])
    assert r["release"] != base["release"]
    # issue 43: a new release started without a rehearsal is a cold start, named with its phases
    # (the stand-in's two graph kernels at start, the sampling kernels at the first sampled answer)
    assert r["warm_start"]["verdict"] == "cold start: 3 new kernels compiled (start: 2, first sampled answer: 1)"
    changed = host_state(lab)
    assert changed["hashes"] != base["hashes"]
    st = status(env)
    assert st["baseline"] != f"= {TAG}"
    rc, data = k26ops_json("--limit", HOST, "rollback", "--tag", TAG, env=env["env"])
    assert rc == 0, data
    h = data["hosts"][HOST]
    assert h["release"] == base["release"] and not h.get("release_rebuilt")
    assert h["health"]["state"] == "healthy" and h["smoke"]["ok"] and h["verified_files"] == len(base["hashes"])
    # the rollback's restart: its time to first good token, in the restored release's own engine cache
    # (filled by that release's earlier start), so warm
    assert [m["name"] for m in h["ttfgt"]["milestones"]] == list(MILESTONES) and h["ttfgt"]["stop_s"] is not None
    assert h["warm_start"]["cache_dir"].startswith(f"/opt/k26ops/engine-cache/{base['release']}/")
    assert h["warm_start"]["compiled_new"] == 0, h["warm_start"]
    assert host_state(lab) == base
    assert TOKEN in lab.ssh(HOST, "cat /etc/k26ops/sglang.env")  # the secret came from the inventory
    assert status(env)["baseline"] == f"= {TAG}"
    # again: converged, nothing changes
    rc, data = k26ops_json("--limit", HOST, "rollback", "--tag", TAG, env=env["env"])
    assert rc == 0 and not any(s["changed"] for s in data["hosts"][HOST]["steps"]), data


def test_rollback_rebuilds_a_deleted_release(lab, env):
    base = host_state(lab)
    deploy(env, env["changed"])
    lab.ssh(HOST, f"rm -rf /opt/k26ops/releases/{base['release']}")
    rc, data = k26ops_json("--limit", HOST, "rollback", "--tag", TAG, env=env["env"])
    assert rc == 0, data
    h = data["hosts"][HOST]
    assert h["release_rebuilt"] and h["release"] == base["release"]
    assert host_state(lab) == base
    assert status(env)["health"] == "healthy"


def test_status_reports_drift(lab, env):
    m = json.loads(lab.ssh(HOST, "cat /opt/k26ops/releases/current/manifest.json"))
    path = sorted(m["patched_files"])[0]
    lab.ssh(HOST, f"echo '# hand edit' >> {m['site_packages']}/{path}")
    st = status(env, code=1)  # drift is not a healthy answer (issue 42)
    assert st["baseline"].startswith("DRIFT") and path in st["baseline"], st
    # rollback repairs it (the damaged release is rebuilt in place)
    rc, data = k26ops_json("--limit", HOST, "rollback", "--tag", TAG, env=env["env"])
    assert rc == 0 and data["hosts"][HOST]["release_rebuilt"], data
    assert status(env)["baseline"] == f"= {TAG}"


def test_uncommitted_work_in_the_repository_is_kept(lab, env):
    repo = env["repo"]
    (repo / "NOTES.md").write_text("notes v1\n")
    git(repo, "add", "NOTES.md")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "notes")
    (repo / "NOTES.md").write_text("notes v2, not committed\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "scratch.txt").write_text("untracked\n")
    rc, data = k26ops_json("--limit", HOST, "snapshot", "--tag", "k26-second", env=env["env"])
    assert rc == 0, data
    assert (repo / "NOTES.md").read_text() == "notes v2, not committed\n"
    st = git(repo, "status", "--porcelain")
    assert sorted(st.splitlines()) == sorted([" M NOTES.md", "A  staged.txt", "?? scratch.txt"]), st
    assert "k26-second" in git(repo, "tag")
    # a hand edit in a file the snapshot would write: refused, named, nothing written
    f = repo / "hosts" / HOST / "health.json"
    f.write_text(f.read_text() + " ")
    snap = refs(repo)
    proc = k26ops("--limit", HOST, "snapshot", "--tag", "k26-third", env=env["env"])
    assert proc.returncode == 2 and f"hosts/{HOST}/health.json" in proc.stderr, proc.stderr
    assert refs(repo) == snap


API_KEY = "sk-lab-ROLLBACKKEY-4d2e9b"


@pytest.fixture(scope="module")
def apikey_lab(tmp_path_factory):
    """A private 1-host lab whose engine runs with --api-key (the stand-in then
    answers 401 on every path but /health*, as SGLang does)."""
    from labtools.labs import private_lab

    d = tmp_path_factory.mktemp("rbapikey")
    with private_lab(1, "rbapikey", deployed=True) as lab:
        inv = yaml.safe_load(lab.inventory.read_text())
        name = lab.hosts[0].name
        inv["vars"]["hf_token"] = TOKEN
        inv["hosts"][name]["vars"]["engine_port"] = free_port_block(1, start=36000, stop=40000)
        inv["hosts"][name]["vars"]["extra_flags"] = ["--api-key", API_KEY]
        base = d / "inventory.yml"
        base.write_text(yaml.safe_dump(inv))
        inv["vars"]["engine_env"] = {"K26OPS_TEST_MARK": "after-the-snapshot"}  # another env file: a restart
        changed = d / "changed-inventory.yml"
        changed.write_text(yaml.safe_dump(inv))
        yield {
            "lab": lab,
            "name": name,
            "port": inv["hosts"][name]["vars"]["engine_port"],
            "base": base,
            "changed": changed,
            "env": {**lab.env(), "K26OPS_BASELINES": str(d / "baselines")},
        }


def test_rollback_to_an_engine_with_an_api_key_smokes_with_the_key(apikey_lab):
    """The rollback's smoke sends the engine's --api-key as the deploy's does
    (before: rollback built its own service state without it, and its smoke got HTTP 401)."""
    t = apikey_lab
    lab, name, e = t["lab"], t["name"], t["env"]
    rc, data = k26ops_json("-i", str(t["base"]), "deploy", env=e)
    assert rc == 0 and data["hosts"][name]["smoke"]["ok"], data
    rc, data = k26ops_json("-i", str(t["base"]), "snapshot", "--tag", "with-api-key", env=e)
    assert rc == 0, data
    rc, data = k26ops_json("-i", str(t["changed"]), "deploy", env=e)
    assert rc == 0 and data["hosts"][name]["engine_restarted"], data
    rc, data = k26ops_json("-i", str(t["base"]), "rollback", "--tag", "with-api-key", env=e)
    h = data["hosts"][name]
    assert rc == 0 and h["status"] == "changed", (h.get("error"), h.get("smoke"))
    assert h["engine_restarted"] and h["health"]["state"] == "healthy", h
    assert h["smoke"]["ok"] and h["smoke"]["greedy"]["ok"] and h["smoke"]["sampled"]["ok"], h["smoke"]
    env_file = lab_ssh(lab.dir, lab.port(name), "cat /etc/k26ops/sglang.env").stdout
    assert "K26OPS_TEST_MARK" not in env_file and API_KEY not in env_file  # the baseline's
    # the key, from the inventory, in the root-only file the unit passes with --config; never in the baseline
    secrets = lab_ssh(
        lab.dir, lab.port(name), "stat -c '%a' /etc/k26ops/sglang-secrets.yaml; cat /etc/k26ops/sglang-secrets.yaml"
    ).stdout
    assert secrets.startswith("600\n") and f'api-key: "{API_KEY}"' in secrets, secrets
    repo = e["K26OPS_BASELINES"]
    found = subprocess.run(
        ["git", "-C", repo, "grep", "-l", "-F", API_KEY, "with-api-key"], capture_output=True, text=True
    )
    files = subprocess.run(
        ["git", "-C", repo, "ls-tree", "-r", "--name-only", "with-api-key"], capture_output=True, text=True, check=True
    ).stdout
    assert found.stdout == "" and "secrets" not in files and "/env/" in files, (found.stdout, files)
    # the engine really demands the key: a request without it is refused
    script = (
        "import sys, urllib.request as u\ntry: u.urlopen(u.Request(sys.argv[1], data=b'{}'))\n"
        "except Exception as e: print(getattr(e, 'code', e))"
    )
    import shlex

    probe = lab_ssh(lab.dir, lab.port(name), f"python3 -c {shlex.quote(script)} http://127.0.0.1:{t['port']}/generate")
    assert probe.stdout.strip() == "401", (probe.stdout, probe.stderr)
    assert API_KEY not in json.dumps(data)
