"""The model weights without a host (issue 44): the manifest (format, makers, the Hub's
edges), the fast comparison, the model files fact on real `stat` output, the weights
agent run on this machine as a host runs it, and the transfer planner.
Lab tests (real sshd, rsync between hosts): tests/features/test_weights_lab.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from k26ops import shell
from k26ops.errors import UserError
from k26ops.facts.model_files import model_files_command, parse_model_files
from k26ops.inventory import Host
from k26ops.lab import model_fixture
from k26ops.transport import agents
from k26ops.transport.ssh import LocalSession
from k26ops.weights import manifest as mf
from k26ops.weights.plan import ORIGIN, WAIT, Site
from labtools import REPO
from labtools.invoke import cli, cli_json, k26ops

LAB_MANIFEST = REPO / "playbooks/recipes/lab.model"


@pytest.fixture(scope="module")
def model():
    return model_fixture.ensure()


def test_the_lab_model_is_real_safetensors_and_the_committed_manifest_is_what_the_command_makes(model, tmp_path):
    from safetensors.numpy import load_file

    for name in model_fixture.FILES[2:]:
        tensors = load_file(str(model / name))  # the real package reads every shard
        assert len(tensors) == 2 and all(t.dtype.name == "float16" and t.size == 4096 * 1280 for t in tensors.values())
        assert all(float(abs(t).max()) < 2**-6 for t in tensors.values())
    assert 20e6 < (model / model_fixture.FILES[2]).stat().st_size < 30e6  # tens of MB
    out = tmp_path / "lab.model"
    proc = cli("model", "manifest", str(model), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    made, committed = mf.load(out), mf.load(LAB_MANIFEST)
    assert made.entries == committed.entries and made.sha256 == committed.sha256  # same bytes on every machine
    rc, doc = cli_json("model", "manifest", str(model))
    assert rc == 0 and doc["sha256"] == committed.sha256 and doc["files"] == 5


@pytest.mark.parametrize(
    "text, says",
    [
        ("nonsense\n", "x.model:1: not a manifest line"),
        (f"{'a' * 64}  10  /etc/passwd\n", "x.model:1: '/etc/passwd': not a plain relative path"),
        (f"{'a' * 64}  10  ../up\n", "x.model:1: '../up': not a plain relative path"),
        (f"{'a' * 64}  10  a\n{'b' * 64}  11  a\n", "x.model:2: a is listed twice"),
        (f"{'a' * 64}  10  .k26ops-partial/a\n", ".k26ops-partial/ is k26ops' own"),
        ("# only a comment\n", "x.model: the manifest lists no file"),
    ],
)
def test_a_bad_manifest_is_one_line_naming_file_and_line(text, says):
    with pytest.raises(UserError, match=None) as exc:
        mf.parse(text, "x.model")
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_the_manifest_hash_is_the_entries_not_the_comments():
    a = mf.parse(f"# source: hf://a/b@{'1' * 40}\n{'a' * 64}  10  x\n")
    b = mf.parse(f"# k26ops model manifest v1\n# source: dir:/ref\n{'a' * 64}  10  x\n")
    assert a.sha256 == b.sha256 and a.source != b.source
    assert mf.parse(a.text()) == a


def test_compare_names_file_expected_and_found():
    m = mf.parse(f"{'a' * 64}  10  x.safetensors\n{'b' * 64}  20  y.safetensors\n{'c' * 64}  5  config.json\n")
    st = lambda n, ino=1: mf.Stat(n, "1.000000000", "1.000000000", ino)  # noqa: E731
    v = mf.compare(m, {"x.safetensors": st(9), "config.json": st(5), "extra.safetensors": st(3), "README.md": st(1)})
    assert v["problems"] == [
        "x.safetensors is truncated: expected 10 bytes, found 9",
        "y.safetensors is missing (expected 20 bytes)",
        "extra.safetensors is not in the manifest (found 3 bytes)",
    ]
    assert v["ignored"] == ["README.md"] and v["changed"] == ["config.json"]
    record = {"files": {"config.json": {"stat": st(5).key(), "sha256": "c" * 64}}}
    files = {"x.safetensors": st(10), "y.safetensors": st(20), "config.json": st(5)}
    v = mf.compare(m, files, record)
    assert v["problems"] == [] and v["verified"] == 1 and v["changed"] == ["x.safetensors", "y.safetensors"]
    files["config.json"] = st(5, ino=2)  # replaced since its last hash
    assert mf.compare(m, files, record)["changed"] == ["config.json", "x.safetensors", "y.safetensors"]


def test_the_model_files_fact_on_real_stat_output(tmp_path):
    d = tmp_path / "m"
    (d / "sub").mkdir(parents=True)
    (d / "a b.safetensors").write_bytes(b"x" * 7)
    (d / "sub" / "c.json").write_text("{}")
    (d / mf.PARTIAL_DIR).mkdir()
    (d / mf.PARTIAL_DIR / "half").write_bytes(b"y")
    rec = tmp_path / "rec.json"
    rec.write_text('{"files": {}, "last_full": {"at": "2026-12-07T00:00:00Z"}}')
    out = subprocess.run(["sh", "-c", model_files_command(str(d), str(rec))], capture_output=True, text=True)
    f = parse_model_files(out.stdout, out.returncode)
    assert f["error"] is None and sorted(f["files"]) == ["a b.safetensors", "sub/c.json"]
    st = f["files"]["a b.safetensors"]
    s = os.stat(d / "a b.safetensors")
    assert (st.size, st.inode, st.mtime) == (7, s.st_ino, "%d.%09d" % divmod(s.st_mtime_ns, 10**9))
    assert f["record"]["last_full"]["at"].startswith("2026")
    out = subprocess.run(
        ["sh", "-c", model_files_command(str(tmp_path / "nope"), str(rec))], capture_output=True, text=True
    )
    assert parse_model_files(out.stdout, out.returncode)["error"] == "does not exist"


# -- the Hub, at its edges (huggingface.co cannot be reached from here) ------------------


def test_hub_spec_and_the_listing_request():
    spec = mf.hub_spec(f"hf://moonshotai/Kimi-K2.6@{'ab' * 20}")
    assert mf.hub_request(spec, "hf_secret") == {
        "repo_id": "moonshotai/Kimi-K2.6",
        "revision": "ab" * 20,
        "repo_type": "model",
        "recursive": True,
        "expand": True,
        "token": "hf_secret",
    }
    assert mf.hub_request(spec, None)["token"] is False  # no token: never the one cached in ~/.cache
    for bad, says in (
        ("hf://moonshotai/Kimi-K2.6@main", "full 40-hex commit"),
        ("hf://nope@" + "a" * 40, "want hf://"),
        ("moonshotai/Kimi-K2.6", "want hf://"),
    ):
        with pytest.raises(UserError, match=says):
            mf.hub_spec(bad)


def test_the_hub_offline_is_one_line_and_the_token_never_shows():
    proc = k26ops(
        "model",
        "manifest",
        f"hf://moonshotai/Kimi-K2.6@{'ab' * 20}",
        env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_k26ops_test_secret"},
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "the Hub is not reachable from here (HF_HUB_OFFLINE is set)" in proc.stderr
    assert "hf_k26ops_test_secret" not in proc.stderr


# -- the agent, on this machine as on a host -------------------------------------------


@pytest.fixture
def host(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(shell, "WATCHDOG_PERIOD", 0.1)
    return LocalSession(Host(name="local", address="127.0.0.1", connection="local"))


def _verify(session, d, m, record, **kw):
    return agents.run(
        session,
        "weights",
        "verify",
        120,
        interpreter=sys.executable,
        path=str(d),
        entries=[[e.path, e.size, e.sha256] for e in m.entries],
        record=str(record),
        manifest=m.sha256,
        read_sample=1 << 30,
        **kw,
    )


def test_verify_names_a_changed_byte_and_rehashes_only_what_changed(host, model, tmp_path):
    d = tmp_path / "copy"
    d.mkdir()
    for f in model_fixture.FILES:
        (d / f).write_bytes((model / f).read_bytes())
    m, record = mf.load(LAB_MANIFEST), tmp_path / "state" / "rec.json"
    first = _verify(host, d, m, record)
    assert first["bad"] == [] and first["hashed"] == 5 and first["last_full"]["manifest"] == m.sha256
    assert first["hash_s"] > 0 and first["read_bytes"] == m.total
    again = _verify(host, d, m, record)
    assert again["bad"] == [] and again["hashed"] == 0  # the record vouches for all of them
    shard = d / model_fixture.FILES[3]
    with open(shard, "r+b") as f:  # one byte changed, size kept
        f.seek(12345)
        b = f.read(1)
        f.seek(12345)
        f.write(bytes([b[0] ^ 1]))
    bad = _verify(host, d, m, record)
    assert bad["hashed"] == 1 and [r for r, _ in bad["bad"]] == [model_fixture.FILES[3]]
    assert "expected " + m.by_path()[model_fixture.FILES[3]].sha256 in bad["bad"][0][1]
    forced = _verify(host, d, m, record, force=True)
    assert forced["hashed"] == 5


def test_fetch_resumes_a_partial_copy_checks_it_and_renames_it(host, model, tmp_path):
    m, record = mf.load(LAB_MANIFEST), tmp_path / "rec.json"
    e = m.by_path()[model_fixture.FILES[2]]
    dest = tmp_path / "dest"
    part = dest / mf.PARTIAL_DIR / e.path
    part.parent.mkdir(parents=True)
    part.write_bytes((model / e.path).read_bytes()[: e.size // 2])  # a cut left half of it
    res = agents.run(
        host,
        "weights",
        "fetch",
        120,
        interpreter=sys.executable,
        path=str(dest),
        rel=e.path,
        size=e.size,
        sha256=e.sha256,
        record=str(record),
        source={"kind": "local", "path": str(model)},
    )
    assert res["ok"] and res["resumed"] == e.size // 2 and res["bytes"] == e.size - e.size // 2
    assert (dest / e.path).read_bytes() == (model / e.path).read_bytes() and not part.exists()
    wrong = {"kind": "local", "path": str(model)}
    res = agents.run(
        host,
        "weights",
        "fetch",
        120,
        interpreter=sys.executable,
        path=str(dest),
        rel=e.path,
        size=e.size,
        sha256="0" * 64,
        record=str(record),
        source=wrong,
    )
    assert not res["ok"] and "expected" in res["why"] and not part.exists()


# -- the planner ------------------------------------------------------------------------


def test_the_origin_sends_each_shard_once_and_copies_spread_between_hosts():
    shards = {f"s{i}": 100 for i in range(4)}
    hosts = [f"h{i}" for i in range(8)]
    site = Site(dict(shards), {h: set(shards) for h in hosts}, max_uploads=2)
    froms: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def run(h):
        while True:
            pick = site.next(h, timeout=2)
            if pick is None:
                return
            assert pick != WAIT, "stuck"
            with lock:
                froms.append((h, *pick))
            time.sleep(0.02)  # a transfer takes time: others ask meanwhile
            site.done(h, pick[0], pick[1], True, 100)

    threads = [threading.Thread(target=run, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(site.holders[s] == set(hosts) for s in shards)
    assert sorted(s for _h, s, src in froms if src == ORIGIN) == sorted(shards)  # once each
    assert site.origin_bytes == 400 and site.peer_bytes == 7 * 400
    assert max(sum(1 for _h, _s, src in froms if src == h) for h in hosts) < 8 * 4 / 2  # no single server


def test_a_failed_host_is_no_source_and_the_others_still_finish():
    site = Site({"a": 1}, {"h1": {"a"}, "h2": {"a"}}, max_uploads=1)
    pick = site.next("h1")
    assert pick == ("a", ORIGIN)
    assert site.next("h2", timeout=0.1) == WAIT  # coming from the origin to h1
    site.done("h1", "a", ORIGIN, False)
    site.drop("h1")
    assert site.next("h2", timeout=0.1) == ("a", ORIGIN)


def test_model_verify_without_a_manifest_in_the_recipe_says_so(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text("hosts:\n  h1:\n    address: 127.0.0.1\n    vars: {recipe: k26-tp8-ddtree}\n")
    proc = cli("-i", str(inv), "model", "verify")
    assert proc.returncode == 2 and "names no model manifest" in proc.stderr and proc.stderr.count("\n") == 1


def test_sync_origin_forms():
    from k26ops.weights.sync import origin_url, split_host_path

    assert (
        origin_url(f"hf://org/repo@{'a' * 40}", "sub/x y.safetensors")
        == f"https://huggingface.co/org/repo/resolve/{'a' * 40}/sub/x%20y.safetensors"
    )
    assert origin_url("https://mirror.example/k26/", "a.json") == "https://mirror.example/k26/a.json"
    assert split_host_path("lab1:/models/K") == ("lab1", "/models/K") and split_host_path("https://x/y") is None
    with pytest.raises(UserError, match="HOST:/ABSOLUTE/PATH"):
        split_host_path("lab1:models")


def test_the_recipe_names_the_model_and_its_manifest_beside_it(tmp_path):
    from k26ops.release import recipe

    r = recipe.load("lab")
    assert r.model.manifest == LAB_MANIFEST and r.model.name == "lab-random-f16"
    text = (REPO / "playbooks/recipes/lab.yml").read_text().replace("manifest: lab.model", "manifest: ../lab.model")
    with pytest.raises(UserError, match=r"lab.yml:\d+: model.manifest: '../lab.model'"):
        recipe.parse(text, REPO / "playbooks/recipes/lab.yml")
    assert Path(LAB_MANIFEST).exists()
