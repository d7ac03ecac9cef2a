"""The engine source path on the control node: a pinned commit fetched from a
real git repository (file:// URLs made here), the wheel built from the commit's
own pyproject with pip, the dependency lock made by uv's resolver (for the
recipe's python, whatever runs it: tests/release/test_enginelock.py), and the
`engine pin` / `engine lock` commands that write them with a diff."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
import sglang_release  # noqa: E402

from k26ops.errors import UserError  # noqa: E402
from k26ops.release import engine_source, enginelock  # noqa: E402
from k26ops.release import recipe as rc  # noqa: E402
from labtools import REPO
from labtools.invoke import cli
from labtools.recipes import git, recipe_for, tiny_engine


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private engine/git cache, so nothing here is served from another test's build."""
    monkeypatch.setenv("K26OPS_ENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("K26OPS_GIT_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory) -> Path:
    """A fresh engine cache given the shared tiny engine's build from an earlier run: kept
    under the test cache, keyed by the bytes of engine_source.py (a change to how k26ops
    builds builds it again), the build's record and wheel only (no git cache: each run's
    repositories are new). The pip build itself is tested every run by the outer-loop
    build tests (real_index), in a private cache."""
    cache = tmp_path_factory.mktemp("engine-cache")
    code = hashlib.sha256(Path(engine_source.__file__).read_bytes()).hexdigest()[:16]
    kept = sglang_release.CACHE / "tiny-engine" / code
    if kept.is_dir():
        shutil.copytree(kept, cache / "engine")
    yield cache
    built = [d for d in (cache / "engine").glob("*") if (d / "built.json").is_file()]
    if built and not kept.is_dir():  # best effort (two xdist workers may both get here)
        part = kept.parent.with_name(f".tiny-engine-{code}.{os.getpid()}")
        for d in built:
            shutil.copytree(d, part / d.name)
        shutil.rmtree(kept.parent, ignore_errors=True)  # an older engine_source's build
        kept.parent.mkdir(parents=True, exist_ok=True)
        try:
            part.rename(kept)
        except OSError:
            shutil.rmtree(part, ignore_errors=True)


@pytest.fixture
def built_cache(_module_cache, monkeypatch):
    """An engine/git cache shared by this module's tests whose subject is not the build
    itself: the same tiny engine (same files, same commit: labtools.recipes.git) is built once
    (a pip build, 2-7 s) for all of them, and its build kept for the next run."""
    monkeypatch.setenv("K26OPS_ENGINE_CACHE", str(_module_cache))
    monkeypatch.delenv("K26OPS_GIT_CACHE", raising=False)
    return _module_cache


# the engine the built_cache tests share
SHARED = {"version": "1.0", "deps": '"tqdm", "idna"'}


def test_fetch_builds_the_commit_not_the_branch(tmp_path, cache, real_index):
    repo, c1 = tiny_engine(tmp_path, "1.0")
    _, c2 = tiny_engine(tmp_path, "2.0")  # the branch moved on
    w = engine_source.build(repo.as_uri(), c1, "python")
    assert w.name == "tinyengine-1.0-py3-none-any.whl" and w.dist == "tinyengine" and w.version == "1.0"
    again = engine_source.build(repo.as_uri(), c1, "python")
    assert again.sha256 == w.sha256 and again.path == w.path  # built once per commit
    assert engine_source.build(repo.as_uri(), c2, "python").version == "2.0"
    assert engine_source.resolve_ref(repo.as_uri(), "refs/heads/main") == c2
    with pytest.raises(UserError, match="not a full 40-hex commit"):
        engine_source.fetch(repo.as_uri(), "main")
    # the server answered and has no such commit: said so, with what was tried and the mirror way
    with pytest.raises(UserError) as ei:
        engine_source.fetch(repo.as_uri(), "0" * 40, ref="refs/heads/main")
    msg = str(ei.value)
    # git's own words differ by version ("fatal: remote error: upload-pack: not our ref", 2.39: "fatal: git
    # upload-pack: not our ref"): its first fatal line, whatever its wording
    assert re.match(
        rf"engine source: {re.escape(repo.as_uri())} has no commit {'0' * 40} \(tried the commit by sha: "
        rf"fatal: [^;]*not our ref {'0' * 40}; refs/heads/main: fetched, the commit is not on it\): ",
        msg,
    ), msg
    assert f"engine_source_mirrors: {{{repo.as_uri()}: MIRROR_URL}}" in msg and "--source-url" in msg
    # a server this node cannot reach is not "commit not found": git's cause, not its closing advice
    gone = (tmp_path / "gone").as_uri()
    with pytest.raises(UserError) as ei:
        engine_source.fetch(gone, c1, ref="refs/pull/29907/head")
    msg = str(ei.value)
    assert msg.startswith(
        f"engine source: cannot fetch commit {c1[:12]} from {gone} (tried the commit by sha: "
        f"fatal: '{tmp_path}/gone' does not appear to be a git repository; refs/pull/29907/head: "
        "fatal: "
    ), msg
    assert "has no commit" not in msg and "--source-url MIRROR_URL" in msg and "\n" not in msg


