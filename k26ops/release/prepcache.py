"""The control node's cache of assembled release sources, kept small.

Each release variant needs its own patched sglang tree on the control node
(to apply the series and validate flags before any host is touched). A full
copy is about 130 MB, and a busy node or a test run makes dozens of variants;
unbounded, they filled a shared CI disk. So:
- each sglang wheel is extracted once (`sources/`), read-only by convention;
- a variant's tree is a hard-linked copy of it (a few MB of directory
  entries). That is safe because everything that changes files in it
  (patchset, overlay) writes a temp file and renames it over the old name,
  which replaces the link instead of writing through it;
- the least recently used variants beyond `KEEP_VARIANTS` are removed.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

ROOT = Path(os.environ.get("K26OPS_PREP_CACHE") or Path.home() / ".cache/k26ops")
VARIANTS = ROOT / "releases"
SOURCES = ROOT / "sources"
KEEP_VARIANTS = 24
KEEP_SOURCES = 3
MARK = "prepared.ok"


def pristine(wheel: Path, sha256: str) -> Path:
    """The wheel's files (sha256: its digest, as the wheelhouse recorded it),
    extracted once (atomically: temp dir, then rename)."""
    dest = SOURCES / f"{wheel.stem}-{sha256[:12]}"
    if not dest.is_dir():
        SOURCES.mkdir(parents=True, exist_ok=True)
        tmp = SOURCES / f".{dest.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # another process got there first
            shutil.rmtree(tmp, ignore_errors=True)
    os.utime(dest)
    _prune(SOURCES, KEEP_SOURCES, lambda d: d)
    return dest


def linked_copy(src: Path, dst: Path) -> None:
    """A copy of src at dst whose files are hard links (falls back to copying
    across filesystems)."""

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link)


def used(work: Path) -> None:
    """Mark a variant as just used (for least-recently-used pruning)."""
    mark = work / MARK
    if mark.exists():
        os.utime(mark)


def prune() -> None:
    _prune(VARIANTS, KEEP_VARIANTS, lambda d: d / MARK)


def _prune(parent: Path, keep: int, stamp) -> None:
    if not parent.is_dir():
        return
    entries = []
    for d in parent.iterdir():
        if d.is_dir() and not d.name.startswith("."):
            mark = stamp(d)
            try:  # an unfinished one (no mark yet) counts from when it was started
                entries.append(((mark if mark.exists() else d).stat().st_mtime, d))
            except OSError:
                continue
    for _, d in sorted(entries, reverse=True)[keep:]:
        shutil.rmtree(d, ignore_errors=True)
