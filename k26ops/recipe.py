"""The engine recipe: pins, CUDA toolkit, DDTree overlay source, patch series,
engine profile defaults; and the release id derived from its content.

Why a separate, validated file: hosts built from the same recipe, overlay commit
and patch contents must be byte-for-byte the same release (same id, nothing
rebuilt), and a typo must fail before any host is touched, as one line naming
the file, line and key.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from k26ops import resources
from k26ops.errors import UserError

RECIPES_DIR = resources.path("playbooks", "recipes")
DEFAULT_RECIPE = "k26-tp8-ddtree"
UPSTREAM_URL = "https://github.com/sgl-project/sglang.git"
UPSTREAM_DDTREE_REF = "refs/pull/29907/head"

_VERSION = re.compile(r"\d+(\.\d+)*([.+-]?[A-Za-z0-9]+)*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GPU_PINS = ("torch", "triton", "flashinfer-python")
_TOP = {"name", "description", "engine", "cuda_toolkit", "ddtree_overlay", "patches", "engine_profile"}
# engine_profile keys understood by units.engine_argv (plus extra_args)
PROFILE_INT = {"tp_size": 1, "speculative_ddtree_budget": 1, "speculative_dflash_block_size": 1,
               "page_size": 1, "cuda_graph_max_bs_decode": 1, "cuda_graph_max_bs_prefill": 1,
               "port": 1, "nnodes": 1}
PROFILE_OTHER = {"model_path", "draft_model_path", "launch_module", "served_model_name",
                 "speculative_algorithm", "trust_remote_code", "disable_cuda_graph", "host", "extra_args"}


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
class Overlay:
    url: str
    ref: str
    subdir: str = "python/sglang"  # upstream layout
    include: str = "*.py"  # compiled kernels of the installed wheel are kept


@dataclass(frozen=True)
class Recipe:
    name: str
    source: Path
    sglang: str
    install: str  # full | no-deps
    pins: dict[str, str]
    extras: dict[str, list[str]]
    toolkit: Toolkit
    overlay: Overlay | None
    series: Path
    tags: tuple[str, ...]
    profile: dict[str, Any] = field(default_factory=dict)

    def requirements(self) -> list[str]:
        """pip requirement strings to install into the release venv (see `no_deps`)."""
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
            raise self.err(key, f"must be a quoted version string like \"0.5.23\", got {value!r}")
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
    """A recipe name (playbooks/recipes/NAME.yml) or a path; default: the production recipe."""
    p = Path(name_or_path or DEFAULT_RECIPE)
    if p.suffix in (".yml", ".yaml") or p.exists():
        return p
    return RECIPES_DIR / f"{p}.yml"


def load(name_or_path: str | Path | None = None) -> Recipe:
    path = resolve(name_or_path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read recipe: {exc.strerror}") from None
    return parse(text, path)


def parse(text: str, path: Path | str = "<recipe>") -> Recipe:
    """Validate recipe YAML; every error is one line with file, line and key."""
    path = Path(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UserError(f"{path}:{mark.line + 1 if mark else 1}: not valid YAML: "
                        f"{getattr(exc, 'problem', None) or exc}") from None
    c = _Ctx(path, _marks(node) if node is not None else {})
    top = c.mapping(data, (), _TOP, required=("name", "engine", "cuda_toolkit"))
    name = top["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise c.err(("name",), f"must be a simple name, got {name!r}")

    eng = c.mapping(top["engine"], ("engine",), {"sglang", "install", "pins", "extras"}, required=("sglang",))
    sglang = c.version(eng["sglang"], ("engine", "sglang"))
    install = c.choice(eng.get("install", "full"), ("engine", "install"), ("full", "no-deps"))
    pins_raw = c.mapping(eng.get("pins"), ("engine", "pins"))
    pins = {}
    for pkg, ver in pins_raw.items():
        if not isinstance(pkg, str) or not _NAME.fullmatch(pkg):
            raise c.err(("engine", "pins", pkg), "not a package name")
        pins[pkg] = c.version(ver, ("engine", "pins", pkg))
    if install == "full":
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

    tk = c.mapping(top["cuda_toolkit"], ("cuda_toolkit",), {"method", "version", "min_driver"},
                   required=("method", "version"))
    method = c.choice(tk["method"], ("cuda_toolkit", "method"), ("apt", "pip"))
    tver = tk["version"]
    if not isinstance(tver, str) or not re.fullmatch(r"\d+\.\d+", tver):
        raise c.err(("cuda_toolkit", "version"), f"must be a quoted major.minor like \"13.0\", got {tver!r}")
    min_driver = tk.get("min_driver", 580)
    if isinstance(min_driver, bool) or not isinstance(min_driver, int) or min_driver < 1:
        raise c.err(("cuda_toolkit", "min_driver"), f"must be a driver major number, got {min_driver!r}")
    toolkit = Toolkit(method, tver, min_driver)

    overlay = None
    ov = top.get("ddtree_overlay")
    if ov is not None:
        ov = c.mapping(ov, ("ddtree_overlay",), {"url", "ref", "subdir", "include"}, required=("url", "ref"))
        for k in ("url", "ref", "subdir", "include"):
            if k in ov and (not isinstance(ov[k], str) or not ov[k].strip() or any(ch.isspace() for ch in ov[k])):
                raise c.err(("ddtree_overlay", k), f"must be a non-empty string without spaces, got {ov[k]!r}")
        if not re.match(r"(https?|ssh|git|file)://|[\w.-]+@[\w.-]+:|/", ov["url"]):
            raise c.err(("ddtree_overlay", "url"), f"not a git URL: {ov['url']!r}")
        overlay = Overlay(ov["url"], ov["ref"], ov.get("subdir", "python/sglang"), ov.get("include", "*.py"))

    pt = c.mapping(top.get("patches"), ("patches",), {"series", "tags"})
    series_rel = pt.get("series", "patches/series")
    if not isinstance(series_rel, str):
        raise c.err(("patches", "series"), "must be a path")
    series = (_find_repo_root(path) / series_rel) if not Path(series_rel).is_absolute() else Path(series_rel)
    if not series.is_file():
        raise c.err(("patches", "series"), f"no such file: {series}")
    tags = pt.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise c.err(("patches", "tags"), "must be a list of tag names")

    profile = dict(c.mapping(top.get("engine_profile"), ("engine_profile",), set(PROFILE_INT) | PROFILE_OTHER))
    for k, lo in PROFILE_INT.items():
        v = profile.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise c.err(("engine_profile", k), f"must be an integer >= {lo}, got {v!r}")
    algo = profile.get("speculative_algorithm")
    if isinstance(algo, str) and algo.upper() == "DDTREE":
        if profile.get("speculative_ddtree_budget") is None:
            raise c.err(("engine_profile",), "speculative_algorithm DDTREE needs speculative_ddtree_budget")
        if profile.get("page_size", 1) != 1:
            raise c.err(("engine_profile", "page_size"), "DDTREE needs page_size 1")
    return Recipe(name=name, source=path, sglang=sglang, install=install, pins=pins, extras=extras,
                  toolkit=toolkit, overlay=overlay, series=series, tags=tuple(tags), profile=profile)


def with_overlay(recipe: Recipe, url: str, ref: str) -> Recipe:
    """The same recipe with another DDTree source (the lab's local repository)."""
    base = recipe.overlay or Overlay(url, ref)
    return replace(recipe, overlay=replace(base, url=url, ref=ref))


def _ver_tuple(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v))


