"""recipe: the shipped recipes load, agree with the real sglang wheel's METADATA,
errors name file/line/key, and the release id follows content only."""

from __future__ import annotations

import dataclasses
import re
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
import sglang_release  # noqa: E402

from k26ops.errors import UserError  # noqa: E402
from k26ops.release import recipe as rc  # noqa: E402

PROD = rc.RECIPES_DIR / "k26-tp8-ddtree.yml"
REG = rc.RECIPES_DIR / "k26-tp8-dflash-0.5.23.yml"
PR29907 = "93e9850e430035f8a363fd881a6a0c5436b95108"


def sglang_requires() -> list[str]:
    whl = sglang_release.wheel("0.5.23")
    with zipfile.ZipFile(whl) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return rc.requires_dist(zf.read(meta).decode())


def test_default_is_production_pinned_to_one_commit():
    r = rc.load()
    assert r.name == "k26-tp8-ddtree" and r.source == PROD
    assert r.sglang is None and r.git is not None
    assert (r.git.url, r.git.commit, r.git.subdir) == (rc.UPSTREAM_URL, PR29907, "python")
    assert r.base == f"sglang@{PR29907}" and r.requirements() == []
    assert r.lock_path == PROD.with_suffix(".lock") and r.python == "3.12"
    assert r.toolkit.method == "apt" and r.toolkit.apt_package == "cuda-toolkit-13-0"
    assert r.series == rc.resources.root() / "patches/sglang-pr29907-93e9850e4300/series"
    assert r.drafter.path == "/models/Kimi-K2.6-DFlash" and r.drafter.block_size == 8
    p = r.profile
    assert (
        p["tp_size"],
        p["speculative_algorithm"],
        p["speculative_ddtree_budget"],
        p["speculative_dflash_block_size"],
        p["page_size"],
        p["attention_backend"],
    ) == (8, "DDTREE", 32, 8, 1, "triton")
    # no floating ref is ever what a deploy uses, and no overlay of one code base onto another
    text = PROD.read_text()
    assert "overlay" not in text.split("engine:")[1].split("cuda_toolkit:")[0]


def test_lab_recipe_takes_the_same_git_path():
    from k26ops.lab import engine_source_fixture

    r = rc.load("lab")
    assert r.git is not None and r.base.startswith("sglang@")
    url, commit = engine_source_fixture.ensure()
    assert r.git.commit == commit, "the lab fixture's commit changed: update lab.yml, lab.lock and the lab series"
    assert r.toolkit.method == "pip" and r.toolkit.pip_spec == "cuda-toolkit[nvcc]==13.0.*"
    r2 = rc.with_source_url(r, url)
    assert r2.git.url == url and r2.git.commit == r.git.commit and r2.base == r.base
    reg = rc.load("lab-registry")
    assert reg.no_deps and reg.requirements() == ["sglang==0.5.23"] and reg.base == "sglang==0.5.23"
    with pytest.raises(UserError, match="registry release"):
        rc.with_source_url(reg, url)


def test_registry_pins_agree_with_real_sglang_metadata():
    reqs = sglang_requires()
    assert "torch==2.14.1" in reqs
    r = rc.load(REG)
    assert r.requirements() == ["sglang==0.5.23", "torch==2.14.1", "triton==3.8.0", "flashinfer-python[cu13]==0.7.2"]
    rc.check_requirements(r, reqs, "sglang 0.5.23")
    bad = rc.parse(REG.read_text().replace('torch: "2.14.1"', 'torch: "2.13.0"'), REG)
    with pytest.raises(UserError) as ei:
        rc.check_requirements(bad, reqs, "sglang 0.5.23")
    line = next(i for i, l in enumerate(REG.read_text().splitlines(), 1) if l.strip().startswith("torch:"))
    assert f"k26-tp8-dflash-0.5.23.yml:{line}: engine.pins.torch: torch==2.13.0" in str(ei.value)
    assert "torch==2.14.1" in str(ei.value)


