"""Releases installed by uv from the root's store, on a real lab host (issue 31.3).

- A release installed by uv has, file for file, the bytes pip installs from the
  same lock (pip through `release_installer: pip`, in another k26ops_root).
- Its files are hard links into <k26ops_root>/store; a second release shares
  every file it does not change; two k26ops_roots never share one.
- Prune frees what a release alone holds, keeps what a kept release still
  links, and frees the store's files once no release links them.
"""

from __future__ import annotations

import json

import yaml

from k26ops.inventory import load
from k26ops.steps import release
from k26ops.transport.ssh import connect, q
from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.labs import private_lab
from labtools.recipes import recipe_with_extra_patch

# The subject is the release step (its installer, its store, prune): a deploy of only that
# step. The default playbook's toolkit (per k26ops_root: ~400 MB of pip CUDA wheels in
# each of the three roots) and the unit, health and smoke after every switch add nothing
# this test checks.
RELEASE_ONLY = "name: release-only\nsteps:\n  - release: {keep: 3}\n"
# installer metadata, and what Python compiles at install or import time: not the wheels' bytes
NOT_FROM_WHEELS = ("/INSTALLER", "/RECORD", "/REQUESTED", "/direct_url.json", "/uv_cache.json")

# path -> (sha256, inode, links) of every file under a dir (relative names)
LIST = (
    "python3 -c 'import hashlib,json,os,sys\nout={}\nfor b,ds,fs in os.walk(sys.argv[1]):\n"
    " for f in fs:\n  p=os.path.join(b,f)\n  if os.path.islink(p): continue\n  st=os.lstat(p)\n"
    '  out[os.path.relpath(p,sys.argv[1])]=[hashlib.sha256(open(p,"rb").read()).hexdigest(),st.st_ino,'
    "st.st_nlink]\nprint(json.dumps(out))' "
)


def inventory(lab, tmp_path, name, **vars_):
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(vars_)
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def files(ssh, d):
    return json.loads(ssh(LIST + q(d)))


def wheel_files(listing):
    return {
        p: v[0]
        for p, v in listing.items()
        if "__pycache__" not in p and not p.endswith(".pyc") and not p.endswith(NOT_FROM_WHEELS)
    }


def used(ssh, root):
    """Bytes under `root`, each file once however many links it has (du counts an inode once)."""
    return int(ssh(f"du -sB1 {q(root)} | cut -f1").strip())


