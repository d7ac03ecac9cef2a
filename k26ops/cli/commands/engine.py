"""`k26ops engine pin|lock|show`: find the commit a branch or PR points at,
and make the dependency lock for a recipe's engine source.

These are the only commands that follow a moving ref or reach the package
index for resolution; each writes one reviewed file (the recipe's commit line,
the lock) and prints its diff. A deploy only reads what they wrote.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from pathlib import Path

import click
import yaml

from k26ops import config
from k26ops.cli import jsonout
from k26ops.errors import UserError
from k26ops.release import engine_source, enginelock, inputs
from k26ops.release import recipe as recipe_mod


@click.group(name="engine")
def group():
    """Pin the engine source to a commit; make its dependency lock."""


def _diff(path: Path, old: str, new: str) -> str:
    try:
        shown = Path(path).resolve().relative_to(Path.cwd())
    except ValueError:
        shown = Path(path)
    return "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), fromfile=f"a/{shown}", tofile=f"b/{shown}")
    )


def _recipe(
    name: str, source_url: str | None, check_series_base: bool = True, registry_ok: bool = False
) -> recipe_mod.Recipe:
    r = recipe_mod.load(name, check_series_base)
    if r.git is None and not registry_ok:
        raise UserError(
            f"{r.source}: the engine is a registry release (engine.sglang); pin is for git sources (engine.source)"
        )
    if r.git is None and source_url:
        raise UserError(f"--source-url: {r.source} is a registry release (engine.sglang), it has no git source")
    return recipe_mod.with_source_url(r, source_url, "--source-url") if source_url else r


def set_commit(text: str, path: Path, commit: str) -> str:
    """`text` with the YAML node engine.source.commit (and nothing else) set to `commit`;
    comments, layout and every other byte kept. A `commit:` line anywhere else (a
    description, a comment) is text, not the node, and stays as it is."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None
    node = root
    for key in ("engine", "source", "commit"):
        if not isinstance(node, yaml.MappingNode):
            node = None
            break
        node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        if node is None:
            break
    if not isinstance(node, yaml.ScalarNode) or inputs.commit_problem(node.value):
        raise UserError(f"{path}: no engine.source.commit (40 hex) to update")
    start, end = node.start_mark.index, node.end_mark.index
    quote = node.style if node.style in ("'", '"') else ('"' if commit.isdigit() else "")
    new = text[:start] + quote + commit + quote + text[end:]
    want = yaml.safe_load(text)
    want["engine"]["source"]["commit"] = commit
    if yaml.safe_load(new) != want:  # only that node changed
        raise UserError(f"{path}: cannot update engine.source.commit in place (edit it by hand)")
    recipe_mod.parse(new, path, check_series_base=False)  # still a valid recipe
    return new


def _emit(settings, data: dict, diff: str, summary: str, r: recipe_mod.Recipe | None = None) -> None:
    if settings.as_json:
        jsonout.emit({**data, "diff": diff}, indent=1, sort_keys=True)
        return
    if diff:
        click.echo(diff.rstrip("\n"))
    others = [p for p in (r.pythons if r else ()) if p != r.python]
    click.echo(
        summary
        + (
            f" (python {r.python}; engine.python also lists {', '.join(others)}: lock each with --python)"
            if others
            else ""
        )
    )


@group.command(name="pin")
@click.argument("recipe", metavar="RECIPE")
@click.option("--ref", required=True, help="Branch or PR ref to look up (e.g. refs/pull/29907/head).")
@click.option("--source-url", metavar="URL", help="Fetch from this URL instead of the recipe's (a mirror).")
@click.option("--check", is_flag=True, help="Show the change; write nothing.")
@click.pass_obj
def pin_cmd(settings, recipe, ref, source_url, check):
    """Resolve REF to a commit now and write it into the recipe (with a diff)."""
    r = _recipe(recipe, source_url, check_series_base=False)  # pinning is how a recipe moves to a new base
    why = inputs.ref_problem(ref)
    if why:
        raise UserError(f"--ref {ref!r}: not a plain ref name: {why}")
    commit = engine_source.resolve_ref(r.git.url, ref)
    if inputs.commit_problem(commit):
        raise UserError(f"{r.git.url}: {ref} resolved to {commit!r}, not a 40-hex commit")
    path = Path(r.source)
    old = path.read_text()
    new = set_commit(old, path, commit)
    diff = _diff(path, old, new)
    if diff and not check:
        path.write_text(new)
    lock_note = ""
    if diff:
        lock_note = (
            f"; next: the series {r.series} is written for the old base: make patches/<base>/series for "
            f"sglang@{commit} (re-verify each patch against that commit, `# Base:` and `Base:` lines), point "
            f"patches.series at it, and run `k26ops engine lock {path}`"
        )
    what = "unchanged" if not diff else ("would pin" if check else "pinned")
    _emit(
        settings,
        {"recipe": str(path), "ref": ref, "commit": commit, "changed": bool(diff), "written": bool(diff) and not check},
        diff,
        f"{path}: {ref} is {commit}: {what}{lock_note}",
    )


def _for_python(r: recipe_mod.Recipe, python: str | None) -> recipe_mod.Recipe:
    listed = r.pythons or (r.python,)
    if python is None:
        return r
    if python not in listed:
        raise UserError(
            f'--python {python}: {r.source} locks for python {", ".join(listed)}: add "{python}" '
            "to its engine.python (a list: one lock each) first"
        )
    return recipe_mod.for_python(r, python)


