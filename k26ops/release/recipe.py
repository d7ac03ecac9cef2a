"""The engine recipe: the engine source (a registry release, or a git URL
pinned to one commit with its dependency lock), CUDA toolkit, patch series,
drafter, engine profile defaults; and the release id derived from its content.

Why a separate, validated file: hosts built from the same recipe, overlay commit
and patch contents must be byte-for-byte the same release (same id, nothing
rebuilt), and a typo must fail before any host is touched, as one line naming
the file, line and key.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from k26ops import config, resources
from k26ops.engine import profile_table
from k26ops.errors import UserError
from k26ops.inventory import path_problem
from k26ops.release import inputs, launch_rules, patchset

RECIPES_DIR = resources.path("playbooks", "recipes")
DEFAULT_RECIPE = "k26-tp8-ddtree"
UPSTREAM_URL = "https://github.com/sgl-project/sglang.git"
_SHA = re.compile(r"[0-9a-f]{40}")
_PY = re.compile(r"3\.\d+")

_VERSION = re.compile(r"\d+(\.\d+)*([.+-]?[A-Za-z0-9]+)*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GPU_PINS = ("torch", "triton", "flashinfer-python")
_TOP = {"name", "description", "engine", "cuda_toolkit", "patches", "drafter", "engine_profile", "rehearsal", "model"}
# engine_profile keys and their checks: the profile table's (k26ops.engine.profile_table)
PROFILE_INT = profile_table.recipe_int_minimums()
PROFILE_OTHER = profile_table.recipe_keys() - set(PROFILE_INT)


@dataclass(frozen=True)
class Toolkit:
    method: str  # apt | pip
    version: str  # major.minor, e.g. "13.0"
    min_driver: int

    @property
    def pip_spec(self) -> str:
        return f"cuda-toolkit[nvcc]=={self.version}.*"

    @property
    def apt_package(self) -> str:
        return "cuda-toolkit-" + self.version.replace(".", "-")


@dataclass(frozen=True)
class GitSource:
    """The engine built from one commit: its Python, compiled parts and dependency pins."""

    url: str
    commit: str  # full 40-hex: a deploy never follows a moving ref
    subdir: str = "python"  # where the commit's pyproject.toml is
    ref: str | None = None  # only where `engine pin` looks, and a fetch hint
    wheel_path: str | None = None  # prebuilt wheel (when this node cannot build it) ...
    wheel_url: str | None = None
    wheel_sha256: str | None = None  # ... accepted only with its sha256


@dataclass(frozen=True)
class Drafter:
    """The speculative drafter (DFlash for K2.6): where it is on the host, where it came from."""

    path: str | None
    block_size: int | None
    repo: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class Model:
    """`model:` of a recipe: which weights the engine serves and their manifest (the
    sha256 and size of every file, k26ops/weights/manifest.py), kept beside the recipe."""

    name: str
    manifest: Path
    source: str | None = None  # where `k26ops model sync` downloads it once per site (hf://, https://, HOST:PATH)


@dataclass(frozen=True)
class Rehearsal:
    """`rehearsal:` of a recipe (k26ops rehearse): the model and drafter configs
    to use where the host has none (files beside the recipe, never weights),
    the defaults for layers and memory fraction, and the real load time a
    caught crash saves."""

    model_config: Path | None = None
    draft_config: Path | None = None
    layers: int | None = None
    mem_fraction: float | None = None
    tp_size: int | None = None
    expected_load_s: float | None = None
    draft_dummy_flag: bool = True


@dataclass(frozen=True)
class Recipe:
    name: str
    source: Path
    sglang: str | None  # registry version; None for a git source
    install: str  # full | no-deps
    pins: dict[str, str]
    extras: dict[str, list[str]]
    toolkit: Toolkit
    git: GitSource | None
    series: Path
    tags: tuple[str, ...]
    profile: dict[str, Any] = field(default_factory=dict)
    lock_path: Path | None = None  # the engine's lock beside the recipe (engine.lock, default <stem>.lock)
    python: str = "3.11"  # the hosts' python this recipe is read for (a lock is for one)
    pythons: tuple[str, ...] = ()  # every python the recipe is locked for (engine.python: a list)
    index_urls: tuple[str, ...] = ()
    drafter: Drafter | None = None
    rehearsal: Rehearsal | None = None
    model: Model | None = None

    @property
    def base(self) -> str:
        """What the patch series is written against: `sglang==0.5.23` or `sglang@<commit>`."""
        return f"sglang@{self.git.commit}" if self.git else f"sglang=={self.sglang}"

    @property
    def base_short(self) -> str:
        return f"sglang@{self.git.commit[:12]}" if self.git else f"sglang=={self.sglang}"

    def requirements(self) -> list[str]:
        """Registry sources: pip requirement strings for the release venv (see `no_deps`)."""
        if self.git:
            return []
        out = [f"sglang=={self.sglang}"]
        if self.install == "full":
            for pkg, ver in self.pins.items():
                ex = self.extras.get(pkg)
                out.append(f"{pkg}[{','.join(ex)}]=={ver}" if ex else f"{pkg}=={ver}")
        return out

    @property
    def no_deps(self) -> bool:
        return self.install == "no-deps"


def _marks(node, path=(), out=None) -> dict[tuple, int]:
    """Line number (1-based) of each mapping key / sequence item, by key path."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = path + (str(k.value),)
            out[p] = k.start_mark.line + 1
            _marks(v, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[path + (i,)] = v.start_mark.line + 1
            _marks(v, path + (i,), out)
    return out


def _compose_and_load(text: str) -> tuple:
    """(node, data) from one parse (the node gives each key's line), by libyaml where
    PyYAML has it (a recipe parsed ~10x faster: every deploy, check and test loads
    them). Text libyaml refuses is parsed again by the Python parser, whose error is
    the one shown, as before."""
    for loader in (getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader):
        ld = loader(text)
        try:
            node = ld.get_single_node()
            return node, (ld.construct_document(node) if node is not None else None)
        except yaml.YAMLError:
            if loader is yaml.SafeLoader:
                raise
        finally:
            ld.dispose()
    raise AssertionError("unreachable")


class _Ctx:
    def __init__(self, path: Path, marks: dict):
        self.path, self.marks = path, marks

    def err(self, key: tuple, msg: str) -> UserError:
        line = None
        for n in range(len(key), 0, -1):
            if key[:n] in self.marks:
                line = self.marks[key[:n]]
                break
        dotted = ".".join(str(k) for k in key) or "(top)"
        return UserError(f"{self.path}:{line or 1}: {dotted}: {msg}")

    def mapping(self, data, key: tuple, allowed: set | None = None, required=()) -> dict:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise self.err(key, f"must be a mapping, got {type(data).__name__}")
        for k in data:
            if allowed is not None and k not in allowed:
                raise self.err(key + (k,), f"unknown key (known: {', '.join(sorted(allowed))})")
        for k in required:
            if data.get(k) in (None, ""):
                raise self.err(key + (k,) if k in data else key, f"missing required key {k!r}")
        return data

    def version(self, value, key: tuple) -> str:
        if not isinstance(value, str) or not _VERSION.fullmatch(value):
            raise self.err(key, f'must be a quoted version string like "0.5.23", got {value!r}')
        return value

    def choice(self, value, key: tuple, choices) -> str:
        if value not in choices:
            raise self.err(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value


def _find_repo_root(path: Path) -> Path:
    for p in path.resolve().parents:
        if (p / "patches").is_dir() or (p / "pyproject.toml").exists():
            return p
    return resources.root()  # a recipe outside any tree: the shipped patches


def resolve(name_or_path: str | Path | None = None) -> Path:
    """A recipe name or a path; default: the production recipe. A name is the operator's
    recipe (<recipes dir>/NAME.yml: config `recipes`, $K26OPS_RECIPES) where there is one,
    else the shipped one (playbooks/recipes/NAME.yml)."""
    p = Path(name_or_path or DEFAULT_RECIPE)
    if p.suffix in (".yml", ".yaml") or p.exists():
        return p
    mine = config.recipes_dir()[0] / f"{p}.yml"
    return mine if mine.is_file() else RECIPES_DIR / f"{p}.yml"


def shipped(path: Path) -> bool:
    """Is this recipe file one installed inside the package (a wheel install's site-packages)?
    Nobody writes there: `engine lock` puts its lock in the recipes dir instead."""
    return resources.installed() and inputs.is_inside(Path(path), RECIPES_DIR)


# Recipes already parsed in this process: (path, text, check_series_base) -> (series text, Recipe).
# A deploy asks for its recipe about 7 times per host (profile, preflight, release, engine);
# each parse holds the GIL (and, where libyaml is missing, is pure-Python YAML), so 8 hosts
# parsing 56 times serialised the fan-out. Keyed by the file's text (read every time, and the
# series file's compared), so an edited recipe or series is parsed again; Recipe is frozen.
_PARSED: dict[tuple, tuple[str | None, Recipe]] = {}
_PARSING = threading.Lock()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def load(name_or_path: str | Path | None = None, check_series_base: bool = True) -> Recipe:
    path = resolve(name_or_path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read recipe: {exc.strerror}") from None
    key = (str(path.absolute()), text, check_series_base)
    with _PARSING:  # the hosts' threads ask at the same moment: one parses, the others wait for it
        hit = _PARSED.get(key)
        if hit is not None and hit[0] == _read(hit[1].series):
            return hit[1]
        r = parse(text, path, check_series_base)
        _PARSED[key] = (_read(r.series), r)
        return r


def parse(text: str, path: Path | str = "<recipe>", check_series_base: bool = True) -> Recipe:
    """Validate recipe YAML; every error is one line with file, line and key."""
    path = Path(path)
    try:
        node, data = _compose_and_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UserError(
            f"{path}:{mark.line + 1 if mark else 1}: not valid YAML: {getattr(exc, 'problem', None) or exc}"
        ) from None
    c = _Ctx(path, _marks(node) if node is not None else {})
    top = c.mapping(data, (), _TOP, required=("name", "engine", "cuda_toolkit"))
    name = top["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise c.err(("name",), f"must be a simple name, got {name!r}")

    eng = c.mapping(
        top["engine"], ("engine",), {"sglang", "install", "pins", "extras", "source", "lock", "python", "index_urls"}
    )
    git = None
    if (eng.get("sglang") is None) == (eng.get("source") is None):
        raise c.err(
            ("engine",),
            "give exactly one of sglang: VERSION (a registry release) "
            "or source: {git: URL, commit: SHA} (a git commit)",
        )
    sglang = c.version(eng["sglang"], ("engine", "sglang")) if eng.get("sglang") is not None else None
    install = c.choice(eng.get("install", "full"), ("engine", "install"), ("full", "no-deps"))
    pins_raw = c.mapping(eng.get("pins"), ("engine", "pins"))
    pins = {}
    for pkg, ver in pins_raw.items():
        if not isinstance(pkg, str) or not _NAME.fullmatch(pkg):
            raise c.err(("engine", "pins", pkg), "not a package name")
        pins[pkg] = c.version(ver, ("engine", "pins", pkg))
    if install == "full" and sglang is not None:
        for pkg in _GPU_PINS:
            if pkg not in pins:
                raise c.err(("engine", "pins"), f"install: full needs a pin for {pkg}")
    extras = {}
    for pkg, ex in c.mapping(eng.get("extras"), ("engine", "extras")).items():
        if pkg not in pins:
            raise c.err(("engine", "extras", pkg), "extras for a package that is not pinned")
        if not isinstance(ex, list) or not all(isinstance(e, str) and _NAME.fullmatch(e) for e in ex):
            raise c.err(("engine", "extras", pkg), "must be a list of extra names")
        extras[pkg] = list(ex)
    raw_py = eng.get("python", "3.11")
    pythons = tuple(str(v) for v in raw_py) if isinstance(raw_py, list) else (str(raw_py),)
    if not pythons or not all(
        isinstance(v, str) and _PY.fullmatch(v) for v in (raw_py if isinstance(raw_py, list) else [raw_py])
    ):
        raise c.err(
            ("engine", "python"),
            f'must be a quoted python version like "3.12" or a list of them (one lock each), got {raw_py!r}',
        )
    if len(set(pythons)) != len(pythons):
        raise c.err(("engine", "python"), f"lists a python twice: {raw_py!r}")
    python = pythons[-1]
    index_urls = eng.get("index_urls") or []
    if not isinstance(index_urls, list) or not all(
        isinstance(u, str) and re.match(r"https?://\S+$", u) for u in index_urls
    ):
        raise c.err(("engine", "index_urls"), "must be a list of http(s) index URLs")
    lock_path = None
    if eng.get("source") is not None:
        src = c.mapping(
            eng["source"], ("engine", "source"), {"git", "commit", "subdir", "ref", "wheel"}, required=("git", "commit")
        )
        if pins or extras or "install" in eng:
            raise c.err(
                ("engine", "pins" if pins else "install"),
                "a git source takes its dependency pins from "
                "the commit's own pyproject (recorded in the lock), not from the recipe",
            )
        url = src["git"]
        why = inputs.git_url_problem(url)
        if why:
            raise c.err(("engine", "source", "git"), f"not a git URL: {url!r}: {why}")
        commit = src["commit"]
        if not isinstance(commit, str) or not _SHA.fullmatch(commit):
            raise c.err(
                ("engine", "source", "commit"),
                f"must be a full 40-hex commit, got {commit!r} (a deploy "
                "never follows a branch or PR; find the commit with `k26ops engine pin RECIPE --ref REF`)",
            )
        subdir = src.get("subdir", "python")
        ref = src.get("ref")
        if not isinstance(subdir, str) or not re.fullmatch(r"[\w./-]+", subdir):
            raise c.err(("engine", "source", "subdir"), f"must be a plain path inside the commit, got {subdir!r}")
        why = inputs.inside_problem(subdir, "subdir")  # a directory of the archived commit, nothing else
        if why:
            raise c.err(("engine", "source", "subdir"), f"{subdir!r}: {why}")
        why = inputs.ref_problem(ref) if ref is not None else None
        if why:
            raise c.err(("engine", "source", "ref"), f"{ref!r}: {why}")
        wp = wu = ws = None
        if src.get("wheel") is not None:
            wh = c.mapping(src["wheel"], ("engine", "source", "wheel"), {"path", "url", "sha256"}, required=("sha256",))
            wp, wu, ws = wh.get("path"), wh.get("url"), wh["sha256"]
            if (wp is None) == (wu is None):
                raise c.err(("engine", "source", "wheel"), "give exactly one of path or url")
            if wu is not None and not (isinstance(wu, str) and re.fullmatch(r"https?://\S+", wu)):
                raise c.err(("engine", "source", "wheel", "url"), f"must be an http(s) URL, got {wu!r}")
            if not isinstance(ws, str) or not re.fullmatch(r"[0-9a-f]{64}", ws):
                raise c.err(("engine", "source", "wheel", "sha256"), "must be the wheel's 64-hex sha256")
        git = GitSource(url, commit, subdir, ref, wp, wu, ws)
    lock_rel = eng.get("lock", f"{path.stem}.lock")  # registry releases are locked too
    if not isinstance(lock_rel, str) or not lock_rel.strip():
        raise c.err(("engine", "lock"), "must be a file name or path")
    # `engine lock` writes this file: it stays beside the recipe (no absolute path, no `..`, no
    # symlink out of the recipe's directory)
    why = inputs.inside_problem(lock_rel, "the lock path")
    lock_path = path.parent / lock_rel
    if len(pythons) > 1:  # one lock per python: <stem>.py3.11.lock
        lock_path = lock_file_for(lock_path, python)
    if why is None and not inputs.is_inside(lock_path, path.parent):
        why = "the lock path leaves the recipe's directory (through a symlink)"
    if why:
        raise c.err(("engine", "lock"), f"{lock_rel!r}: {why}")

    tk = c.mapping(
        top["cuda_toolkit"], ("cuda_toolkit",), {"method", "version", "min_driver"}, required=("method", "version")
    )
    method = c.choice(tk["method"], ("cuda_toolkit", "method"), ("apt", "pip"))
    tver = tk["version"]
    if not isinstance(tver, str) or not re.fullmatch(r"\d+\.\d+", tver):
        raise c.err(("cuda_toolkit", "version"), f'must be a quoted major.minor like "13.0", got {tver!r}')
    min_driver = tk.get("min_driver", 580)
    if isinstance(min_driver, bool) or not isinstance(min_driver, int) or min_driver < 1:
        raise c.err(("cuda_toolkit", "min_driver"), f"must be a driver major number, got {min_driver!r}")
    toolkit = Toolkit(method, tver, min_driver)

    pt = c.mapping(top.get("patches"), ("patches",), {"series", "tags"})
    series_rel = pt.get("series", "patches/series")
    if not isinstance(series_rel, str):
        raise c.err(("patches", "series"), "must be a path")
    series = (_find_repo_root(path) / series_rel) if not Path(series_rel).is_absolute() else Path(series_rel)
    if not series.is_file():
        raise c.err(("patches", "series"), f"no such file: {series}")
    declared = patchset.series_base(series.read_text(errors="replace"))
    want_base = f"sglang@{git.commit}" if git else f"sglang=={sglang}"
    if declared is None:
        raise c.err(
            ("patches", "series"), f"{series} does not say which base it is for: add a `# Base: {want_base}` line"
        )
    if declared[1] != want_base and check_series_base:
        raise c.err(
            ("patches", "series"),
            f"{series}:{declared[0]} is written for {declared[1]}, the engine "
            f"source is {want_base}: use the series for this base (patches/<base>/series)",
        )
    tags = pt.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise c.err(("patches", "tags"), "must be a list of tag names")

    profile = dict(c.mapping(top.get("engine_profile"), ("engine_profile",), set(PROFILE_INT) | PROFILE_OTHER))
    for k, lo in PROFILE_INT.items():
        v = profile.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise c.err(("engine_profile", k), f"must be an integer >= {lo}, got {v!r}")
    for key, bad in launch_rules.profile_violations(profile):  # the cross-field rules' one home
        raise c.err(("engine_profile", key), f"{bad.detail}; fix: {bad.rule.fix}")
    drafter = None
    if top.get("drafter") is not None:
        dr = c.mapping(top["drafter"], ("drafter",), {"path", "block_size", "repo", "revision"})
        if dr.get("path") is not None:
            why = path_problem(dr["path"])
            if why:
                raise c.err(("drafter", "path"), why)
        bs = dr.get("block_size")
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
            raise c.err(("drafter", "block_size"), f"must be an integer >= 1, got {bs!r}")
        rev = dr.get("revision")
        if dr.get("repo") is not None and not (isinstance(rev, str) and _SHA.fullmatch(rev)):
            raise c.err(
                ("drafter", "revision"),
                "a drafter from a hub repo needs its full 40-hex revision (a branch name moves)",
            )
        pbs = profile.get("speculative_dflash_block_size")
        if bs is not None and pbs is not None and bs != pbs:
            raise c.err(
                ("drafter", "block_size"), f"{bs} differs from engine_profile speculative_dflash_block_size {pbs}"
            )
        drafter = Drafter(dr.get("path"), bs, dr.get("repo"), rev)
    return Recipe(
        name=name,
        source=path,
        sglang=sglang,
        install=install,
        pins=pins,
        extras=extras,
        toolkit=toolkit,
        git=git,
        series=series,
        tags=tuple(tags),
        profile=profile,
        lock_path=lock_path,
        python=python,
        pythons=pythons,
        index_urls=tuple(index_urls),
        drafter=drafter,
        rehearsal=_rehearsal(c, top.get("rehearsal"), path),
        model=_model(c, top.get("model"), path),
    )


def _model(c: "_Ctx", node, path: Path) -> Model | None:
    if node is None:
        return None
    m = c.mapping(node, ("model",), {"name", "manifest", "source"}, required=("name", "manifest"))
    if not isinstance(m["name"], str):
        raise c.err(("model", "name"), f"must be a string, got {m['name']!r}")
    rel = m["manifest"]
    why = inputs.inside_problem(rel, "the manifest path") if isinstance(rel, str) else "must be a file name"
    if why is None and not inputs.is_inside(path.parent / rel, path.parent):
        why = "the manifest path leaves the recipe's directory (through a symlink)"
    if why:
        raise c.err(("model", "manifest"), f"{rel!r}: {why}")
    src = m.get("source")
    if src is not None and not (isinstance(src, str) and re.fullmatch(r"(hf://|https?://|[\w.-]+:/)\S+", src)):
        raise c.err(("model", "source"), f"must be hf://ORG/REPO@REVISION, an http(s) URL or HOST:/PATH, got {src!r}")
    return Model(m["name"], path.parent / rel, src)


def _rehearsal(c: "_Ctx", node, path: Path) -> Rehearsal | None:
    if node is None:
        return None
    rh = c.mapping(
        node,
        ("rehearsal",),
        {"model_config", "draft_config", "layers", "mem_fraction", "tp_size", "expected_load_s", "draft_dummy_flag"},
    )
    files = {}
    for key in ("model_config", "draft_config"):
        rel = rh.get(key)
        if rel is None:
            continue
        if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise c.err(("rehearsal", key), f"must be a path inside the recipe's directory, got {rel!r}")
        # read (and its absence reported, one line) only by `k26ops rehearse`: a recipe copied
        # into a baseline without its model configs must still load for a rollback
        files[key] = path.parent / rel
    for key, lo in (("layers", 1), ("tp_size", 1)):
        v = rh.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise c.err(("rehearsal", key), f"must be an integer >= {lo}, got {v!r}")
    mf = rh.get("mem_fraction")
    if mf is not None and (isinstance(mf, bool) or not isinstance(mf, (int, float)) or not 0 < mf < 1):
        raise c.err(("rehearsal", "mem_fraction"), f"must be a number between 0 and 1, got {mf!r}")
    ls = rh.get("expected_load_s")
    if ls is not None and (isinstance(ls, bool) or not isinstance(ls, (int, float)) or ls < 0):
        raise c.err(("rehearsal", "expected_load_s"), f"must be seconds >= 0, got {ls!r}")
    flag = rh.get("draft_dummy_flag", True)
    if not isinstance(flag, bool):
        raise c.err(("rehearsal", "draft_dummy_flag"), f"must be true or false, got {flag!r}")
    return Rehearsal(
        files.get("model_config"),
        files.get("draft_config"),
        rh.get("layers"),
        float(mf) if mf is not None else None,
        rh.get("tp_size"),
        float(ls) if ls is not None else None,
        flag,
    )


def lock_file_for(lock_path: Path, python: str) -> Path:
    """The lock of one python where a recipe lists several: `k26.lock` -> `k26.py3.11.lock`."""
    name = lock_path.name
    stem = re.sub(r"\.py3\.\d+$", "", name[: -len(".lock")] if name.endswith(".lock") else name)
    return lock_path.with_name(f"{stem}.py{python}.lock")


def for_python(recipe: Recipe, python: str) -> Recipe:
    """The recipe read for hosts with `python` (X.Y): that python's lock. A recipe of one
    python is returned as it is (its lock is checked against the host by the caller);
    a python the recipe does not list is a UserError saying how to add it."""
    if python == recipe.python or len(recipe.pythons) <= 1:
        return recipe
    if python not in recipe.pythons:
        raise UserError(
            f"{recipe.source}: no engine lock for python {python} (engine.python lists "
            f'{", ".join(recipe.pythons)}): add "{python}" to engine.python and run '
            f"`k26ops engine lock {cli_name(recipe)} --python {python}`"
        )
    return replace(recipe, python=python, lock_path=lock_file_for(recipe.lock_path, python))


def cli_name(recipe: Recipe) -> str:
    """How a command names this recipe: its NAME where that finds this file, else its path."""
    try:
        same = resolve(recipe.name).resolve() == Path(recipe.source).resolve()
    except OSError:
        same = False
    return recipe.name if same else str(recipe.source)


def python_mismatch(recipe: Recipe, locked: str, host: str) -> str:
    """One line for a host whose python the recipe's lock is not for (check and deploy say the same)."""
    return (
        f"the engine lock {recipe.lock_path.name} is for python {locked}, this host has python {host}: list "
        f'"{host}" in {recipe.source.name}\'s engine.python and run `k26ops engine lock {cli_name(recipe)} '
        f"--python {host}`"
    )


def with_source_url(recipe: Recipe, url: str, what: str = "source URL") -> Recipe:
    """The same commit fetched from another URL (a mirror; the lab's local repository).

    The commit is the engine's identity; the URL is only where it is fetched."""
    if recipe.git is None:
        raise UserError(f"{recipe.source}: a source URL was given but the engine is a registry release (engine.sglang)")
    why = inputs.git_url_problem(url)
    if why:
        raise UserError(f"{what} {url!r}: not a git URL k26ops fetches: {why}")
    return replace(recipe, git=replace(recipe.git, url=url))


def check_requirements(recipe: Recipe, requires_dist: list[str], required_by: str) -> None:
    """Each pinned package must satisfy `required_by`'s Requires-Dist (the wheel's METADATA),
    as pip would judge it (`packaging`: PEP 440 versions, specifiers and requirements).

    Markers are ignored (the hosts are Linux x86_64); extras-only lines are skipped. A pin
    is explicit, so a pre-release pin is judged as a version like any other."""
    pins = {canonicalize_name(k): (k, v) for k, v in recipe.pins.items()}
    for line in requires_dist:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue  # not a requirement k26ops can judge: pip would refuse the wheel itself
        if req.marker is not None and "extra" in str(req.marker):
            continue
        if canonicalize_name(req.name) not in pins or not req.specifier:
            continue
        pkg, ver = pins[canonicalize_name(req.name)]
        try:
            ok = req.specifier.contains(Version(ver), prereleases=True)
        except InvalidVersion:
            raise UserError(
                f"{recipe.source}:{_pin_line(recipe, pkg) or 1}: engine.pins.{pkg}: {ver!r} is not a PEP 440 version"
            ) from None
        if not ok:
            raise UserError(
                f"{recipe.source}:{_pin_line(recipe, pkg) or 1}: engine.pins.{pkg}: {pkg}=={ver} does not "
                f"satisfy {required_by}'s requirement {req.name}{req.specifier}"
            )


def _pin_line(recipe: Recipe, pkg: str) -> int | None:
    try:
        return _marks(_compose_and_load(Path(recipe.source).read_text())[0]).get(("engine", "pins", pkg))
    except (OSError, yaml.YAMLError):
        return None


def requires_dist(metadata_text: str) -> list[str]:
    """Requires-Dist lines of a wheel's METADATA."""
    return [l.split(":", 1)[1].strip() for l in metadata_text.splitlines() if l.startswith("Requires-Dist:")]


def _hash_bytes(data) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else bytes(data)).hexdigest()


def release_id(recipe: Recipe, lock_sha256: str | None, patch_contents) -> str:
    """`sglang<ver>-<12 hex>` (registry) or `sglang-<commit12>-<12 hex>` (git) from
    what goes into the build: the engine source (registry pins, install mode and lock
    hash, or commit + subdir + lock hash + prebuilt wheel hash; never the URL, a mirror
    gives the same release), toolkit, and each active patch's name and content in series
    order. Engine profile and recipe name do not change the build."""
    if isinstance(patch_contents, Mapping):
        patch_contents = list(patch_contents.items())
    patches = []
    for item in patch_contents or []:
        if hasattr(item, "sha256") and hasattr(item, "name"):  # patchset.Patch
            patches.append([item.name, item.sha256])
        else:
            name, content = item
            patches.append([str(name), _hash_bytes(content)])
    if not lock_sha256:
        raise UserError(f"{recipe.source}: the engine source's lock is not loaded yet")
    doc = {
        "engine": (
            {
                "commit": recipe.git.commit,
                "subdir": recipe.git.subdir,
                "lock": lock_sha256,
                "wheel": recipe.git.wheel_sha256,
            }
            if recipe.git
            else {
                "sglang": recipe.sglang,
                "install": recipe.install,
                "requirements": recipe.requirements(),
                "lock": lock_sha256,
            }
        ),
        "toolkit": asdict(recipe.toolkit),
        "patches": patches,
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    if recipe.git:
        return f"sglang-{recipe.git.commit[:12]}-{digest[:12]}"
    return f"sglang{recipe.sglang}-{digest[:12]}"
