"""The DDTree source overlay: fetch a git ref once on the control node, export
the sglang package's *.py files, and lay them over an installed sglang.

Why: DDTree lives in an open upstream pull request, not in a release. Hosts
may have no internet, and N hosts must not cost N fetches, so the control node
keeps one bare cache per URL (~/.cache/k26ops/git), resolves the ref to a
commit (the release id uses the commit, never the moving ref) and ships a
deterministic tarball. Only Python sources travel: the wheel's compiled
kernels stay as installed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from k26ops.errors import UserError

CACHE = Path(os.environ.get("K26OPS_GIT_CACHE") or Path.home() / ".cache/k26ops/git")
MANIFEST = "k26ops-overlay.json"
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Export:
    url: str
    ref: str
    commit: str
    files: dict[str, str]  # path under the package parent (e.g. sglang/srt/x.py) -> sha256


def _cache_dir(url: str, cache: Path | None) -> Path:
    return Path(cache or CACHE) / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def fetch(url: str, ref: str, cache: Path | None = None, depth: int | None = 1) -> str:
    """Fetch `ref` of `url` into the bare cache (once) and return the commit sha."""
    import git  # GitPython; control node only

    d = _cache_dir(url, cache)
    try:
        if (d / "HEAD").exists():
            repo = git.Repo(d)
        else:
            d.parent.mkdir(parents=True, exist_ok=True)
            repo = git.Repo.init(d, bare=True)
            (d / "k26ops-url").write_text(url + "\n")
        if _SHA.fullmatch(ref):
            try:
                return repo.commit(ref).hexsha  # already here: no network
            except (ValueError, git.BadName):
                pass
        local = "refs/k26ops/" + hashlib.sha256(ref.encode()).hexdigest()[:16]
        args = ["--no-tags", "--force"] + ([f"--depth={depth}"] if depth else [])
        repo.git.fetch(*args, url, f"+{ref}:{local}")
        return repo.commit(local).hexsha
    except git.GitCommandError as exc:
        err = (exc.stderr or "").strip().splitlines()
        raise UserError(f"ddtree overlay: cannot fetch {ref} from {url}: {err[-1] if err else exc}") from None


def export(url: str, commit: str, dest: Path, subdir: str = "python/sglang", include: str = "*.py",
           cache: Path | None = None) -> Export:
    """Write the package's matching files at `commit` under dest/<package name>/... plus a manifest."""
    import git

    repo = git.Repo(_cache_dir(url, cache))
    try:
        tree = repo.commit(commit).tree / subdir
    except (KeyError, ValueError, git.BadName):
        raise UserError(f"ddtree overlay: {url} at {commit[:12]} has no {subdir}/") from None
    pkg = PurePosixPath(subdir).name
    dest = Path(dest)
    files: dict[str, str] = {}
    for blob in tree.traverse():
        if blob.type != "blob" or not fnmatch.fnmatch(blob.name, include):
            continue
        rel = str(PurePosixPath(pkg) / PurePosixPath(blob.path).relative_to(subdir))
        data = blob.data_stream.read()
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        files[rel] = hashlib.sha256(data).hexdigest()
    if not files:
        raise UserError(f"ddtree overlay: {url} at {commit[:12]} has no {include} files under {subdir}/")
    ex = Export(url, "", commit, dict(sorted(files.items())))
    (dest / MANIFEST).write_text(json.dumps({"url": url, "commit": commit, "files": ex.files},
                                            indent=1, sort_keys=True) + "\n")
    return ex


def tarball(src: Path, out: Path) -> str:
    """Deterministic .tar.gz of an exported dir (sorted, zero mtimes/owners); returns its sha256."""
    import gzip

    src, out = Path(src), Path(out)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for p in sorted(src.rglob("*")):
            if not p.is_file():
                continue
            data = p.read_bytes()
            info = tarfile.TarInfo(str(p.relative_to(src)))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tf.addfile(info, io.BytesIO(data))
    raw = gzip.compress(buf.getvalue(), mtime=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


def prepare(url: str, ref: str, dest: Path, subdir: str = "python/sglang", include: str = "*.py",
            cache: Path | None = None) -> Export:
    """fetch + export in one call (what the deploy step uses on the control node)."""
    commit = fetch(url, ref, cache)
    ex = export(url, commit, dest, subdir, include, cache)
    return Export(url, ref, commit, ex.files)


def apply_overlay(export_dir: Path, site_packages: Path) -> list[str]:
    """Copy the exported files over the installed package (stdlib only; runs anywhere).

    Files absent from the overlay, compiled kernels included, are left as installed."""
    export_dir, site_packages = Path(export_dir), Path(site_packages)
    manifest = json.loads((export_dir / MANIFEST).read_text())
    written = []
    for rel, sha in sorted(manifest["files"].items()):
        data = (export_dir / rel).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            raise UserError(f"ddtree overlay: {export_dir / rel} does not match its manifest")
        dst = site_packages / rel
        if dst.exists() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.k26ops-tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dst)
        written.append(rel)
    return written


def clear_cache(url: str, cache: Path | None = None) -> None:
    shutil.rmtree(_cache_dir(url, cache), ignore_errors=True)