def test_triton_matches_torch_requirement():
    # torch 2.14.1's METADATA (pip install --dry-run --report): triton~=3.8.0
    rc.check_requirements(rc.load(REG), ['triton~=3.8.0; platform_system == "Linux"'], "torch 2.14.1")
    with pytest.raises(UserError, match="triton~=3.8.0"):
        rc.check_requirements(
            rc.parse(REG.read_text().replace('"3.8.0"', '"3.6.0"'), REG),
            ['triton~=3.8.0; platform_system == "Linux"'],
            "torch 2.14.1",
        )


def _err(text: str, path=PROD) -> str:
    with pytest.raises(UserError) as ei:
        rc.parse(text, path)
    assert "\n" not in str(ei.value)
    return str(ei.value)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, l in enumerate(text.splitlines(), 1) if needle in l)


@pytest.mark.parametrize(
    "old,new,key",
    [
        (f"commit: {PR29907}", "commit: refs/pull/29907/head", "engine.source.commit"),
        (f"commit: {PR29907}", f"commit: {PR29907[:12]}", "engine.source.commit"),
        ("git: https://github.com/sgl-project/sglang.git", "git: not a url", "engine.source.git"),
        ('python: "3.12"', "python: 3", "engine.python"),
        ("method: apt ", "method: yum ", "cuda_toolkit.method"),
        ('version: "13.0"', "version: 13.0", "cuda_toolkit.version"),
        ("tp_size: 8", "tp_size: eight", "engine_profile.tp_size"),
        ("tp_size: 8", "tp_sise: 8", "engine_profile.tp_sise"),
        ("page_size: 1 ", "page_size: 16 ", "engine_profile.page_size"),
        ("series: patches/sglang-pr29907-93e9850e4300/series", "series: patches/nope", "patches.series"),
        ("  block_size: 8\n", "  block_size: eight\n", "drafter.block_size"),
    ],
)
def test_validation_names_file_line_key(old, new, key):
    text = PROD.read_text()
    assert old in text
    bad = text.replace(old, new, 1)
    msg = _err(bad)
    assert msg.startswith(f"{PROD}:{_line_of(bad, new.strip())}: {key}: "), msg


def test_series_of_another_base_is_refused_at_load():
    text = PROD.read_text().replace("patches/sglang-pr29907-93e9850e4300/series", "patches/sglang-0.5.23/series")
    msg = _err(text)
    assert "patches.series" in msg and "written for sglang==0.5.23" in msg and f"sglang@{PR29907}" in msg


def test_registry_and_git_sources_are_exclusive_and_git_takes_no_pins():
    text = PROD.read_text()
    assert "give exactly one of" in _err(text.replace("engine:\n", 'engine:\n  sglang: "0.5.23"\n', 1))
    msg = _err(text.replace('  python: "3.12"', '  python: "3.12"\n  pins: {torch: "2.14.1"}', 1))
    assert "engine.pins" in msg and "the commit's own pyproject" in msg
    reg = REG.read_text()
    assert "install: full needs a pin for triton" in _err(reg.replace('    triton: "3.8.0"\n', ""), REG)
    msg = _err(text + "\nfrobnicate: 1\n")
    assert f":{len(text.splitlines()) + 2}: frobnicate: unknown key" in msg
    assert "not valid YAML" in _err("name: [\n")
    msg = _err(text.replace("drafter:\n", "drafter:\n  repo: SubSir/Kimi-K2.6-DFlash-tmp-long\n", 1))
    assert "drafter.revision" in msg and "40-hex" in msg


