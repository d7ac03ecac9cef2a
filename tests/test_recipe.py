"""recipe: the shipped recipes load, agree with the real sglang wheel's METADATA,
errors name file/line/key, and the release id follows content only."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sglang_release  # noqa: E402

from k26ops import recipe as rc  # noqa: E402
from k26ops.errors import UserError  # noqa: E402

PROD = rc.RECIPES_DIR / "k26-tp8-ddtree.yml"


def sglang_requires() -> list[str]:
    whl = sglang_release.wheel("0.5.23")
    with zipfile.ZipFile(whl) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return rc.requires_dist(zf.read(meta).decode())


def test_default_is_production():
    r = rc.load()
    assert r.name == "k26-tp8-ddtree" and r.source == PROD
    assert r.sglang == "0.5.23" and r.install == "full" and not r.no_deps
    assert r.pins == {"torch": "2.14.1", "triton": "3.8.0", "flashinfer-python": "0.7.2"}
    assert r.requirements() == ["sglang==0.5.23", "torch==2.14.1", "triton==3.8.0",
                                "flashinfer-python[cu13]==0.7.2"]
    assert r.toolkit.method == "apt" and r.toolkit.apt_package == "cuda-toolkit-13-0"
    assert r.overlay == rc.Overlay(rc.UPSTREAM_URL, rc.UPSTREAM_DDTREE_REF, "python/sglang", "*.py")
    assert r.series.is_file() and r.tags == ()
    p = r.profile
    assert (p["tp_size"], p["speculative_algorithm"], p["speculative_ddtree_budget"],
            p["speculative_dflash_block_size"], p["page_size"]) == (8, "DDTREE", 32, 8, 1)


def test_lab_recipe():
    r = rc.load("lab")
    assert r.sglang == rc.load().sglang
    assert r.no_deps and r.requirements() == ["sglang==0.5.23"]
    assert r.toolkit.method == "pip" and r.toolkit.pip_spec == "cuda-toolkit[nvcc]==13.0.*"
    assert r.overlay is None
    r2 = rc.with_overlay(r, "file:///tmp/ddtree.git", "refs/heads/ddtree")
    assert r2.overlay.url == "file:///tmp/ddtree.git" and r2.overlay.subdir == "python/sglang"


def test_pins_agree_with_real_sglang_metadata():
    reqs = sglang_requires()
    assert "torch==2.14.1" in reqs
    rc.check_requirements(rc.load(), reqs, "sglang 0.5.23")
    bad = rc.parse(PROD.read_text().replace('torch: "2.14.1"', 'torch: "2.13.0"'), PROD)
    with pytest.raises(UserError) as ei:
        rc.check_requirements(bad, reqs, "sglang 0.5.23")
    line = next(i for i, l in enumerate(PROD.read_text().splitlines(), 1) if l.strip().startswith("torch:"))
    assert f"k26-tp8-ddtree.yml:{line}: engine.pins.torch: torch==2.13.0" in str(ei.value)
    assert "torch==2.14.1" in str(ei.value)


def test_triton_matches_torch_requirement():
    # torch 2.14.1's METADATA (pip install --dry-run --report): triton~=3.8.0
    rc.check_requirements(rc.load(), ['triton~=3.8.0; platform_system == "Linux"'], "torch 2.14.1")
    with pytest.raises(UserError, match="triton~=3.8.0"):
        rc.check_requirements(rc.parse(PROD.read_text().replace('"3.8.0"', '"3.6.0"'), PROD),
                              ['triton~=3.8.0; platform_system == "Linux"'], "torch 2.14.1")


def _err(text: str) -> str:
    with pytest.raises(UserError) as ei:
        rc.parse(text, PROD)
    assert "\n" not in str(ei.value)
    return str(ei.value)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, l in enumerate(text.splitlines(), 1) if needle in l)


@pytest.mark.parametrize("old,new,key", [
    ('sglang: "0.5.23"', "sglang: 0.5", "engine.sglang"),
    ("install: full ", "install: most ", "engine.install"),
    ("method: apt ", "method: yum ", "cuda_toolkit.method"),
    ('version: "13.0"', "version: 13.0", "cuda_toolkit.version"),
    ("tp_size: 8", "tp_size: eight", "engine_profile.tp_size"),
    ("tp_size: 8", "tp_sise: 8", "engine_profile.tp_sise"),
    ("page_size: 1 ", "page_size: 16 ", "engine_profile.page_size"),
    ("series: patches/series", "series: patches/nope", "patches.series"),
    ("url: https://github.com/sgl-project/sglang.git", "url: not a url", "ddtree_overlay.url"),
])
def test_validation_names_file_line_key(old, new, key):
    text = PROD.read_text()
    assert old in text
    bad = text.replace(old, new, 1)
    msg = _err(bad)
    assert msg.startswith(f"{PROD}:{_line_of(bad, new.split(':')[0].strip() + ':')}: {key}: "), msg


def test_missing_pin_and_unknown_top_key():
    text = PROD.read_text()
    msg = _err(text.replace('    triton: "3.8.0"\n', ""))
    assert "engine.pins: install: full needs a pin for triton" in msg
    msg = _err(text + "\nfrobnicate: 1\n")
    assert f":{len(text.splitlines()) + 2}: frobnicate: unknown key" in msg
    assert "not valid YAML" in _err("name: [\n")


def test_release_id_is_content_derived():
    r = rc.load()
    patches = [("a.patch", b"one"), ("b.patch", b"two")]
    rid = rc.release_id(r, "1" * 40, patches)
    assert rid.startswith("sglang0.5.23-") and len(rid) == len("sglang0.5.23-") + 12
    assert rid == rc.release_id(rc.load(PROD), "1" * 40, dict(patches))
    assert rid != rc.release_id(r, "2" * 40, patches)  # overlay commit
    assert rid != rc.release_id(r, "1" * 40, [("a.patch", b"one"), ("b.patch", b"two!")])  # content
    assert rid != rc.release_id(r, "1" * 40, list(reversed(patches)))  # order
    other_pin = rc.parse(PROD.read_text().replace('"0.7.2"', '"0.7.3"'), PROD)
    assert rid != rc.release_id(other_pin, "1" * 40, patches)
    # engine profile changes the service, not the build
    other_profile = rc.parse(PROD.read_text().replace("cuda_graph_max_bs_decode: 16", "cuda_graph_max_bs_decode: 32"), PROD)
    assert rid == rc.release_id(other_profile, "1" * 40, patches)
    with pytest.raises(UserError, match="commit is not resolved"):
        rc.release_id(r, None, patches)
    lab = rc.load("lab")
    assert rc.release_id(lab, None, patches).startswith("sglang0.5.23-")