def test_a_commit_without_the_subdir_or_with_a_missing_toolchain_is_one_line(tmp_path, cache):
    repo, c1 = tiny_engine(tmp_path, "1.0", build_requires='"setuptools>=61.0", "setuptools-rust"')
    with pytest.raises(UserError) as ei:
        engine_source.build(repo.as_uri(), c1, "nope")
    assert "has no nope/pyproject.toml" in str(ei.value) and "\n" not in str(ei.value)
    env_path = os.environ["PATH"]
    os.environ["PATH"] = "/usr/bin:/bin"  # no cargo here either way; make sure of it
    try:
        with pytest.raises(UserError) as ei:
            engine_source.build(repo.as_uri(), c1, "python")
    finally:
        os.environ["PATH"] = env_path
    msg = str(ei.value)
    assert "needs cargo" in msg and "engine.source.wheel" in msg and "\n" not in msg


def test_prebuilt_wheel_needs_its_sha256(tmp_path, built_cache):
    repo, c1 = tiny_engine(tmp_path, **SHARED)
    w = engine_source.build(repo.as_uri(), c1, "python")
    assert engine_source.prebuilt(str(w.path), None, w.sha256, tmp_path).sha256 == w.sha256
    with pytest.raises(UserError, match="has sha256"):
        engine_source.prebuilt(str(w.path), None, "0" * 64, tmp_path)
    engine_source.check_python(w, "3.12")  # py3-none-any fits every python
    cp311 = engine_source.BuiltWheel("x-1-cp311-cp311-manylinux_2_28_x86_64.whl", "0", 1, w.path, "x", "1")
    engine_source.check_python(cp311, "3.11")
    with pytest.raises(UserError, match="is for cp311, the hosts run python 3.12"):
        engine_source.check_python(cp311, "3.12")


def test_lock_resolves_the_commits_own_dependencies_with_hashes(tmp_path, built_cache):
    repo, c1 = tiny_engine(tmp_path, **SHARED)
    w = engine_source.build(repo.as_uri(), c1, "python")
    entries = enginelock.resolve(w.path, "3.11")
    names = sorted(e[0].lower() for e in entries)
    assert names == ["idna", "tqdm"] and all(len(e[2]) == 64 for e in entries)
    text = enginelock.render("r", {"commit": c1, "subdir": "python", "python": "3.11"}, entries)
    lock = enginelock.parse(text, "x.lock")
    assert lock.commit == c1 and sorted(e[0].lower() for e in lock.entries) == names
    with pytest.raises(UserError, match=r"x.lock:\d+: not a lock entry"):
        enginelock.parse(text + "junk\n", "x.lock")
    with pytest.raises(UserError, match="no `# commit:` line"):
        enginelock.parse("tqdm==1 --hash=sha256:" + "0" * 64 + "\n", "x.lock")


