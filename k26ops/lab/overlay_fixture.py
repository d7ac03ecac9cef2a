"""Lab fixture: a local git repository standing in for the upstream DDTree pull
request, so lab deploys exercise the real overlay path without the network.

It holds real sglang 0.5.23 files with a small, clearly marked LAB edit that
registers the DDTREE algorithm and `--speculative-ddtree-budget` (what the
engine-flag check looks for), on the ref `refs/pull/29907/head`. It has no
DDTree implementation: the lab's engine is the stand-in. Never used outside
the lab.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from k26ops import wheelhouse

PR_REF = "refs/pull/29907/head"
FILES = ("srt/speculative/spec_info.py", "srt/arg_groups/fields/spec.py", "version.py")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=k26ops-lab", "-c",
                           "user.email=lab@k26ops.invalid", "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def ensure(lab_dir: Path, sglang: str = "0.5.23") -> tuple[str, str]:
    """Create the repository once; return (file:// URL, ref)."""
    repo = lab_dir / "ddtree-overlay.git"
    if (repo / ".git").exists():
        return f"file://{repo}", PR_REF
    (wheel,) = [w for w in wheelhouse.ensure([f"sglang=={sglang}"], no_deps=True) if w.name.startswith("sglang-")]
    pkg = repo / "python/sglang"
    with zipfile.ZipFile(wheel.path) as zf:
        for rel in FILES:
            dest = pkg / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(f"sglang/{rel}"))
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"sglang {sglang} (lab base)")
    info = pkg / "srt/speculative/spec_info.py"
    info.write_text(info.read_text().replace(
        "    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()  # k26ops LAB fixture\n"))
    spec = pkg / "srt/arg_groups/fields/spec.py"
    anchor = "    speculative_dflash_block_size: A["
    spec.write_text(spec.read_text().replace(
        anchor, '    speculative_ddtree_budget: A[Optional[int], "k26ops LAB fixture: DDTree budget."] = None\n'
        + anchor))
    (pkg / "srt/speculative/ddtree_lab_fixture.py").write_text(
        '"""k26ops LAB fixture: marks a lab DDTree overlay; no DDTree code here."""\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "LAB fixture: register DDTREE (stands in for upstream PR 29907)")
    _git(repo, "update-ref", PR_REF, "HEAD")
    return f"file://{repo}", PR_REF
