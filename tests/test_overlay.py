"""overlay: fetch from a local git repository made here (file:// URL), export only
the package's *.py files, ship a deterministic tarball, lay it over a real
sglang 0.5.23 copy (kernels kept) and see DDTREE appear for engine_flags."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sglang_release  # noqa: E402

from k26ops import engine_flags, overlay  # noqa: E402
from k26ops.errors import UserError  # noqa: E402

PR_REF = "refs/pull/29907/head"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path) -> tuple[Path, str]:
    """A small upstream-like repository: python/sglang with a FAKE DDTree change on a PR ref."""
    repo = tmp_path / "upstream"
    real = sglang_release.site_packages() / "sglang"
    pkg = repo / "python/sglang/srt"
    for rel in ("srt/speculative/spec_info.py", "srt/arg_groups/fields/spec.py", "version.py"):
        (repo / "python/sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(real / rel, repo / "python/sglang" / rel)
    (repo / "README.md").write_text("upstream\n")
    (pkg / "kernel.so").write_bytes(b"\x7fELF not shipped")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    # the FAKE "pull request": registers DDTREE and --speculative-ddtree-budget
    info = pkg / "speculative/spec_info.py"
    info.write_text(info.read_text().replace("    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()\n"))
    spec = pkg / "arg_groups/fields/spec.py"
    anchor = "    speculative_dflash_block_size: A["
    spec.write_text(spec.read_text().replace(
        anchor, '    speculative_ddtree_budget: A[Optional[int], "FAKE overlay: DDTree budget."] = None\n' + anchor))
    (pkg / "speculative/ddtree_worker.py").write_text("class DDTreeWorker:  # FAKE overlay\n    pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "ddtree")
    pr_commit = git(repo, "rev-parse", "HEAD")
    git(repo, "update-ref", PR_REF, pr_commit)
    git(repo, "reset", "-q", "--hard", "HEAD~1")  # main does not have it
    return repo, pr_commit


def test_fetch_export_apply(upstream, tmp_path):
    repo, pr_commit = upstream
    url = repo.as_uri()
    cache = tmp_path / "cache"
    commit = overlay.fetch(url, PR_REF, cache)
    assert commit == pr_commit
    assert overlay.fetch(url, "main", cache) == git(repo, "rev-parse", "main")

    ex = overlay.export(url, commit, tmp_path / "export", cache=cache)
    assert set(ex.files) == {"sglang/srt/speculative/spec_info.py", "sglang/srt/arg_groups/fields/spec.py",
                             "sglang/version.py", "sglang/srt/speculative/ddtree_worker.py"}
    assert not (tmp_path / "export/sglang/srt/kernel.so").exists()
    data = (tmp_path / "export/sglang/srt/speculative/ddtree_worker.py").read_bytes()
    assert ex.files["sglang/srt/speculative/ddtree_worker.py"] == hashlib.sha256(data).hexdigest()

    h1 = overlay.tarball(tmp_path / "export", tmp_path / "a.tar.gz")
    h2 = overlay.tarball(tmp_path / "export", tmp_path / "b.tar.gz")
    assert h1 == h2
    with tarfile.open(tmp_path / "a.tar.gz") as tf:
        assert "sglang/srt/speculative/ddtree_worker.py" in tf.getnames()
        assert overlay.MANIFEST in tf.getnames()

    site = sglang_release.copy_tree(tmp_path / "site")
    kernels = sorted(p.relative_to(site) for p in site.rglob("*") if p.suffix in (".so", ".cu", ".cuh"))
    before = {k: (site / k).read_bytes() for k in kernels}
    assert not engine_flags.read_flags(site).has_ddtree
    written = overlay.apply_overlay(tmp_path / "export", site)
    assert "sglang/srt/speculative/ddtree_worker.py" in written and "sglang/version.py" not in written
    assert {k: (site / k).read_bytes() for k in kernels} == before
    flags = engine_flags.read_flags(site)
    assert flags.has_ddtree and "--speculative-ddtree-budget" in flags.flags
    assert overlay.apply_overlay(tmp_path / "export", site) == []


def test_cache_is_reused_offline(upstream, tmp_path):
    repo, pr_commit = upstream
    url = repo.as_uri()
    cache = tmp_path / "cache"
    assert overlay.prepare(url, PR_REF, tmp_path / "e1", cache=cache).commit == pr_commit
    shutil.rmtree(repo)  # the source is gone: a pinned commit still resolves from the cache
    assert overlay.fetch(url, pr_commit, cache) == pr_commit
    ex = overlay.export(url, pr_commit, tmp_path / "e2", cache=cache)
    assert ex.commit == pr_commit and len(list(cache.iterdir())) == 1
    with pytest.raises(UserError, match="cannot fetch refs/pull/1/head"):
        overlay.fetch(url, "refs/pull/1/head", cache)


def test_missing_ref_and_subdir(upstream, tmp_path):
    repo, _ = upstream
    with pytest.raises(UserError, match="cannot fetch refs/heads/nope"):
        overlay.fetch(repo.as_uri(), "refs/heads/nope", tmp_path / "c")
    commit = overlay.fetch(repo.as_uri(), "main", tmp_path / "c")
    with pytest.raises(UserError, match="has no python/vllm/"):
        overlay.export(repo.as_uri(), commit, tmp_path / "e", subdir="python/vllm", cache=tmp_path / "c")