def test_engine_pin_and_lock_commands_write_reviewed_files(tmp_path, built_cache):
    repo, c1 = tiny_engine(tmp_path, **SHARED)
    recipe = recipe_for(tmp_path, repo.as_uri(), c1)
    env = {"K26OPS_ENGINE_CACHE": str(built_cache)}
    proc = cli("engine", "lock", str(recipe), env=env)
    assert proc.returncode == 0, proc.stderr
    lock = recipe.with_name("mine.lock")
    assert f"+# commit: {c1}" in proc.stdout and "+tqdm==" in proc.stdout and "written" in proc.stdout
    assert enginelock.load(lock).commit == c1
    again = cli("engine", "lock", str(recipe), env=env)
    assert again.returncode == 0 and "unchanged" in again.stdout and "+tqdm" not in again.stdout
    # the branch moves: pin finds the new commit, writes only the commit line, shows the diff
    _, c2 = tiny_engine(tmp_path, "2.0")
    before = recipe.read_text()
    proc = cli("engine", "pin", str(recipe), "--ref", "refs/heads/main", "--check", env=env)
    assert proc.returncode == 0 and f"+    commit: {c2}" in proc.stdout and recipe.read_text() == before
    proc = cli("--json", "engine", "pin", str(recipe), "--ref", "refs/heads/main", env=env)
    data = json.loads(proc.stdout)
    assert data["commit"] == c2 and data["written"]
    # the series was written for the old base: the recipe refuses to load until the operator
    # makes the series for the new one (the pin output says so)
    with pytest.raises(UserError, match=f"is written for sglang@{c1}"):
        rc.load(recipe)
    text = cli("engine", "pin", str(recipe), "--ref", "refs/heads/main", "--check", env=env).stdout
    assert "unchanged" in text
    (recipe.parent / "patches/series").write_text(f"# Base: sglang@{c2}\n")
    assert rc.load(recipe).git.commit == c2
    assert recipe.read_text().startswith("# my recipe\n")  # comments kept: only the sha changed
    assert [l for l in recipe.read_text().splitlines() if l not in before.splitlines()] == [f"    commit: {c2}"]
    # now the lock belongs to the old commit: refused, with the way out
    with pytest.raises(UserError) as ei:
        from k26ops.steps.release import lock_for

        lock_for(rc.load(recipe))
    assert f"the lock is for commit {c1[:12]}" in str(ei.value) and "k26ops engine lock" in str(ei.value)
    lock.unlink()
    with pytest.raises(UserError, match="no dependency lock for .* is missing.*k26ops engine lock"):
        lock_for(rc.load(recipe))
    proc = cli("engine", "pin", str(REPO / "playbooks/recipes/lab-registry.yml"), "--ref", "x")
    assert proc.returncode == 2 and "registry release" in proc.stderr and proc.stderr.count("\n") == 1


def test_the_lab_lock_is_what_the_lab_commit_resolves_to(monkeypatch):
    """The committed lab.lock is the lock command's own output for the lab fixture's commit.
    Its wheel comes from this node's engine cache, where the lab deploys take it from
    (keyed by commit, the content's hash): built once per machine, not once per run (a
    pip build of 6000 files, 15-30 s). Building is tested above on tiny engines, each in
    a private cache."""
    from k26ops.lab import engine_source_fixture

    monkeypatch.delenv("K26OPS_ENGINE_CACHE", raising=False)
    monkeypatch.delenv("K26OPS_GIT_CACHE", raising=False)
    url, commit = engine_source_fixture.ensure()
    r = rc.load("lab")
    assert commit == r.git.commit
    proc = cli("--json", "engine", "lock", "lab", "--source-url", url, "--check", timeout=300)
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and not data["changed"], data["diff"]
    assert data["engine_wheel"]["name"] == "sglang-0.5.23+lab-py3-none-any.whl"


def _setup_py_engine(tmp_path: Path, setup_py: str, pyproject: str | None = None) -> tuple[Path, str]:
    """A tiny real project whose setup.py (no [build-system] extension) declares compiled parts."""
    repo = tmp_path / "setup-src"
    py = repo / "python"
    (py / "tinyrust").mkdir(parents=True, exist_ok=True)
    (py / "tinyrust/__init__.py").write_text("")
    (py / "setup.py").write_text(setup_py)
    if pyproject:
        (py / "pyproject.toml").write_text(pyproject)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "setup.py engine")
    return repo, git(repo, "rev-parse", "HEAD")


NEEDS_RUST = """from setuptools import setup
from setuptools_rust import Binding, RustExtension

setup(name="tinyrust", version="1.0", packages=["tinyrust"],
      rust_extensions=[RustExtension("tinyrust._core", path="Cargo.toml", binding=Binding.PyO3)])
"""


