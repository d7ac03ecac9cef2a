"""The real SGLang release's sources, for tests: downloaded once from the package
index (pip download, no dependencies), unpacked into a cache, read-only use.

Tests that need to modify files copy the tree first (see `copy_tree`), or only the
files their patch touches (`copy_files`, `patched_paths`: a 6000-file copy and its
removal cost seconds per test; `patch` and patchset write only the files a patch names).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("K26OPS_TEST_CACHE", Path.home() / ".cache/k26ops/test"))


@contextlib.contextmanager
def _locked(name: str):
    """One process at a time fills the cache (pytest -n 2 runs two)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def wheel(version: str = "0.5.23") -> Path:
    """The sglang wheel file for `version` (downloaded once)."""
    dest = CACHE / "wheels"
    found = sorted(dest.glob(f"sglang-{version}-*.whl")) if dest.exists() else []
    if not found:
        with _locked(f"wheel-{version}"):
            found = sorted(dest.glob(f"sglang-{version}-*.whl")) if dest.exists() else []
            if not found:
                dest.mkdir(parents=True, exist_ok=True)
                subprocess.run(
                    [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), f"sglang=={version}"],
                    check=True,
                )
                found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    return found[0]


def site_packages(version: str = "0.5.23") -> Path:
    """A directory holding the release's `sglang/` package as installed (read-only use)."""
    root = CACHE / f"sglang-{version}"
    if not (root / ".complete").exists():
        with _locked(f"sglang-{version}"):
            if not (root / ".complete").exists():
                shutil.rmtree(root, ignore_errors=True)
                with zipfile.ZipFile(wheel(version)) as zf:
                    zf.extractall(root)
                (root / ".complete").write_text("ok\n")
    return root


def copy_tree(dest: Path, version: str = "0.5.23") -> Path:
    """A private writable copy of the installed `sglang/` package under dest."""
    shutil.copytree(site_packages(version) / "sglang", dest / "sglang")
    return dest


def patched_paths(*patches: Path) -> list[str]:
    """The files (relative to site-packages) that unified diffs name (`+++ b/...`, -p1)."""
    out = set()
    for patch in patches:
        for line in patch.read_text().splitlines():
            if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
                out.add(line[4:].split("\t")[0].strip().split("/", 1)[1])
    return sorted(out)


def copy_files(dest: Path, paths, version: str = "0.5.23") -> Path:
    """A private writable copy of just `paths` (relative to site-packages) under dest."""
    src = site_packages(version)
    for rel in paths:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
    return dest
