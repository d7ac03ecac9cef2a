"""Lab fixture: a local git repository standing in for a DDTree engine branch,
so lab deploys take the real git-source path (fetch a pinned commit, build the
wheel from the commit's own pyproject, install the locked dependencies with
hashes) without the network.

The repository holds the real sglang 0.5.23 Python sources (from the PyPI
wheel, without its compiled Rust extensions) under python/, a build
configuration written here (python/pyproject.toml: setuptools; dependencies cut
to two small real packages, pinned with theirs, so the lab's lock resolves in
seconds, not the GBs of CUDA wheels, and stays the same), and a clearly marked LAB edit that registers the DDTREE
algorithm and `--speculative-ddtree-budget` (what the engine-flag check and the
launch rules look for). It has no DDTree implementation: the lab's engine is
the stand-in. Commits are made with fixed names and dates, so the commit sha is
the same on every machine and `playbooks/recipes/lab.yml` pins it like a real
recipe pins upstream. Never used outside the lab.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from k26ops.release import engine_source, wheelhouse

SGLANG = "0.5.23"
BRANCH = "refs/heads/ddtree-lab"
PR_REF = "refs/pull/29907/head"  # the same commit under a PR-like ref, for `engine pin --ref`
_ENV = {
    "GIT_AUTHOR_NAME": "k26ops-lab",
    "GIT_AUTHOR_EMAIL": "lab@k26ops.invalid",
    "GIT_COMMITTER_NAME": "k26ops-lab",
    "GIT_COMMITTER_EMAIL": "lab@k26ops.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}

PYPROJECT = f'''# k26ops LAB fixture: the build configuration of the lab's engine source.
# The sources are sglang {SGLANG}'s own; the dependency list is cut to two small
# real packages (sglang needs them too) so the lab's lock is quick to resolve.
[build-system]
requires = ["setuptools>=61.0"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{SGLANG}+lab"
requires-python = ">=3.10"
dependencies = ["requests==2.34.2", "tqdm==4.70.1", "urllib3==2.8.0", "idna==3.20",
                "certifi==2026.10.19.post1", "charset-normalizer==3.5.3"]

[tool.setuptools.packages.find]
include = ["sglang*"]

[tool.setuptools.package-data]
"*" = ["*"]
'''


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_ENV}
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()


def repo_path() -> Path:
    return engine_source._cache_root() / "lab" / f"sglang-{SGLANG}-ddtree-lab"


def ensure() -> tuple[str, str]:
    """Create the repository once (shared by every lab on this machine); return
    (file:// URL, commit)."""
    repo = repo_path()
    repo.parent.mkdir(parents=True, exist_ok=True)
    with open(repo.parent / f"{repo.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (repo / ".git" / "k26ops-complete").exists():
            return repo.as_uri(), _git(repo, "rev-parse", BRANCH)
        shutil.rmtree(repo, ignore_errors=True)
        (wheel,) = [w for w in wheelhouse.ensure([f"sglang=={SGLANG}"], no_deps=True) if w.name.startswith("sglang-")]
        py = repo / "python"
        with zipfile.ZipFile(wheel.path) as zf:
            for info in zf.infolist():
                name = info.filename
                if name.endswith("/") or ".dist-info/" in name or name.endswith(".so"):
                    continue
                dest = py / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(info))
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, capture_output=True)
        (py / "pyproject.toml").write_text(PYPROJECT)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"sglang {SGLANG} sources (lab base; no compiled extensions)")
        pkg = py / "sglang"
        info = pkg / "srt/speculative/spec_info.py"
        info.write_text(
            info.read_text().replace(
                "    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()  # k26ops LAB fixture\n"
            )
        )
        spec = pkg / "srt/arg_groups/fields/spec.py"
        anchor = "    speculative_dflash_block_size: A["
        spec.write_text(
            spec.read_text().replace(
                anchor,
                '    speculative_ddtree_budget: A[Optional[int], "k26ops LAB fixture: DDTree budget."] = None\n'
                + anchor,
            )
        )
        (pkg / "srt/speculative/ddtree_lab_fixture.py").write_text(
            '"""k26ops LAB fixture: marks the lab DDTree source; no DDTree code here."""\n'
        )
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "LAB fixture: register DDTREE (stands in for a DDTree branch)")
        _git(repo, "update-ref", BRANCH, "HEAD")
        _git(repo, "update-ref", PR_REF, "HEAD")
        (repo / ".git" / "k26ops-complete").write_text("ok\n")
        return repo.as_uri(), _git(repo, "rev-parse", BRANCH)