def _satisfies(version: str, spec: str) -> bool:
    """Tiny PEP 440 subset: ==, !=, >=, <=, >, <, ~= with comma-joined clauses."""
    for clause in filter(None, (s.strip() for s in spec.split(","))):
        m = re.fullmatch(r"(==|!=|>=|<=|~=|>|<)\s*([\w.*+-]+)", clause)
        if not m:
            continue
        op, want = m.groups()
        if want.endswith(".*"):
            ok = (version + ".").startswith(want[:-1])
            ok = ok if op == "==" else not ok
        else:
            a, b = _ver_tuple(version), _ver_tuple(want)
            try:
                ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b,
                      "~=": a >= b and a[:len(b) - 1] == b[:len(b) - 1]}[op]
            except TypeError:
                ok = version == want if op == "==" else True
        if not ok:
            return False
    return True


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_requirements(recipe: Recipe, requires_dist: list[str], required_by: str) -> None:
    """Each pinned package must satisfy `required_by`'s Requires-Dist (the wheel's METADATA).

    Markers are ignored (the hosts are Linux x86_64); extras-only lines are skipped."""
    pins = {_norm(k): (k, v) for k, v in recipe.pins.items()}
    for line in requires_dist:
        req, _, marker = line.partition(";")
        if "extra ==" in marker:
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*\(?([^)]*)\)?", req)
        if not m or _norm(m.group(1)) not in pins:
            continue
        pkg, ver = pins[_norm(m.group(1))]
        spec = m.group(3).strip()
        if spec and not _satisfies(ver, spec):
            raise UserError(f"{recipe.source}:{_pin_line(recipe, pkg) or 1}: engine.pins.{pkg}: {pkg}=={ver} does not "
                            f"satisfy {required_by}'s requirement {m.group(1)}{spec}")


def _pin_line(recipe: Recipe, pkg: str) -> int | None:
    try:
        return _marks(yaml.compose(Path(recipe.source).read_text(), Loader=yaml.SafeLoader)).get(("engine", "pins", pkg))
    except (OSError, yaml.YAMLError):
        return None


def requires_dist(metadata_text: str) -> list[str]:
    """Requires-Dist lines of a wheel's METADATA."""
    return [l.split(":", 1)[1].strip() for l in metadata_text.splitlines() if l.startswith("Requires-Dist:")]


def _hash_bytes(data) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else bytes(data)).hexdigest()


def release_id(recipe: Recipe, overlay_commit: str | None, patch_contents) -> str:
    """`sglang<ver>-<12 hex>` from what goes into the build: pins, install mode, toolkit,
    overlay URL + resolved commit (not the ref name), and each active patch's name and
    content in series order. Engine profile and recipe name do not change the build."""
    if isinstance(patch_contents, Mapping):
        patch_contents = list(patch_contents.items())
    patches = []
    for item in patch_contents or []:
        if hasattr(item, "sha256") and hasattr(item, "name"):  # patchset.Patch
            patches.append([item.name, item.sha256])
        else:
            name, content = item
            patches.append([str(name), _hash_bytes(content)])
    doc = {
        "sglang": recipe.sglang, "install": recipe.install,
        "requirements": recipe.requirements(),
        "toolkit": asdict(recipe.toolkit),
        "overlay": None if recipe.overlay is None else {
            "url": recipe.overlay.url, "commit": overlay_commit,
            "subdir": recipe.overlay.subdir, "include": recipe.overlay.include},
        "patches": patches,
    }
    if recipe.overlay is not None and not overlay_commit:
        raise UserError(f"{recipe.source}: ddtree_overlay is set but its commit is not resolved yet")
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"sglang{recipe.sglang}-{digest[:12]}"
