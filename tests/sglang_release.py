"""The real SGLang release's sources, for tests: downloaded once from the package
index (pip download, no dependencies), unpacked into a cache, read-only use.

Tests that need to modify files copy the tree first (see `copy_tree`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("K26OPS_TEST_CACHE", Path.home() / ".cache/k26ops/test"))


def wheel(version: str = "0.5.23") -> Path:
    """The sglang wheel file for `version` (downloaded once)."""
    dest = CACHE / "wheels"
    found = sorted(dest.glob(f"sglang-{version}-*.whl")) if dest.exists() else []
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "-d", str(dest), f"sglang=={version}"], check=True)
        found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    return found[0]


def site_packages(version: str = "0.5.23") -> Path:
    """A directory holding the release's `sglang/` package as installed (read-only use)."""
    root = CACHE / f"sglang-{version}"
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
