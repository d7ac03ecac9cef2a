"""A wheel, installed outside the checkout, carries and finds the top-level
playbooks/, recipes, templates/ and patches/ (they live outside the package)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
# What the build reads: pyproject.toml names README.md, the package and the data.
BUILD_INPUTS = ["pyproject.toml", "README.md", "LICENSE", "k26ops", "playbooks", "templates", "patches"]
TAG = "v9.8.7"  # a tag made in the copy only: the test needs no tag in the real repository

CHECK = textwrap.dedent("""
    import sys
    from pathlib import Path
    import k26ops
    from k26ops import resources
    from k26ops.orchestrate import playbook
    from k26ops.engine import units
    from k26ops.release import patchset, recipe
    from k26ops.diagnose import probe

    target = Path(sys.argv[1]).resolve()
    assert Path(k26ops.__file__).resolve().is_relative_to(target), k26ops.__file__
    root = resources.root()
    assert root.is_relative_to(target), root
    assert [s.name for s in playbook.load("deploy")], "deploy playbook has no steps"
    for name in ("k26-tp8-ddtree", "lab", "lab-registry", "k26-tp8-dflash-0.5.23"):
        r = recipe.load(name)
        assert r.source.resolve().is_relative_to(target), r.source
        assert r.series.resolve().is_relative_to(target), r.series
        entries = patchset.parse_series(r.series.read_text())
        assert all((r.series.parent / e.path).is_file() for e in entries), entries
        assert len(patchset.load_series(r.series, tags=["diagnose"])) == len(entries)
        if name.startswith("lab"):
            assert entries and probe.probe_patch_for(r.base).resolve().is_relative_to(target)
        if name != "k26-tp8-ddtree":  # its lock is made on a node that reaches GitHub (docs/how-to/engine-source.md)
            assert r.lock_path.resolve().is_relative_to(target) and r.lock_path.is_file(), r.lock_path
    assert "ExecStart=/bin/true" in units.render_unit({"argv": ["/bin/true"]})
    assert "CUDA_HOME=" in units.render_env({"env": {"CUDA_HOME": "/usr/local/cuda"}})
    print("ok", root)
""")


def _copy_sources(dst: Path) -> None:
    """Build from a copy: an in-tree build would write build/ and egg-info into the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "_data", "_version.py")
    for name in BUILD_INPUTS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore)
        else:
            shutil.copy2(src, dst / name)


def test_wheel_install_finds_playbooks_templates_patches(tmp_path):
    src, wheels, target, elsewhere = (tmp_path / d for d in ("src", "wheels", "target", "elsewhere"))
    for d in (src, elsewhere):
        d.mkdir()
    _copy_sources(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "K26OPS_TEMPLATES")}
    env["PIP_NO_INDEX"] = "1"  # nothing is downloaded
    git = {
        **env,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "release"], ["tag", TAG]):
        subprocess.run(["git", *cmd], cwd=src, env=git, check=True, timeout=60)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    (wheel,) = wheels.glob("k26ops-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    # Every package of the checkout is in the wheel (pyproject.toml lists them).
    for init in (REPO / "k26ops").rglob("__init__.py"):
        assert init.relative_to(REPO).as_posix() in names, init
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    run_env = {**env, "PYTHONPATH": str(target)}
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(target)],
        cwd=elsewhere,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "k26ops", "--help"],
        cwd=elsewhere,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the version is the git tag's (setuptools-scm), in the wheel's name, metadata and --version
    assert wheel.name.startswith(f"k26ops-{TAG[1:]}-"), wheel.name
    assert f"k26ops-{TAG[1:]}.dist-info/licenses/LICENSE" in names, sorted(n for n in names if "dist-info" in n)
    proc = subprocess.run(
        [sys.executable, "-m", "k26ops", "--version"],
        cwd=elsewhere,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == f"k26ops, version {TAG[1:]}", proc.stdout + proc.stderr
    # The shipped copies equal the checkout's files.
    for top in ("playbooks", "templates", "patches"):
        for f in (REPO / top).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                shipped = target / "k26ops" / "_data" / f.relative_to(REPO)
                assert shipped.is_file() and shipped.read_bytes() == f.read_bytes(), shipped
    # A shipped recipe without its lock (issue 45 item 1): installed from a wheel, the refusal points
    # at the operator's recipes dir, never at site-packages
    (target / "k26ops/_data/playbooks/recipes/lab-registry.lock").unlink()
    mine = tmp_path / "my-recipes"
    code = (
        "from k26ops.engine.profile import lock_for; from k26ops.release import recipe as r; x = r.load('lab-registry')\n"
        "print(r.shipped(x.source))\ntry:\n    lock_for(x)\nexcept Exception as e:\n    print(e)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env={**run_env, "K26OPS_RECIPES": str(mine)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    shipped, msg = proc.stdout.strip().split("\n")
    assert shipped == "True" and f"writes the recipe and its lock into your recipes dir ({mine})" in msg, proc
    assert "commit it beside" not in msg and "`k26ops engine lock lab-registry`" in msg, msg


def test_version_without_git_metadata_is_the_fallback(tmp_path):
    """A tree without git (a tarball) still builds, as pyproject.toml's fallback_version."""
    import tomllib

    from setuptools_scm import get_version

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools_scm"]
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    assert get_version(root=str(tmp_path), fallback_version=conf["fallback_version"]) == conf["fallback_version"]
