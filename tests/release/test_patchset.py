"""patchset: the real series on the real sglang release, plus the edge cases
(broken patch writes nothing, already applied, offsets, drift, standalone script)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
import sglang_release  # noqa: E402

from k26ops.errors import UserError  # noqa: E402
from k26ops.release import patchset as ps  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
SERIES = REPO / "patches" / "sglang-0.5.23" / "series"
LAB_BASE = "sglang@a7e4c020c4b67bbd3912a320d1515139016ea5a6"


def tree_hash(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def narrow_paths(exists) -> list[str]:
    """What the patch tests read and write: every file a shipped patch or one written
    in this module names, those that `exists`. patchset writes only the files its
    patches name, so a tree of just these shows everything a whole 6000-file tree
    would (copying and hashing that one cost seconds a test)."""
    import re

    own = set(re.findall(r"^\+\+\+ b/(\S+)", Path(__file__).read_text(), re.M))
    return [p for p in sorted({f.path for pt, _b in all_patches() for f in pt.files} | own) if exists(p)]


@pytest.fixture(scope="module")
def pristine_trees(tmp_path_factory):
    """site_tree(version, dest): a private copy of a release's files that the patches
    touch (narrow_paths), made once per version and module, handed out as hard-linked
    copies. Safe because patchset writes every file by atomic replace (a linked file is
    replaced, never written through); a test must not write into a site file in place."""
    made: dict[str, Path] = {}

    def site_tree(version: str, dest: Path) -> Path:
        from k26ops.release import prepcache

        if version not in made:
            src = sglang_release.site_packages(version)
            made[version] = sglang_release.copy_files(
                tmp_path_factory.mktemp(f"pristine-{version}"), narrow_paths(lambda p: (src / p).is_file()), version
            )
        prepcache.linked_copy(made[version] / "sglang", dest / "sglang")
        return dest

    return site_tree


@pytest.fixture
def site(tmp_path, pristine_trees) -> Path:
    return pristine_trees("0.5.23", tmp_path / "site")


def all_series() -> list[Path]:
    return sorted((REPO / "patches").glob("*/series"))


def all_patches() -> list[tuple[ps.Patch, tuple]]:
    """Every (patch, base) pair of every shipped series, guarded or not."""
    out = []
    for series in all_series():
        for e in ps.parse_series(series.read_text()):
            p = ps.parse_patch((series.parent / e.path).read_text(), e.path, e.strip)
            out += [(p, b) for b in p.bases]
    return out


def test_every_series_names_its_base_and_every_patch_names_it_too():
    assert all_series(), "no patches/<base>/series"
    for series in all_series():
        declared = ps.series_base(series.read_text())
        assert declared, f"{series} has no `# Base:` line"
        pkg, spec = ps.parse_base(declared[1])
        for e in ps.parse_series(series.read_text()):
            p = ps.parse_patch((series.parent / e.path).read_text(), e.path, e.strip)
            assert (pkg, spec) in [(b[0], b[1]) for b in p.bases], f"{series}: {e.path} is not for {declared[1]}"
    # the DDTree verify-graph fix is in PR 29907 itself: its series must not carry one
    pr = (REPO / "patches/sglang-pr29907-93e9850e4300/series").read_text()
    assert not [e for e in ps.parse_series(pr) if "verify-graph" in e.path]


@pytest.mark.parametrize(
    "patch,base",
    [pb for pb in all_patches() if pb[1][1].startswith("==")],
    ids=lambda x: getattr(x, "name", None) or "".join(x[:2]),
)
def test_every_pypi_patch_applies_to_its_real_release_and_reverts_exactly(patch, base, tmp_path, pristine_trees):
    pkg, spec, source = base
    assert pkg == "sglang" and source.lower().startswith("pypi")
    version = spec[2:]
    site = pristine_trees(version, tmp_path / "site")
    before = tree_hash(site)
    res = ps.apply(site, [patch], tmp_path / "state", {pkg: version})
    assert res["changed"] and not res["warnings"]
    assert [p["status"] for p in res["patches"]] == ["apply"]
    for rel in res["files"]:
        if rel.endswith(".py"):
            compile((site / rel).read_text(), rel, "exec")
    assert ps.verify(site, tmp_path / "state") == []
    ps.revert(site, tmp_path / "state")
    assert tree_hash(site) == before


@pytest.fixture(scope="module")
def lab_commit_tree(tmp_path_factory) -> tuple[str, Path]:
    """(commit, its python/ tree): the lab fixture's commit, the files narrow_paths
    names exported once per module (git archive of those paths: exact bytes)."""
    import tarfile

    from k26ops.lab import engine_source_fixture
    from k26ops.release import engine_source

    url, commit = engine_source_fixture.ensure()
    bare = engine_source.fetch(url, commit)

    def git(*a):
        return subprocess.run(["git", "-C", str(bare), *a], capture_output=True, check=True).stdout

    listed = set(git("ls-tree", "-r", "--name-only", commit, "python/").decode().splitlines())
    dest = tmp_path_factory.mktemp("lab-src") / "src"
    tar = tmp_path_factory.mktemp("lab-tar") / "src.tar"
    tar.write_bytes(
        git(
            "archive", "--format=tar", commit, *(f"python/{p}" for p in narrow_paths(lambda p: f"python/{p}" in listed))
        )
    )
    with tarfile.open(tar) as tf:
        tf.extractall(dest, filter="data")
    return commit, dest / "python"


@pytest.mark.parametrize(
    "patch,base",
    [pb for pb in all_patches() if pb[1][1] == LAB_BASE[6:]],
    ids=lambda x: getattr(x, "name", None) or "lab",
)
def test_every_lab_base_patch_applies_to_the_lab_commit(patch, base, tmp_path, lab_commit_tree):
    """The lab base is a real commit (the lab fixture's): read its tree at that commit
    (hard-linked from one export: patchset replaces files, never writes through them)."""
    from k26ops.release import prepcache

    commit, exported = lab_commit_tree
    assert "sglang@" + commit == LAB_BASE
    tree = tmp_path / "python"
    prepcache.linked_copy(exported, tree)
    res = ps.apply(tree, [patch], tmp_path / "state", {"sglang": "@" + commit})
    assert res["changed"] and [p["status"] for p in res["patches"]] == ["apply"]


def test_a_patch_for_another_base_is_refused_and_writes_nothing(site, tmp_path):
    probe = ps.load_series(SERIES, ["diagnose"])
    before = tree_hash(site)
    other = "@" + "1" * 40
    with pytest.raises(ps.PatchError) as ei:
        ps.apply(site, probe, tmp_path / "st", {"sglang": other})
    msg = str(ei.value)
    assert "\n" not in msg and "is written for sglang==0.5.23" in msg and f"sglang{other}" in msg
    assert "nothing was applied" in msg
    assert tree_hash(site) == before and not (tmp_path / "st").exists()
    with pytest.raises(ps.PatchError, match="is written for"):
        ps.apply(site, probe, tmp_path / "st", {"sglang": "0.5.24"})
    no_base = ps.parse_patch(
        PROBE_TEXT().split("\n--- ", 1)[0].replace("Base:", "Was:") + "\n--- " + PROBE_TEXT().split("\n--- ", 1)[1],
        "nobase.patch",
    )
    with pytest.raises(ps.PatchError, match="no Base: header"):
        ps.apply(site, [no_base], tmp_path / "st", {"sglang": "0.5.23"})
    assert tree_hash(site) == before


def PROBE_TEXT() -> str:
    return (SERIES.parent / "cuda-graph-none-probe.patch").read_text()


def test_whole_series_with_diagnose_tag(site, tmp_path):
    before = tree_hash(site)
    pats = ps.load_series(SERIES, tags=["diagnose"])
    assert pats
    res = ps.apply(site, pats, tmp_path / "st", {"sglang": "0.5.23"})
    assert res["changed"]
    again = ps.apply(site, pats, tmp_path / "st", {"sglang": "0.5.23"})
    assert not again["changed"] and {p["status"] for p in again["patches"]} == {"applied"}
    ps.revert(site, tmp_path / "st")
    assert tree_hash(site) == before
    assert not (tmp_path / "st" / "state.json").exists()


BROKEN = """Base: sglang==0.5.23 (PyPI)
deliberately broken: second file's hunk 2 context is wrong
--- a/sglang/srt/model_executor/model_runner.py
+++ b/sglang/srt/model_executor/model_runner.py
@@ -18,3 +18,4 @@
 import contextlib
 import inspect
+import k26ops_marker
 import logging
--- a/sglang/version.py
+++ b/sglang/version.py
@@ -1,1 +1,1 @@
-{version_line}
+__version__ = "0.5.23+k26"
@@ -40,2 +40,2 @@
-this line is not in the file
+nor is this
 context
"""


def test_broken_patch_touches_nothing(site, tmp_path):
    version_line = (site / "sglang/version.py").read_text().splitlines()[0]
    good = ps.parse_patch(PROBE_TEXT(), "good.patch")
    bad = ps.parse_patch(BROKEN.replace("{version_line}", version_line), "broken.patch")
    before = tree_hash(site)
    with pytest.raises(ps.PatchError) as ei:
        ps.apply(site, [good, bad], tmp_path / "st", {"sglang": "0.5.23"})
    msg = str(ei.value)
    assert isinstance(ei.value, UserError) and "\n" not in msg
    assert "broken.patch" in msg and "sglang/version.py" in msg and "hunk 2" in msg
    assert "expected sglang==0.5.23" in msg and "installed sglang==0.5.23" in msg
    assert tree_hash(site) == before
    assert not (tmp_path / "st").exists()


def test_already_applied_without_state_then_revert(site, tmp_path):
    before = tree_hash(site)
    pats = ps.load_series(SERIES, ["diagnose"])
    ps.apply(site, pats, tmp_path / "first", {"sglang": "0.5.23"})
    patched = tree_hash(site)
    # a fresh state (applied by hand, or state lost): detected, nothing written
    res = ps.apply(site, pats, tmp_path / "second", {"sglang": "0.5.23"})
    assert not res["changed"] and res["patches"][0]["status"] == "applied"
    assert tree_hash(site) == patched
    # its pristine copy was reconstructed by reversing the patch in memory
    ps.revert(site, tmp_path / "second")
    assert tree_hash(site) == before


def test_changed_patch_after_apply_fails_loudly(site, tmp_path):
    p = ps.load_series(SERIES, ["diagnose"])[0]
    ps.apply(site, [p], tmp_path / "st")
    text = "Edited header line.\n" + (SERIES.parent / p.name).read_text()
    with pytest.raises(ps.PatchError, match="changed since it was applied"):
        ps.apply(site, [ps.parse_patch(text, p.name)], tmp_path / "st")


def _mini(tmp_path) -> Path:
    root = tmp_path / "mini"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg/a.py").write_text("".join(f"line{i}\n" for i in range(1, 21)))
    return root


MINI = """Base: pkg==1.0 (PyPI)
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -4,3 +4,4 @@
 line4
 line5
+inserted
 line6
@@ -15,3 +16,3 @@
 line15
-line16
+LINE16
 line17
"""


def test_offset_tolerance_but_no_context_fuzz(tmp_path):
    root = _mini(tmp_path)
    text = (root / "pkg/a.py").read_text()
    (root / "pkg/a.py").write_text("new1\nnew2\nnew3\n" + text)  # shifted by 3 lines
    res = ps.apply(root, [ps.parse_patch(MINI, "mini.patch")], tmp_path / "st")
    out = (root / "pkg/a.py").read_text().splitlines()
    assert res["changed"] and out[8] == "inserted" and "LINE16" in out and "line16" not in out
    root2 = _mini(tmp_path / "x")
    (root2 / "pkg/a.py").write_text((root2 / "pkg/a.py").read_text().replace("line17", "line17 changed"))
    with pytest.raises(ps.PatchError, match="mini.patch: pkg/a.py: hunk 2 does not apply"):
        ps.apply(root2, [ps.parse_patch(MINI, "mini.patch")], tmp_path / "st2")


def test_new_file_no_newline_and_mode(tmp_path):
    root = _mini(tmp_path)
    os.chmod(root / "pkg/a.py", 0o640)
    patch = ps.parse_patch(
        """--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1,2 @@
+x = 1
+y = 2
\\ No newline at end of file
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -1,2 +1,2 @@
-line1
+LINE1
 line2
""",
        "new.patch",
    )
    ps.apply(root, [patch], tmp_path / "st")
    assert (root / "pkg/new.py").read_bytes() == b"x = 1\ny = 2"
    assert (root / "pkg/a.py").stat().st_mode & 0o777 == 0o640
    ps.revert(root, tmp_path / "st")
    assert not (root / "pkg/new.py").exists()
    assert (root / "pkg/a.py").read_text().startswith("line1\n")


def test_drift_is_reported(tmp_path):
    root = _mini(tmp_path)
    ps.apply(root, [ps.parse_patch(MINI, "mini.patch")], tmp_path / "st")
    state = json.loads((tmp_path / "st/state.json").read_text())
    p = state["patches"][0]
    assert p["sha256"] == hashlib.sha256(MINI.encode()).hexdigest()
    assert p["files"]["pkg/a.py"]["before"] != p["files"]["pkg/a.py"]["after"]
    assert ps.verify(root, tmp_path / "st") == []
    with open(root / "pkg/a.py", "a") as f:
        f.write("# hand edit\n")
    drift = ps.verify(root, tmp_path / "st/state.json")
    assert [d["path"] for d in drift] == ["pkg/a.py"]
    assert drift[0]["expected"] == p["files"]["pkg/a.py"]["after"]
    res = ps.revert(root, tmp_path / "st")
    assert res["drift"] and (root / "pkg/a.py").read_text() == "".join(f"line{i}\n" for i in range(1, 21))


def test_series_parsing_guards():
    entries = ps.parse_series(
        """# comment
a.patch
b.patch -p0 [diagnose]
c.patch   # when: diagnose, lab

""",
        "series",
    )
    assert [(e.path, e.guards, e.strip, e.lineno) for e in entries] == [
        ("a.patch", (), 1, 2),
        ("b.patch", ("diagnose",), 0, 3),
        ("c.patch", ("diagnose", "lab"), 1, 4),
    ]
    with pytest.raises(ps.PatchError, match="series:1"):
        ps.parse_series("a.patch junk", "series")


def test_missing_active_patch_names_series_line(tmp_path):
    (tmp_path / "series").write_text("# x\nmissing.patch\nother.patch [diagnose]\n")
    with pytest.raises(ps.PatchError, match=r"series:2: patch missing.patch"):
        ps.load_series(tmp_path / "series")


def test_standalone_script_json(site, tmp_path):
    """The module runs on a host as a plain script: copy it alone, run with -I (no k26ops)."""
    script = tmp_path / "patchset.py"
    shutil.copy(REPO / "k26ops/release/patchset.py", script)
    before = tree_hash(site)

    def run(*a):
        return subprocess.run([sys.executable, "-I", str(script), *a], capture_output=True, text=True)

    r = run(
        "apply",
        "--root",
        str(site),
        "--series",
        str(SERIES),
        "--state",
        str(tmp_path / "st"),
        "--tag",
        "diagnose",
        "--base",
        "sglang==0.5.23",
    )
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"] and out["changed"], r.stderr
    r = run("verify", "--root", str(site), "--state", str(tmp_path / "st"))
    assert json.loads(r.stdout) == {"ok": True, "drift": []}
    r = run("revert", "--root", str(site), "--state", str(tmp_path / "st"))
    assert json.loads(r.stdout)["ok"] and tree_hash(site) == before
    (tmp_path / "bad.series").write_text("nope.patch\n")
    r = run("check", "--root", str(site), "--series", str(tmp_path / "bad.series"), "--state", str(tmp_path / "st"))
    assert r.returncode == 2 and "nope.patch" in json.loads(r.stdout)["error"]
    # the wrong base: refused by the host script too, nothing written
    r = run(
        "apply",
        "--root",
        str(site),
        "--series",
        str(SERIES),
        "--state",
        str(tmp_path / "st2"),
        "--tag",
        "diagnose",
        "--base",
        "sglang@" + "2" * 40,
    )
    assert r.returncode == 2 and "is written for sglang==0.5.23" in json.loads(r.stdout)["error"]
    assert tree_hash(site) == before