def test_a_recipe_is_parsed_once_per_process_and_again_when_it_or_its_series_changes(tmp_path, monkeypatch):
    """A deploy asks for a host's recipe ~7 times and 8 hosts ask at once: one parse serves them
    all (the same object), but an edited recipe or series file is read afresh."""
    lab = rc.load("lab")
    series = tmp_path / "series"
    series.write_text(lab.series.read_text())
    path = tmp_path / "lab.yml"
    text = rc.resolve("lab").read_text()
    assert f"series: {lab.series.relative_to(rc.resources.root())}" in text
    path.write_text(text.replace(f"series: {lab.series.relative_to(rc.resources.root())}", f"series: {series}", 1))
    (tmp_path / "lab.lock").write_text("")
    parses = []
    real = rc.parse
    monkeypatch.setattr(rc, "parse", lambda *a, **k: parses.append(a[1]) or real(*a, **k))
    first = rc.load(path)
    assert rc.load(path) is first and rc.load(str(path)) is first and len(parses) == 1
    path.write_text(path.read_text().replace("tp_size: 8", "tp_size: 4"))
    assert rc.load(path).profile["tp_size"] == 4 and len(parses) == 2
    series.write_text(series.read_text().replace("# Base:", "# Base: sglang==0.0.1\n# was:", 1))
    with pytest.raises(UserError, match="patches.series"):
        rc.load(path)


def test_release_id_is_content_derived():
    r = rc.load()
    patches = [("a.patch", b"one"), ("b.patch", b"two")]
    rid = rc.release_id(r, "1" * 64, patches)
    assert rid.startswith(f"sglang-{PR29907[:12]}-") and len(rid) == len(f"sglang-{PR29907[:12]}-") + 12
    assert rid == rc.release_id(rc.load(PROD), "1" * 64, dict(patches))
    assert rid != rc.release_id(r, "2" * 64, patches)  # the lock
    assert rid != rc.release_id(r, "1" * 64, [("a.patch", b"one"), ("b.patch", b"two!")])  # content
    assert rid != rc.release_id(r, "1" * 64, list(reversed(patches)))  # order
    other = dataclasses.replace(r, git=dataclasses.replace(r.git, commit="a" * 40))
    assert rid != rc.release_id(other, "1" * 64, patches)  # the commit
    # the URL is where the commit is fetched from, not what it is: a mirror builds the same release
    assert rid == rc.release_id(rc.with_source_url(r, "file:///srv/mirror/sglang.git"), "1" * 64, patches)
    # engine profile changes the service, not the build
    other_profile = rc.parse(
        PROD.read_text().replace("cuda_graph_max_bs_decode: 16", "cuda_graph_max_bs_decode: 32"), PROD
    )
    assert rid == rc.release_id(other_profile, "1" * 64, patches)
    with pytest.raises(UserError, match="lock is not loaded"):
        rc.release_id(r, None, patches)
    reg = rc.load(REG)
    rrid = rc.release_id(reg, "3" * 64, patches)
    assert rrid.startswith("sglang0.5.23-")
    assert rrid != rc.release_id(rc.parse(REG.read_text().replace('"0.7.2"', '"0.7.3"'), REG), "3" * 64, patches)
    assert rrid != rc.release_id(reg, "4" * 64, patches)  # its lock: registry releases are locked too
    with pytest.raises(UserError, match="lock is not loaded"):
        rc.release_id(reg, None, patches)


@pytest.mark.parametrize(
    "pin, requirement, ok",
    [
        (
            "2.9.0rc1",
            "torch>=2.9.1",
            False,
        ),  # a pre-release comes before its release (the hand-written subset said yes)
        ("2.9.0rc1", "torch>=2.8", True),  # an explicit pin may be a pre-release
        ("2.14.1", "torch==2.14.*", True),
        ("2.14.1", "torch!=2.14.*", False),
        ("2.14.1", "torch (>=2.14,<2.15)", True),  # the old parenthesised Requires-Dist form
        ("2.14.1.post1", "torch==2.14.1", False),
        ("2.14.1+cu130", "torch==2.14.1", True),  # a local version matches a specifier without one
        ("2.14.1", "torch~=2.13.0", False),
    ],
)
def test_pins_are_judged_as_pip_judges_pep_440(pin, requirement, ok):
    recipe = rc.parse(REG.read_text().replace('torch: "2.14.1"', f'torch: "{pin}"'), REG)
    if ok:
        rc.check_requirements(recipe, [requirement], "sglang 0.5.23")
    else:
        with pytest.raises(UserError, match=rf"torch=={re.escape(pin)} does not satisfy"):
            rc.check_requirements(recipe, [requirement], "sglang 0.5.23")
