"""Recipes, series and patches for the lab base, and tiny git engines built from scratch."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from labtools import REPO

LAB_RECIPE = REPO / "playbooks/recipes/lab.yml"


def lab_base() -> str:
    """The lab recipe's engine base (sglang@<the lab fixture's commit>)."""
    from k26ops.release import recipe

    return recipe.load("lab").base


def harmless_patch(note: str) -> str:
    """A patch for the lab base that adds a comment line to sglang/version.py."""
    import sglang_release

    first = (sglang_release.site_packages() / "sglang/version.py").read_text().splitlines()[0]
    return (
        f"Base: {lab_base()} (k26ops lab fixture)\n{note}\n"
        "--- a/sglang/version.py\n+++ b/sglang/version.py\n"
        f"@@ -1,1 +1,2 @@\n {first}\n+# k26ops {note}\n"
    )


def write_series(path: Path, lines: list[str]) -> Path:
    """A series file for the lab base: its `# Base:` line, the lab series' own
    active patch (by absolute path, as line 2), then `lines`."""
    from k26ops.release import recipe

    shipped = recipe.load("lab").series
    marker = shipped.parent / "lab-series-marker.patch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Base: {lab_base()}\n{marker}\n" + "".join(line + "\n" for line in lines))
    return path


def lab_recipe_copy(path: Path, series: Path | None = None) -> Path:
    """The lab recipe written elsewhere with a copy of its lock beside it (a recipe's lock
    path stays in its directory; same name and bytes: the same release), optionally
    another series."""
    import yaml

    doc = yaml.safe_load(LAB_RECIPE.read_text())
    lock = LAB_RECIPE.with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / lock.name).write_bytes(lock.read_bytes())
    doc["engine"]["lock"] = lock.name
    if series is not None:
        doc["patches"]["series"] = str(series)
    path.parent.mkdir(parents=True, exist_ok=True)
    for section, key in (("rehearsal", "model_config"), ("rehearsal", "draft_config"), ("model", "manifest")):
        rel = (doc.get(section) or {}).get(key)  # rehearsal configs and the model manifest: beside the recipe
        if rel:
            (path.parent / rel).parent.mkdir(parents=True, exist_ok=True)
            (path.parent / rel).write_bytes((LAB_RECIPE.parent / rel).read_bytes())
    path.write_text(yaml.safe_dump(doc))
    return path


def recipe_with_extra_patch(d: Path, label: str) -> Path:
    """The lab recipe plus one harmless patch (a comment line in
    sglang/version.py): a second, different release of the same engine."""
    series = d / "patches" / "series"
    series.parent.mkdir(parents=True)
    (series.parent / f"{label}.patch").write_text(harmless_patch(f"{label} patch"))
    write_series(series, [f"{label}.patch"])
    return lab_recipe_copy(d / "changed.yml", series)


def git(repo: Path, *args: str) -> str:
    """git with a fixed author and date: the same files make the same commit (a build
    cache keyed by commit then serves every test that makes that engine)."""
    env = {
        **os.environ,
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    }
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()


def tiny_engine(
    tmp_path: Path, version: str = "1.0", build_requires: str = '"setuptools>=61.0"', deps: str = '"tqdm"'
) -> tuple[Path, str]:
    """A tiny real Python project in a git repo (python/ subdir, like sglang's layout)."""
    repo = tmp_path / "engine-src"
    py = repo / "python"
    (py / "tinyengine").mkdir(parents=True, exist_ok=True)
    (py / "tinyengine/__init__.py").write_text(f'__version__ = "{version}"\n')
    (py / "pyproject.toml").write_text(
        f'[build-system]\nrequires = [{build_requires}]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "tinyengine"\nversion = "{version}"\ndependencies = [{deps}]\n'
    )
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"v{version}")
    return repo, git(repo, "rev-parse", "HEAD")


def recipe_for(tmp_path: Path, url: str, commit: str) -> Path:
    """A git-source recipe in a directory of its own (its series says its base)."""
    d = tmp_path / "recipes"
    (d / "patches").mkdir(parents=True, exist_ok=True)
    (d / "patches/series").write_text(f"# Base: sglang@{commit}\n")
    doc = yaml.safe_load((REPO / "playbooks/recipes/lab.yml").read_text())
    doc["name"] = "mine"
    doc.pop("rehearsal", None)  # its config files live beside the shipped recipes
    doc["engine"] = {
        "source": {"git": url, "commit": commit, "subdir": "python", "ref": "refs/heads/main"},
        "python": "3.11",
        "lock": "mine.lock",
    }
    doc["patches"]["series"] = str(d / "patches/series")
    text = "# my recipe\n" + yaml.safe_dump(doc, sort_keys=False)
    (d / "mine.yml").write_text(text)
    return d / "mine.yml"
