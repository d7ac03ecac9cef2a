"""The control node's release-source cache: hard-linked variant trees must
never let a patch write through to the shared pristine tree; old variants
are pruned least-recently-used first."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
import sglang_release  # noqa: E402

from k26ops.release import patchset, prepcache  # noqa: E402

SERIES = Path(__file__).resolve().parent.parent.parent / "patches" / "sglang-0.5.23" / "series"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The real sglang wheel cut to the files the series patches, its version.py and its
    dist-info (what these tests read; extracting and removing all 6000 files cost ~10 s a test)."""
    import zipfile

    keep = {f.path for p in patchset.load_series(SERIES, ("diagnose",)) for f in p.files} | {"sglang/version.py"}
    real = sglang_release.wheel()
    out = tmp_path_factory.mktemp("wheel") / real.name
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename in keep or ".dist-info/" in info.filename:
                dst.writestr(info, src.read(info))
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(prepcache, "SOURCES", tmp_path / "sources")
    monkeypatch.setattr(prepcache, "VARIANTS", tmp_path / "releases")
    return tmp_path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_patching_a_linked_copy_leaves_the_pristine_tree_alone(cache, wheel):
    pristine = prepcache.pristine(wheel, _sha(wheel))
    patches = patchset.load_series(SERIES, ("diagnose",))
    touched = sorted({f.path for p in patches for f in p.files})
    before = {f: _sha(pristine / f) for f in touched}
    site = cache / "releases" / "v1" / "site-packages"
    prepcache.linked_copy(pristine, site)
    untouched = pristine / "sglang" / "version.py"
    assert os.stat(site / "sglang" / "version.py").st_ino == untouched.stat().st_ino  # really linked

    patchset.apply(site, patches, cache / "state", {"sglang": "0.5.23"})

    assert {f: _sha(site / f) for f in touched} != before  # the variant is patched...
    assert {f: _sha(pristine / f) for f in touched} == before  # ...the shared tree is not
    for f in touched:
        assert os.stat(site / f).st_ino != os.stat(pristine / f).st_ino
    patchset.revert(site, cache / "state")
    assert {f: _sha(pristine / f) for f in touched} == before


def test_pristine_is_extracted_once(cache, wheel):
    first = prepcache.pristine(wheel, _sha(wheel))
    marker = first / "k26ops-test-marker"
    marker.write_text("x")
    assert prepcache.pristine(wheel, _sha(wheel)) == first and marker.exists()


def test_prune_keeps_the_most_recently_used_variants(cache):
    root = prepcache.VARIANTS
    names = [f"rel-{i:02d}" for i in range(prepcache.KEEP_VARIANTS + 6)]
    for age, name in enumerate(names):  # rel-00 is the oldest
        (root / name).mkdir(parents=True)
        mark = root / name / prepcache.MARK
        mark.write_text("ok\n")
        os.utime(mark, (1_000_000 + age, 1_000_000 + age))
    prepcache.used(root / "rel-00")  # just used again: must survive
    (root / "unfinished").mkdir()  # being assembled now (no mark yet)
    prepcache.prune()
    left = sorted(p.name for p in root.iterdir())
    assert len(left) == prepcache.KEEP_VARIANTS
    assert "rel-00" in left and "unfinished" in left
    assert "rel-01" not in left and "rel-29" in left
