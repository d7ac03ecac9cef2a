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

sys.path.insert(0, str(Path(__file__).parent))
import sglang_release  # noqa: E402

from k26ops import patchset as ps  # noqa: E402
from k26ops.errors import UserError  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SERIES = REPO / "patches" / "series"


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def pristine_site(tmp_path_factory) -> Path:
    return sglang_release.copy_tree(tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def site(tmp_path) -> Path:
    return sglang_release.copy_tree(tmp_path / "site")


def all_patches() -> list[ps.Patch]:
    """Every patch named in the series, guarded or not, that exists on disk."""
    out = []
    for e in ps.parse_series(SERIES.read_text()):
        p = SERIES.parent / e.path
        if p.exists():
            out.append(ps.parse_patch(p.read_text(), e.path, e.strip))
    return out


def test_series_has_ddtree_fix_and_guarded_probe():
    entries = {e.path: e for e in ps.parse_series(SERIES.read_text())}
    assert entries["sglang-0.5.23/ddtree-verify-graph-tokens.patch"].guards == ()
    assert entries["sglang-0.5.23/cuda-graph-none-probe.patch"].guards == ("diagnose",)
    assert [p.name for p in ps.load_series(SERIES)] == ["sglang-0.5.23/ddtree-verify-graph-tokens.patch"]


@pytest.mark.parametrize("patch", all_patches(), ids=lambda p: p.name)
def test_every_pypi_patch_applies_to_its_real_release_and_reverts_exactly(patch, tmp_path):
    assert patch.base, f"{patch.name} has no Base: header"
    pkg, version, source = patch.base
    assert pkg == "sglang" and source.lower().startswith("pypi")
    site = sglang_release.copy_tree(tmp_path / "site", version)
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


def test_whole_series_with_diagnose_tag(site, tmp_path):
    before = tree_hash(site)
    pats = ps.load_series(SERIES, tags=["diagnose"]) if (SERIES.parent / "sglang-0.5.23/cuda-graph-none-probe.patch").exists() else ps.load_series(SERIES)
    res = ps.apply(site, pats, tmp_path / "st", {"sglang": "0.5.23"})
    assert res["changed"]
    again = ps.apply(site, pats, tmp_path / "st", {"sglang": "0.5.23"})
    assert not again["changed"] and {p["status"] for p in again["patches"]} == {"applied"}
    ps.revert(site, tmp_path / "st")
    assert tree_hash(site) == before
    assert not (tmp_path / "st" / "state.json").exists()


def test_ddtree_patch_content(site, tmp_path):
    ps.apply(site, ps.load_series(SERIES), tmp_path / "st", {"sglang": "0.5.23"})
    src = (site / "sglang/srt/model_executor/model_runner.py").read_text()
    assert "return ddtree_budget + 1" in src and "not self.is_draft_worker" in src
    assert 'getattr(model_runner.spec_algorithm, "is_ddtree", None)' in src


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
    good = ps.parse_patch((SERIES.parent / "sglang-0.5.23/ddtree-verify-graph-tokens.patch").read_text(), "good.patch")
    bad = ps.parse_patch(BROKEN.replace("{version_line}", version_line), "broken.patch")
    before = tree_hash(site)
    with pytest.raises(ps.PatchError) as ei:
        ps.apply(site, [good, bad], tmp_path / "st", {"sglang": "0.5.24"})
    msg = str(ei.value)
    assert isinstance(ei.value, UserError) and "\n" not in msg
    assert "broken.patch" in msg and "sglang/version.py" in msg and "hunk 2" in msg
    assert "expected sglang==0.5.23" in msg and "installed sglang==0.5.24" in msg
    assert tree_hash(site) == before
    assert not (tmp_path / "st").exists()


def test_already_applied_without_state_then_revert(site, tmp_path):
    before = tree_hash(site)
    pats = ps.load_series(SERIES)
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
    p = ps.load_series(SERIES)[0]
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
    patch = ps.parse_patch("""--- /dev/null
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
""", "new.patch")
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
    entries = ps.parse_series("""# comment
a.patch
b.patch -p0 [diagnose]
c.patch   # when: diagnose, lab

""", "series")
    assert [(e.path, e.guards, e.strip, e.lineno) for e in entries] == [
        ("a.patch", (), 1, 2), ("b.patch", ("diagnose",), 0, 3), ("c.patch", ("diagnose", "lab"), 1, 4)]
    with pytest.raises(ps.PatchError, match="series:1"):
        ps.parse_series("a.patch junk", "series")


def test_missing_active_patch_names_series_line(tmp_path):
    (tmp_path / "series").write_text("# x\nmissing.patch\nother.patch [diagnose]\n")
    with pytest.raises(ps.PatchError, match=r"series:2: patch missing.patch"):
        ps.load_series(tmp_path / "series")


def test_standalone_script_json(site, tmp_path):
    """The module runs on a host as a plain script: copy it alone, run with -I (no k26ops)."""
    script = tmp_path / "patchset.py"
    shutil.copy(REPO / "k26ops/patchset.py", script)
    before = tree_hash(site)
    run = lambda *a: subprocess.run([sys.executable, "-I", str(script), *a], capture_output=True, text=True)
    r = run("apply", "--root", str(site), "--series", str(SERIES), "--state", str(tmp_path / "st"),
            "--installed", "sglang==0.5.23")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"] and out["changed"], r.stderr
    r = run("verify", "--root", str(site), "--state", str(tmp_path / "st"))
    assert json.loads(r.stdout) == {"ok": True, "drift": []}
    r = run("revert", "--root", str(site), "--state", str(tmp_path / "st"))
    assert json.loads(r.stdout)["ok"] and tree_hash(site) == before
    (tmp_path / "bad.series").write_text("nope.patch\n")
    r = run("check", "--root", str(site), "--series", str(tmp_path / "bad.series"), "--state", str(tmp_path / "st"))
    assert r.returncode == 2 and "nope.patch" in json.loads(r.stdout)["error"]


def test_ddtree_patch_behaviour(site, tmp_path):
    """Run the patched decode_num_tokens_per_req from the real file (extracted with ast,
    no sglang import): DDTree target verify -> budget+1; draft worker and DFLASH unchanged."""
    import ast
    import types

    ps.apply(site, ps.load_series(SERIES), tmp_path / "st")
    path = site / "sglang/srt/model_executor/model_runner.py"
    tree = ast.parse(path.read_text())
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_k26ops_ddtree_verify_budget")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "decode_num_tokens_per_req")
    calls = []
    ns = {"Optional": __import__("typing").Optional, "get_spec": lambda: types.SimpleNamespace(),
          "resolve_num_tokens_per_req": lambda **kw: calls.append(kw) or kw["num_draft_tokens"] or 8,
          "DllmConfig": None}
    exec(compile(ast.Module([helper, method], []), str(path), "exec"), ns)
    fn = ns["decode_num_tokens_per_req"]

    class Algo:
        def __init__(self, name, has_is_ddtree):
            self.name = name
            if has_is_ddtree:
                self.is_ddtree = lambda: name == "DDTREE"

        def is_speculative(self):
            return True

        def is_dspark(self):
            return False

    def runner(algo, draft, has_is_ddtree=False, budget=32):
        return types.SimpleNamespace(
            spec_algorithm=Algo(algo, has_is_ddtree), is_draft_worker=draft,
            server_args=types.SimpleNamespace(speculative_algorithm=algo, speculative_ddtree_budget=budget))

    for has in (False, True):
        assert fn(runner("DDTREE", False, has), num_draft_tokens=8) == 33
        assert fn(runner("DDTREE", True, has), num_draft_tokens=8) == 8  # draft keeps the block size
        assert fn(runner("DFLASH", False, has), num_draft_tokens=8) == 8
    plain = types.SimpleNamespace(spec_algorithm=Algo("DFLASH", False), is_draft_worker=False,
                                  server_args=types.SimpleNamespace(speculative_algorithm="DFLASH"))
    assert fn(plain, num_draft_tokens=8) == 8  # 0.5.23 without the overlay: no such attributes