def _placed(r: recipe_mod.Recipe, out: Path | None, check: bool) -> recipe_mod.Recipe:
    """Where the lock goes: beside the recipe, or in `out` (default for a recipe shipped inside
    an installed wheel: the recipes dir, never site-packages), with a copy of the recipe
    there so that the recipe NAME finds both."""
    if out is None and not recipe_mod.shipped(r.source):
        return r
    out = Path(out) if out is not None else config.recipes_dir()[0]
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: not a directory")
    copy = out / Path(r.source).name
    text = Path(r.source).read_text()
    if copy.resolve() != Path(r.source).resolve():
        if copy.exists() and copy.read_text() != text:
            raise UserError(f"{copy} exists and differs from {r.source}: lock that one (`k26ops engine lock {copy}`)")
        if not check:
            out.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
    return replace(r, source=copy, lock_path=out / r.lock_path.name)


@group.command(name="lock")
@click.argument("recipe", metavar="RECIPE")
@click.option("--source-url", metavar="URL", help="Fetch from this URL instead of the recipe's (a mirror).")
@click.option(
    "--python",
    "python",
    metavar="X.Y",
    help="Lock for this python, one of the recipe's engine.python (default: the last listed).",
)
@click.option(
    "--out",
    metavar="DIR",
    type=click.Path(path_type=Path),
    help="Write the lock (and a copy of the recipe) into DIR, not beside the recipe. Default for a "
    "recipe shipped in an installed wheel: your recipes dir (config `recipes`, $K26OPS_RECIPES).",
)
@click.option("--check", is_flag=True, help="Show the change; write nothing.")
@click.pass_obj
def lock_cmd(settings, recipe, source_url, python, out, check):
    """Lock the engine's wheels for the hosts' python and platform (with a diff).

    A git source: build the engine wheel from the pinned commit and lock what it
    needs. A registry release: lock sglang==VERSION and, for `install: full`, its
    whole dependency closure with the recipe's pins and extras. A recipe whose
    engine.python lists several pythons has one lock each (NAME.py3.11.lock)."""
    r = _placed(_for_python(_recipe(recipe, source_url, registry_ok=True), python), out, check)
    say = (lambda m: None) if settings.as_json else (lambda m: click.echo(f"  {m}", err=True))
    if r.git is None:
        return _lock_registry(settings, recipe, r, check, say)
    g = r.git
    built = engine_source.wheel_for(r, say)
    say(f"resolving the dependencies of {built.name} for python {r.python}, manylinux x86_64")
    entries = enginelock.resolve(built.path, r.python, r.index_urls)
    declared = recipe_mod.load(recipe).git.url  # a mirror of the same commit gives the same lock
    meta = {
        "source": declared,
        "commit": g.commit,
        "subdir": g.subdir,
        "engine": f"{built.dist} {built.version}",
        "python": r.python,
        "platform": enginelock.platform_line(r.python),
    }
    text = enginelock.render(recipe, meta, entries)
    old = r.lock_path.read_text() if r.lock_path.exists() else ""
    diff = _diff(r.lock_path, old, text)
    if diff and not check:
        r.lock_path.write_text(text)
    what = "unchanged" if not diff else ("would write" if check else "written")
    _emit(
        settings,
        {
            "recipe": str(r.source),
            "lock": str(r.lock_path),
            "commit": g.commit,
            "engine_wheel": {"name": built.name, "sha256": built.sha256},
            "wheels": len(entries),
            "changed": bool(diff),
            "written": bool(diff) and not check,
        },
        diff,
        f"{r.lock_path}: {len(entries)} locked wheel(s) for {g.url} @ {g.commit[:12]} "
        f"(engine wheel {built.name}, sha256 {built.sha256[:12]}): {what}",
        r,
    )


def _lock_registry(settings, recipe: str, r: recipe_mod.Recipe, check: bool, say) -> None:
    """sglang==VERSION from the index: `install: full` locks the closure of the recipe's
    requirements (sglang, its pins with their extras); `install: no-deps` installs the
    sglang wheel alone (`pip --no-deps`), so that one wheel is the whole lock."""
    reqs = r.requirements()
    say(
        f"resolving {' '.join(reqs)}{' (no deps)' if r.no_deps else ''} for python {r.python}, "
        f"{enginelock.platform_line(r.python)}"
    )
    entries = enginelock.resolve_requirements(reqs, r.python, r.index_urls, no_deps=r.no_deps)
    text = enginelock.render(recipe, enginelock.registry_meta(r), entries)
    old = r.lock_path.read_text() if r.lock_path.exists() else ""
    diff = _diff(r.lock_path, old, text)
    if diff and not check:
        r.lock_path.write_text(text)
    what = "unchanged" if not diff else ("would write" if check else "written")
    cuda = enginelock.cuda_runtime(entries)
    _emit(
        settings,
        {
            "recipe": str(r.source),
            "lock": str(r.lock_path),
            "engine": f"sglang=={r.sglang}",
            "commit": None,
            "wheels": len(entries),
            "cuda_runtime": [{"name": n, "version": v} for n, v in cuda],
            "changed": bool(diff),
            "written": bool(diff) and not check,
        },
        diff,
        f"{r.lock_path}: {len(entries)} locked wheel(s) for sglang=={r.sglang} (install: {r.install}, "
        f"{len(cuda)} CUDA runtime wheel(s)): {what}",
        r,
    )