def test_uv_release_equals_pip_shares_files_and_prune_frees_them(tmp_path):
    with private_lab(1, "store") as lab:
        host = lab.hosts[0].name
        ssh = lambda c: lab_ssh(lab.dir, lab.port(host), c, timeout=300).stdout  # noqa: E731

        book = tmp_path / "release-only.yml"
        book.write_text(RELEASE_ONLY)

        def deploy(inv):
            rc, doc = k26ops_json("-i", str(inv), "deploy", "--playbook", str(book), timeout=1800)
            assert rc == 0 and doc["hosts"][host]["status"] in ("ok", "changed"), doc
            rid = ssh(f"readlink {q(root_of(inv))}/releases/current").strip()
            man = json.loads(ssh(f"cat {q(root_of(inv))}/releases/{rid}/manifest.json"))
            return rid, man

        roots = {}

        def root_of(inv):
            return roots[str(inv)]

        def inv_for(name, root, **extra):
            inv = inventory(lab, tmp_path, name, k26ops_root=root, **extra)
            roots[str(inv)] = root
            return inv

        a, p, c = "/srv/k26-a", "/srv/k26-pip", "/srv/k26-c"
        inv_a = inv_for("a", a)
        r1, man1 = deploy(inv_a)
        assert man1["installer"].startswith("uv ")
        inv_p = inv_for("pip", p, release_installer="pip")
        rp, manp = deploy(inv_p)
        assert rp == r1 and manp["installer"] == "pip"

        # 1. byte for byte what pip installs from the same lock (the hashes pip checks)
        site_a = man1["site_packages"]
        site_p = manp["site_packages"]
        got_a, got_p = files(ssh, site_a), files(ssh, site_p)
        assert wheel_files(got_a) == wheel_files(got_p)
        assert any(k.startswith("sglang/") for k in wheel_files(got_a)) and len(wheel_files(got_a)) > 100
        # every file of the locked wheels (not the venv's own pip, not a patched file) is a
        # link into this root's store; pip's are copies
        ssh("rm -rf /tmp/fresh && python3 -m venv /tmp/fresh")
        venv_own = set(files(ssh, site_a.replace(site_a.split("/lib/")[0], "/tmp/fresh")))
        from_lock = set(wheel_files(got_a)) - venv_own - set(man1["patched_files"])
        store_a = files(ssh, f"{a}/store")
        inodes_a = {v[1] for v in store_a.values()}
        assert len(from_lock) > 100 and not [k for k in from_lock if got_a[k][1] not in inodes_a]
        assert not {v[1] for v in got_p.values()} & inodes_a

        # 2. a second root never shares the first one's store
        inv_c = inv_for("c", c)
        rc_, manc = deploy(inv_c)
        assert rc_ == r1
        got_c = files(ssh, manc["site_packages"])
        assert wheel_files(got_c) == wheel_files(got_a)
        assert not ({v[1] for v in got_c.values()} | {v[1] for v in files(ssh, f"{c}/store").values()}) & (
            inodes_a | {v[1] for v in got_a.values()}
        )

        # 3. a second release in root a shares every file it does not change
        changed = recipe_with_extra_patch(tmp_path / "changed", "store")
        inv_a2 = inv_for("a2", a, recipe=str(changed))
        r2, man2 = deploy(inv_a2)
        assert r2 != r1
        got_2 = files(ssh, man2["site_packages"])
        changed_files = set(man2["patched_files"]) | set(man1["patched_files"])
        same = from_lock - changed_files
        assert not [k for k in same if got_2[k][1] != got_a[k][1]]

        # 4. prune: the first release frees only what it alone holds; the store stays for r2
        host_obj = load(inv_a).hosts[host]
        session = connect(host_obj)
        try:
            before_alone = release.agents.run(session, "store", "alone", dirs=[f"{a}/releases/{r1}"])["bytes"]
            b0, st0 = used(ssh, a), used(ssh, f"{a}/store")
            out = release.prune(session, f"{a}/releases", a, [r1])
            b1 = used(ssh, a)
            assert out["deleted"] == [r1] and out["removed"] == 0, out
            freed = b0 - b1
            want = before_alone[f"{a}/releases/{r1}"]
            assert abs(freed - want) <= max(1 << 20, want // 20), (freed, want)
            assert used(ssh, f"{a}/store") == st0  # every shared file stays, r2 links it
            # r2 is whole: its files still hash as installed
            assert wheel_files(files(ssh, man2["site_packages"])) == wheel_files(got_2)
            # 5. once no release links them, the store's files go too
            s0 = int(ssh(f"du -sB1 {a}/store | cut -f1").strip())
            ssh(f"ln -sfn /nonexistent {a}/releases/current")
            out = release.prune(session, f"{a}/releases", a, [r2])
            s1 = int(ssh(f"du -sB1 {a}/store | cut -f1").strip())
            assert out["deleted"] == [r2] and out["removed"] > 0 and out["freed"] > 0.8 * s0, (out, s0)
            assert s1 < 0.2 * s0, (s0, s1)
        finally:
            session.close()

        # 6. with the store emptied, root a installs r1 again (uv re-unpacks from the wheelhouse)
        r1b, man1b = deploy(inv_a)
        assert r1b == r1 and wheel_files(files(ssh, man1b["site_packages"])) == wheel_files(got_a)


def test_a_bad_installer_is_one_line_and_exit_2_before_any_host(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "vars": {"recipe": "lab", "model_path": "/models/m", "release_installer": "conda"},
                "hosts": {"h1": {"address": "127.0.0.1", "port": 1}},
            }
        )
    )
    proc = k26ops("-i", str(inv), "deploy")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "h1: inventory var release_installer: 'conda': choose one of uv, pip" in proc.stderr


def test_store_gc_drops_only_entries_no_release_links(tmp_path):
    """The agent on a local tree laid out as uv's cache: an archive entry one
    release still links stays, with its index file; one nothing links goes,
    index file first."""
    import os
    import sys

    from k26ops.transport import agents
    from k26ops.transport.ssh import Host, LocalSession

    store, rel = tmp_path / "store", tmp_path / "rel"
    for aid in ("KEEPaaaaaaaaaaaa", "GONEbbbbbbbbbbbb"):
        (store / "archive-v0" / aid / "pkg").mkdir(parents=True)
        (store / "archive-v0" / aid / "pkg" / "m.py").write_bytes(aid.encode() * 1000)
        idx = store / "wheels-v8" / "index" / "x" / aid[:4].lower()
        idx.mkdir(parents=True)
        (idx / "1.0-py3-none-any.rev").write_bytes(b"\x92\x92" + aid.encode() + b"\x91")
    rel.mkdir()
    os.link(store / "archive-v0" / "KEEPaaaaaaaaaaaa" / "pkg" / "m.py", rel / "m.py")
    session = LocalSession(Host(name="local", address="127.0.0.1", connection="local"))
    run = lambda op, **r: agents.run(session, "store", op, 60, interpreter=sys.executable, **r)  # noqa: E731
    assert run("alone", dirs=[str(rel)])["bytes"] == {str(rel): os.lstat(rel).st_blocks * 512}
    out = run("gc", store=str(store))
    assert out["removed"] == 1 and out["freed"] > 0
    assert sorted(os.listdir(store / "archive-v0")) == ["KEEPaaaaaaaaaaaa"]
    assert (store / "wheels-v8/index/x/keep/1.0-py3-none-any.rev").exists()
    assert not (store / "wheels-v8/index/x/gone/1.0-py3-none-any.rev").exists()
    (rel / "m.py").unlink()  # the last release that linked it is gone
    assert run("gc", store=str(store))["removed"] == 1 and os.listdir(store / "archive-v0") == []