def test_a_failed_build_shows_its_cause_the_tail_and_the_prebuilt_way_out(tmp_path, cache, real_index):
    """A real pip wheel of a setup.py that imports setuptools_rust (which its build
    environment lacks): the cause is the ModuleNotFoundError, not pip's closing note."""
    repo, c1 = _setup_py_engine(
        tmp_path,
        NEEDS_RUST,
        '[build-system]\nrequires = ["setuptools>=61.0"]\nbuild-backend = "setuptools.build_meta"\n',
    )
    env_path = os.environ["PATH"]
    os.environ["PATH"] = os.path.dirname(shutil.which("cargo") or "/nonexistent") + ":" + env_path
    try:
        if not shutil.which("cargo"):
            pytest.skip("no cargo on this node: the toolchain check refuses before the build (tested below)")
        with pytest.raises(UserError) as ei:
            engine_source.build(repo.as_uri(), c1, "python")
    finally:
        os.environ["PATH"] = env_path
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(
        f"engine source: building the wheel from {repo.as_uri()} @ {c1[:12]} failed: "
        "ModuleNotFoundError: No module named 'setuptools_rust' "
        "(Getting requirements to build wheel did not run successfully.)"
    )
    assert "This error originates from a subprocess" not in msg.split("; output tail:")[0]
    assert (
        "output tail: " in msg
        and "engine.source.wheel {path|url, sha256}" in msg
        and "docs/how-to/engine-source.md" in msg
    )
    log = Path(msg.split("the whole output: ")[1].split(";")[0])
    assert "ModuleNotFoundError: No module named 'setuptools_rust'" in log.read_text()
    assert "note: This error originates from a subprocess" in log.read_text()


def test_the_cause_is_the_first_error_of_the_chain():
    out = (
        "  error: subprocess-exited-with-error\n  × Building wheel for x (pyproject.toml) did not run successfully.\n"
        "  ╰─> [9 lines of output]\n      running build_rust\n"
        "      error[E0432]: unresolved import `pyo3::prelude`\n      error: could not compile `x`\n"
        "      RuntimeError: cargo failed\n      [end of output]\n"
        "  note: This error originates from a subprocess, and is likely not a problem with pip.\n"
        "  ERROR: Failed building wheel for x\n"
    )
    cause, stage, tail = engine_source.build_failure(out)
    assert cause == "RuntimeError: cargo failed" and stage.startswith("Building wheel for x")
    cause, _, _ = engine_source.build_failure(out.replace("      RuntimeError: cargo failed\n", ""))
    assert cause == "error[E0432]: unresolved import `pyo3::prelude`"


UPSTREAM_SHAPE = """import os
from setuptools import setup

try:
    from setuptools_rust import Binding, RustExtension, build_rust
except ModuleNotFoundError:
    build_rust = None


def _declared():
    return [RustExtension(target=m, path="rust/Cargo.toml", binding=Binding.PyO3) for m in os.environ.get("M", "").split()]


if build_rust is not None:
    setup(rust_extensions=_declared())
else:
    setup()
"""


@pytest.mark.parametrize(
    "text, tool",
    [
        (NEEDS_RUST, "cargo"),
        (UPSTREAM_SHAPE, "cargo"),  # sglang's shape: setuptools_rust imported guardedly, extensions from a function
        (
            'from setuptools import Extension, setup\nsetup(ext_modules=[Extension("x._c", ["x/c.c"])])\n',
            "a C compiler",
        ),
    ],
    ids=["setuptools-rust", "upstream-shape", "ext-modules"],
)
def test_setup_py_extensions_need_their_toolchain_though_build_system_does_not_say(tmp_path, cache, text, tool):
    repo, c1 = _setup_py_engine(
        tmp_path, text, '[build-system]\nrequires = ["setuptools>=61.0"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    project = repo / "python"
    assert engine_source.build_requirements(project) == ["setuptools>=61.0"]
    found = engine_source.setup_py_extensions(project)
    assert found and all(w.startswith("setup.py:") for w in found)
    only_git = tmp_path / "only-git-bin"  # neither cargo nor a C compiler on PATH
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))
    env_path = os.environ["PATH"]
    os.environ["PATH"] = str(only_git)
    try:
        assert any(m.startswith(tool + " (setup.py:") for m in engine_source.missing_tools(project))
        with pytest.raises(UserError) as ei:
            engine_source.build(repo.as_uri(), c1, "python")
    finally:
        os.environ["PATH"] = env_path
    msg = str(ei.value)
    assert f"needs {tool} (setup.py:" in msg and "engine.source.wheel" in msg and "\n" not in msg
