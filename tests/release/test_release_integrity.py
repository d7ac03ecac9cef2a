"""One release never edits another, and a damaged store is found (issue 42), on a shared lab host
in a k26ops_root of the test's own (removed after):

- after a uv build nothing under the root or /etc/k26ops is world-writable; the store is 0700
  (no other user opens, so flocks, its lock files), uv's lock files 0600, its files read-only;
  the manifest says which link mode the filesystem gave (ext4 here: hardlink);
- a store lock held by a leftover process fails the build in one line naming it, not after an hour;
- an in-place edit (as root: modes do not stop it) of a file a release hard-links is drift in
  `status` (exit 1, the file named against its wheel's RECORD), and a full verify names it in
  every release that shares it;
- a file deleted from the store is found by the next build, which unpacks that wheel again:
  the new release has the file.
"""

from __future__ import annotations

import json
import subprocess
import time

import yaml

from k26ops.inventory import load
from k26ops.transport import agents
from k26ops.transport.ssh import connect, q
from labtools.invoke import k26ops_json, lab_ssh
from labtools.recipes import recipe_with_extra_patch

ROOT = "/srv/k26-integrity"
BOOK = "name: release-only\nsteps:\n  - release: {keep: 5}\n"


def test_store_is_private_and_damage_is_found_and_repaired(lab, tmp_path):
    host = lab.hosts[0].name

    def ssh(c: str) -> str:
        res = lab_ssh(lab.dir, lab.port(host), c, timeout=300)
        assert res.returncode == 0, (c, res.stdout, res.stderr)
        return res.stdout

    book = tmp_path / "book.yml"
    book.write_text(BOOK)

    def inv(name: str, recipe=None):
        doc = yaml.safe_load(lab.inventory.read_text())
        doc["vars"]["k26ops_root"] = ROOT
        if recipe:
            doc["vars"]["recipe"] = str(recipe)
        p = tmp_path / f"{name}.yml"
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        return p

    def deploy(i):
        return k26ops_json("-i", str(i), "--limit", host, "deploy", "--playbook", str(book), timeout=1800)

    def manifest(rid):
        return json.loads(ssh(f"cat {ROOT}/releases/{rid}/manifest.json"))

    try:
        rc, doc = deploy(inv("a"))
        assert rc == 0, doc
        r1 = ssh(f"readlink {ROOT}/releases/current").strip()
        m1 = manifest(r1)
        assert m1["link_mode"] == "hardlink"  # ext4: no reflinks; btrfs/xfs give "clone"
        assert ssh(f"find {ROOT} /etc/k26ops -perm -o+w ! -type l 2>/dev/null || true") == ""
        assert ssh(f"stat -c %a {ROOT}/store").strip() == "700"
        locks = ssh(f"find {ROOT}/store -name '*.lock' -printf '%m\\n' | sort -u").split()
        assert locks == ["600"], locks
        assert ssh(f"runuser -u nobody -- flock -n {ROOT}/store/.lock true 2>&1 || true").find("Permission denied") >= 0
        site = m1["site_packages"]
        victim = next(p for p in ssh(f"cd {q(site)} && ls sglang/*.py").split() if p not in m1["patched_files"])
        assert ssh(f"stat -c %a {q(site + '/' + victim)}").strip() in ("444", "555")  # read-only link

        # a store lock held by a leftover process: one line naming it, the release dir removed
        holder = subprocess.Popen(
            [
                "ssh",
                "-i",
                str(lab.dir / "id_ed25519"),
                "-o",
                f"UserKnownHostsFile={lab.dir / 'known_hosts'}",
                "-p",
                str(lab.port(host)),
                "root@127.0.0.1",
                f"exec flock {ROOT}/store/.lock sleep 600",
            ]
        )
        try:
            for _ in range(100):
                if ssh("grep -c FLOCK /proc/locks; pgrep -f 'sleep 600' || true").split()[1:]:
                    break
                time.sleep(0.1)
            pid = ssh("pgrep -x flock").split()[0]  # flock holds the lock, its child sleeps
            r2_recipe = recipe_with_extra_patch(tmp_path / "r2", "integrity")
            rc, doc = deploy(inv("b", r2_recipe))
            err = doc["hosts"][host]["error"]
            assert (
                rc == 1
                and f"{ROOT}/store/.lock is held by pid {pid} (user root: flock {ROOT}/store/.lock sleep 600)" in err
            ), doc
            assert "\n" not in err
        finally:
            holder.terminate()
            ssh("pkill -x flock || true; pkill -xf 'sleep 600' || true")
        rc, doc = deploy(inv("b", r2_recipe))
        assert rc == 0, doc
        r2 = ssh(f"readlink {ROOT}/releases/current").strip()
        assert r2 != r1
        site2 = manifest(r2)["site_packages"]
        ino = lambda p: ssh(f"stat -c %i {q(p)}").strip()  # noqa: E731
        assert ino(f"{site}/{victim}") == ino(f"{site2}/{victim}")  # hard links: one inode
        # the build's patch (sglang/version.py) broke the link first: r2's file is its own, r1's bytes as built
        for rel, h in m1["patched_files"].items():
            assert ino(f"{site}/{rel}") != ino(f"{site2}/{rel}"), rel
            assert ssh(f"sha256sum {q(site + '/' + rel)}").split()[0] == h, rel
        assert "sglang/version.py" in manifest(r2)["patched_files"]
        assert ino(f"{site}/sglang/version.py") != ino(f"{site2}/sglang/version.py")

        # an in-place edit by root: status names it against the RECORD, exit 1
        ssh(f"echo '# hand edit' >> {q(site2 + '/' + victim)}")
        env = {**lab.env(), "K26OPS_INVENTORY": str(inv("b", r2_recipe))}
        rc, st = k26ops_json("--limit", host, "status", env=env)
        drift = st["hosts"][host]["drift"]
        assert rc == 1 and drift["canonical"] is False, st
        assert any(f.startswith(f"{victim} (size ") for f in drift["drifted_files"]), drift
        assert "wheels' RECORD" in st["hosts"][host]["baseline"]
        # the release it shares the file with is damaged too, and a full verify reads the bytes
        session = connect(load(inv("b", r2_recipe)).hosts[host])
        try:
            for rid in (r1, r2):
                p = agents.run(
                    session,
                    "baseline",
                    "probe",
                    300,
                    releases_root=f"{ROOT}/releases",
                    release=rid,
                    verify="full",
                    unit_path="/nonexistent",
                    env_path="/nonexistent",
                )
                assert [b["path"] for b in p["release"]["record_bad"]] == [victim], (rid, p["release"]["record_bad"])
        finally:
            session.close()

        # a file deleted from the store: the next build finds it missing and unpacks that wheel again
        store_copy = ssh(f"find {ROOT}/store -samefile {q(site + '/' + victim)}").split()
        assert store_copy, "the store holds the edited file"
        ssh(f"rm -f {q(store_copy[0])}")
        r3_recipe = recipe_with_extra_patch(tmp_path / "r3", "integrity3")
        rc, doc = deploy(inv("c", r3_recipe))
        assert rc == 0, doc
        assert victim in doc["hosts"][host].get("store_repaired", []), doc["hosts"][host]
        r3 = ssh(f"readlink {ROOT}/releases/current").strip()
        site3 = manifest(r3)["site_packages"]
        assert "# hand edit" not in ssh(f"cat {q(site3 + '/' + victim)}")  # unpacked again from the wheel

        # an edit of the same size with its mtime put back: sizes and mtimes say nothing, --verify reads it
        other = next(
            p
            for p in ssh(f"cd {q(site3)} && ls sglang/*.py").split()
            if p not in manifest(r3)["patched_files"]
            and p != victim
            and int(ssh(f"stat -c %s {q(site3 + '/' + p)}")) > 10
        )
        path = q(site3 + "/" + other)
        ssh(
            f"t=$(stat -c %Y {path}); printf '#' | dd of={path} bs=1 seek=0 conv=notrunc 2>/dev/null; "
            f"touch -d @$t {path}"
        )
        env3 = {**lab.env(), "K26OPS_INVENTORY": str(inv("c", r3_recipe))}
        rc, st = k26ops_json("--limit", host, "status", env=env3)
        assert st["hosts"][host]["drift"]["drifted_files"] == [], st  # cheap: same size, same mtime
        rc, st = k26ops_json("--limit", host, "status", "--verify", env=env3)
        assert rc == 1 and st["hosts"][host]["drift"]["drifted_files"] == [f"{other} (sha256 differs from RECORD)"], st
        assert ssh(f"find {ROOT} /etc/k26ops -perm -o+w ! -type l 2>/dev/null || true") == ""
    finally:
        lab_ssh(lab.dir, lab.port(host), f"pkill -xf 'sleep 600'; rm -rf {ROOT}", timeout=300)
