"""The engine's source: one pinned git commit, fetched and built into a wheel
once on the control node.

Why: DDTree lives in branches and pull requests, not in a release. Python
sources, compiled parts and dependency pins must all come from the same
commit (laying one code base's Python over another's install mixes two
engines). So a recipe names a git URL and a full 40-hex commit; a moving ref
is only ever used by `k26ops engine pin` to *find* a commit. The control node
keeps one bare cache per URL (~/.cache/k26ops/git) and one built wheel per
(commit, subdir) (~/.cache/k26ops/engine), so N hosts and N runs cost one
fetch and one build. Hosts never see git: they get the wheel.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import UserError
from k26ops.release import inputs
from k26ops.release.wheelhouse import file_sha256, wheel_name_version

SHA = re.compile(r"[0-9a-f]{40}")


def _cache_root() -> Path:
    return Path(os.environ.get("K26OPS_ENGINE_CACHE") or Path.home() / ".cache/k26ops")


def git_cache(url: str) -> Path:
    base = Path(os.environ.get("K26OPS_GIT_CACHE") or _cache_root() / "git")
    return base / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


@dataclass(frozen=True)
class BuiltWheel:
    name: str  # file name
    sha256: str
    size: int
    path: Path
    dist: str  # distribution name, normalised (sglang)
    version: str  # as in the wheel's file name (0.5.23+lab)


# no ext:: transport (it runs a command), whatever the user's git config allows
_GIT_SAFE = ("-c", "protocol.ext.allow=never")


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *_GIT_SAFE, "-C", str(repo), *args], capture_output=True, text=True, check=check)


def _check_url(url: str) -> None:
    why = inputs.git_url_problem(url)
    if why:
        raise UserError(f"engine source: {url!r}: not a git URL k26ops fetches: {why}")


def _check_ref(ref: str) -> None:
    why = inputs.ref_problem(ref)
    if why:
        raise UserError(f"engine source: ref {ref!r}: {why}")


def _check_commit(commit: str) -> None:
    if inputs.commit_problem(commit):
        raise UserError(f"engine source: {commit!r} is not a full 40-hex commit")


def _repo(url: str) -> Path:
    _check_url(url)
    d = git_cache(url)
    if not (d / "HEAD").exists():
        d.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "--", str(d)], check=True, capture_output=True)
        (d / "k26ops-url").write_text(url + "\n")
    return d


def _has_commit(d: Path, commit: str) -> bool:
    return _git(d, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0


def _fetch(d: Path, url: str, what: str, depth: int | None) -> subprocess.CompletedProcess:
    local = "refs/k26ops/" + hashlib.sha256(what.encode()).hexdigest()[:16]
    _check_url(url)
    args = ["fetch", "-q", "--no-tags", "--force"] + ([f"--depth={depth}"] if depth else [])
    return _git(d, *args, "--", url, f"+{what}:{local}", check=False)  # `--`: the URL is never an option


def resolve_ref(url: str, ref: str) -> str:
    """The commit a branch/PR ref points at *now* (for `engine pin` only)."""
    _check_url(url)
    _check_ref(ref)
    d = _repo(url)
    proc = _fetch(d, url, ref, depth=1)
    if proc.returncode != 0:
        raise UserError(
            f"engine source: cannot fetch {ref} from {url}: {git_error(proc)}; {MIRROR_HINT.format(url=url)}"
        )
    local = "refs/k26ops/" + hashlib.sha256(ref.encode()).hexdigest()[:16]
    return _git(d, "rev-parse", f"{local}^{{commit}}").stdout.strip()


def fetch(url: str, commit: str, ref: str | None = None) -> Path:
    """Make `commit` present in the bare cache (once); returns the cache dir.

    Fetching by sha works on GitHub and on any server for an advertised tip;
    if the server refuses, the recipe's `ref` (a hint where the commit lives)
    is fetched in full and must contain it. The commit itself is never moved."""
    _check_commit(commit)
    _check_url(url)
    if ref is not None:
        _check_ref(ref)
    d = _repo(url)
    if _has_commit(d, commit):
        return d
    tried = [("the commit by sha", _fetch(d, url, commit, depth=1))]
    if tried[0][1].returncode != 0 and ref:
        tried.append((ref, _fetch(d, url, ref, depth=None)))
    if not _has_commit(d, commit):
        what = "; ".join(
            f"{name}: {git_error(p) if p.returncode else 'fetched, the commit is not on it'}" for name, p in tried
        )
        answered = all(p.returncode == 0 or _ANSWERED.search(p.stderr or "") for _, p in tried)
        if answered:  # the server is there and says it has no such commit (or ref)
            raise UserError(
                f"engine source: {url} has no commit {commit} (tried {what}): check the recipe's "
                f"engine.source commit and ref; {MIRROR_HINT.format(url=url)}"
            )
        raise UserError(
            f"engine source: cannot fetch commit {commit[:12]} from {url} (tried {what}); {MIRROR_HINT.format(url=url)}"
        )
    return d


# git's words for a server that answered but has no such object or ref
_ANSWERED = re.compile(r"not our ref|couldn't find remote ref|no such remote ref|unadvertised object")


def git_error(proc: subprocess.CompletedProcess) -> str:
    """git's first `fatal:`/`error:` line (the cause; the last line is often its advice), else the last line."""
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    first = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), None)
    return first or (lines[-1] if lines else f"git exited {proc.returncode}")


MIRROR_HINT = (
    "from a mirror of it, set the inventory's engine_source_mirrors: {{{url}: MIRROR_URL}} "
    "or pass --source-url MIRROR_URL to `k26ops engine lock`/`pin`"
)


def export(url: str, commit: str, dest: Path) -> Path:
    """The whole tree at `commit` (git archive: no .git, exact bytes) under dest."""
    _check_commit(commit)
    d = git_cache(url)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tf:
        proc = subprocess.run(
            ["git", *_GIT_SAFE, "-C", str(d), "archive", "--format=tar", commit],
            stdout=tf,
            stderr=subprocess.PIPE,
            text=False,
        )
        if proc.returncode != 0:
            raise UserError(
                f"engine source: git archive {commit[:12]} failed: "
                f"{proc.stderr.decode(errors='replace').strip()[-200:]}"
            )
        tf.seek(0)
        try:
            with tarfile.open(fileobj=tf) as tar:
                tar.extractall(dest, filter="data")  # nothing outside dest, no link out of it
        except tarfile.FilterError as exc:
            raise UserError(f"engine source: the tree at {commit[:12]} is refused: {exc}") from None
    return dest


# What a build backend or build requirement needs on the control node, besides Python.
_TOOLS = {
    "setuptools-rust": "cargo",
    "setuptools_rust": "cargo",
    "maturin": "cargo",
    "scikit-build-core": "cmake",
    "scikit_build_core": "cmake",
    "cmake": "cmake",
    "torch": "a CUDA build environment (torch as a build requirement compiles kernels)",
}


def build_requirements(project: Path) -> list[str]:
    """`[build-system] requires` of the project's pyproject.toml (what pip installs to build it)."""
    # lazy: tomllib only when an engine is built, never in a deploy's start
    import tomllib

    try:
        doc = tomllib.loads((project / "pyproject.toml").read_text())
    except FileNotFoundError:
        return []
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"engine source: {project / 'pyproject.toml'} is not readable TOML: {exc}") from None
    return list((doc.get("build-system") or {}).get("requires") or [])


# Extension kinds a setup.py can declare (read as text with ast, never executed), and the
# tool each needs. sglang 0.5.23 declares its 5 compiled Rust modules there
# (setuptools_rust RustExtension, `rust_extensions=`), not in [build-system].
_SETUP_CALLS = {
    "RustExtension": "cargo",
    "RustBin": "cargo",
    "Extension": "cc",
    "CppExtension": "cc",
    "Pybind11Extension": "cc",
    "cythonize": "cc",
    "CUDAExtension": "a CUDA build environment (nvcc, for CUDAExtension in setup.py)",
}
_SETUP_KEYWORDS = {"rust_extensions": "cargo", "ext_modules": "cc"}


def setup_py_extensions(project: Path) -> dict[str, str]:
    """What the project's setup.py declares to compile: {what (file:line): tool}."""
    path = project / "setup.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except FileNotFoundError:
        return {}
    except (OSError, SyntaxError, ValueError) as exc:
        raise UserError(f"engine source: {path} cannot be read as Python: {exc}") from None
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(m.split(".")[0] in ("setuptools_rust", "maturin") for m in mods):
                found.setdefault(f"setup.py:{node.lineno} imports {mods[0].split('.')[0]}", "cargo")
        elif isinstance(node, ast.Call):
            fn = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if fn in _SETUP_CALLS:
                found.setdefault(f"setup.py:{node.lineno} {fn}(...)", _SETUP_CALLS[fn])
            for kw in node.keywords:
                if kw.arg in _SETUP_KEYWORDS and not (
                    isinstance(kw.value, (ast.List, ast.Tuple)) and not kw.value.elts
                ):
                    found.setdefault(f"setup.py:{node.lineno} {kw.arg}=", _SETUP_KEYWORDS[kw.arg])
    return found


def _have(tool: str) -> bool:
    if tool.startswith("a "):
        return False
    if tool == "cc":
        return any(shutil.which(t) for t in ("cc", "gcc", "clang"))
    return bool(shutil.which(tool))


def missing_tools(project: Path) -> list[str]:
    """Tools the commit's own build configuration needs that this control node lacks:
    from [build-system] requires and from the extensions setup.py declares."""
    missing = []
    for req in build_requirements(project):
        name = re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0].lower()
        tool = _TOOLS.get(name)
        if tool and not _have(tool) and tool not in missing:
            missing.append(tool)
    for what, tool in setup_py_extensions(project).items():
        label = f"{'a C compiler' if tool == 'cc' else tool} ({what})"
        if not _have(tool) and not any(m.split(" (")[0] == label.split(" (")[0] for m in missing):
            missing.append(label)
    return missing


# pip's own frame around a failed build: not the cause
_PIP_FRAME = re.compile(
    r"^(error: (subprocess-exited-with-error|metadata-generation-failed|failed-wheel-build"
    r"|legacy-install-failure)|note: This error originates from a subprocess|"
    r"╰─> |× |│ |\[end of output\]|\[\d+ lines of output\]|hint: )"
)
_EXC = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit)(?:: .*)?$")
_TOOL_ERR = re.compile(r"(^|\s|:)(error(\[\w+\])?|fatal error|CMake Error[^:]*):", re.I)


def build_failure(output: str) -> tuple[str, str, list[str]]:
    """(the cause, pip's stage line, the tail) of a failed `pip wheel` output.

    The cause is the first error of the chained output: the first Python exception
    line (`ModuleNotFoundError: No module named 'setuptools_rust'`), else the first
    compiler/cargo/cmake error line, else the first line naming an error that is not
    pip's own frame ("note: This error originates from a subprocess")."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    inner = [ln for ln in lines if not _PIP_FRAME.match(ln) and not re.fullmatch(r"[\^~\s]+", ln)]
    cause = (
        next((ln for ln in inner if _EXC.match(ln)), None)
        or next((ln for ln in inner if _TOOL_ERR.search(ln)), None)
        or next((ln for ln in inner if "error" in ln.lower()), None)
        or (lines[-1] if lines else "no output")
    )
    stage = next((ln[1:].strip() for ln in lines if ln.startswith("× ")), "")
    return cause, stage, [ln for ln in inner[-4:] if ln != cause]


def wheel_info(path: Path, sha256: str | None = None) -> BuiltWheel:
    try:
        dist, version = wheel_name_version(path.name)
    except UserError as exc:
        raise UserError(f"engine wheel {path.parent}/{exc}") from None
    return BuiltWheel(
        path.name, sha256 or file_sha256(path), path.stat().st_size, path, re.sub(r"[-_.]+", "-", dist).lower(), version
    )


def check_python(wheel: BuiltWheel, python: str) -> None:
    """A wheel with compiled parts is built for one python: it must be the hosts'."""
    tag = wheel.name[: -len(".whl")].split("-")[-3]
    want = "cp" + python.replace(".", "")
    tags = tag.split(".")
    if any(t.startswith("py3") for t in tags) or want in tags:
        return
    raise UserError(
        f"engine wheel {wheel.name} is for {tag}, the hosts run python {python} ({want}): build it "
        f"with python {python} (pip wheel), or give a prebuilt {want} wheel as engine.source.wheel"
    )


def build(
    url: str, commit: str, subdir: str = "python", ref: str | None = None, progress=lambda msg: None
) -> BuiltWheel:
    """The engine wheel built from `subdir` of `commit` with its own build
    configuration (pip wheel --no-deps), once per (commit, subdir) on this node."""
    _check_commit(commit)  # before it names any path
    _check_url(url)
    why = inputs.inside_problem(subdir, "subdir")
    if why:
        raise UserError(f"engine source: subdir {subdir!r}: {why}")
    key = hashlib.sha256(f"{commit}:{subdir}".encode()).hexdigest()[:16]
    root = _cache_root() / "engine"
    out = root / f"{commit[:12]}-{key}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = out / "built.json"
        if record.exists():
            rec = json.loads(record.read_text())
            return wheel_info(out / rec["name"], rec["sha256"])
        progress(f"fetching engine source {url} @ {commit[:12]}")
        fetch(url, commit, ref)
        with tempfile.TemporaryDirectory(prefix="k26ops-engine-build-") as tmp:
            tree = export(url, commit, Path(tmp) / "src")
            project = tree / subdir
            if not inputs.is_inside(project, tree):  # a symlink in the commit pointing elsewhere
                raise UserError(f"engine source: {url} @ {commit[:12]}: {subdir}/ leaves the commit's tree")
            if not (project / "pyproject.toml").exists() and not (project / "setup.py").exists():
                raise UserError(
                    f"engine source: {url} @ {commit[:12]} has no {subdir}/pyproject.toml "
                    "(set engine.source.subdir to the directory that builds the engine)"
                )
            missing = missing_tools(project)
            if missing:
                raise UserError(
                    f"engine source: building {url} @ {commit[:12]} needs {', '.join(missing)}, which "
                    "this control node lacks: install it, or build the wheel elsewhere and set "
                    "engine.source.wheel {path|url, sha256} in the recipe (docs/how-to/engine-source.md)"
                )
            progress(f"building the engine wheel from {subdir}/ @ {commit[:12]} (pip wheel, once per commit)")
            dist = Path(tmp) / "dist"
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "-q",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "-w",
                    str(dist),
                    str(project),
                ],
                capture_output=True,
                text=True,
            )
            wheels = sorted(dist.glob("*.whl")) if dist.exists() else []
            if proc.returncode != 0 or len(wheels) != 1:
                text = (proc.stdout or "") + (proc.stderr or "")
                log = root / f"{commit[:12]}-{key}.build-error.log"
                log.write_text(text)
                cause, stage, tail = build_failure(text) if text.strip() else ("no wheel was made", "", [])
                raise UserError(
                    f"engine source: building the wheel from {url} @ {commit[:12]} failed: {cause}"
                    + (f" ({stage})" if stage else "")
                    + (f"; output tail: {' | '.join(tail)[-400:]}" if tail else "")
                    + f"; the whole output: {log}; or build the wheel elsewhere and set engine.source.wheel "
                    "{path|url, sha256} in the recipe (docs/how-to/engine-source.md)"
                )
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            shutil.move(str(wheels[0]), partial / wheels[0].name)
            info = wheel_info(partial / wheels[0].name)
            (partial / "built.json").write_text(
                json.dumps(
                    {"name": info.name, "sha256": info.sha256, "url": url, "commit": commit, "subdir": subdir}, indent=1
                )
                + "\n"
            )
            shutil.rmtree(out, ignore_errors=True)
            partial.rename(out)
        return wheel_info(out / info.name, info.sha256)


def prebuilt(path: str | None, url: str | None, sha256: str, recipe_dir: Path, progress=lambda msg: None) -> BuiltWheel:
    """A wheel built elsewhere (path or URL), accepted only with its sha256."""
    if url and not path:
        root = _cache_root() / "engine" / "prebuilt"
        root.mkdir(parents=True, exist_ok=True)
        dest = root / sha256[:16] / url.rstrip("/").rsplit("/", 1)[-1]
        if not dest.exists():
            progress(f"downloading the prebuilt engine wheel {url}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".partial")
            # lazy: urllib.request brings http.client and email (about 5 ms at CLI start) for this one download
            import urllib.request

            try:
                with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as fh:
                    shutil.copyfileobj(resp, fh)
            except OSError as exc:
                raise UserError(f"engine source: cannot download {url}: {exc}") from None
            tmp.rename(dest)
        p = dest
    else:
        p = Path(path) if Path(path).is_absolute() else recipe_dir / path
    if not p.is_file():
        raise UserError(f"engine source: prebuilt wheel {p} does not exist")
    got = file_sha256(p)
    if got != sha256:
        raise UserError(f"engine source: prebuilt wheel {p} has sha256 {got}, the recipe says {sha256}")
    return wheel_info(p, got)


def describe(engine: dict | None) -> list[str]:
    """A release's engine provenance (its manifest's `engine`) as lines a person reads."""
    if not engine:
        return ["engine (not recorded: a release built before engine provenance)"]
    src = engine.get("source") or {}
    where = (
        f"{src['git']} @ {src.get('commit')} ({src.get('subdir', 'python')}/, {src.get('built', 'built')})"
        if src.get("git")
        else f"{src.get('registry')} ({src.get('install', 'full')})"
    )
    wheel, lock = engine.get("wheel") or {}, engine.get("lock")
    return [
        f"engine {engine.get('base')}  from {where}",
        f"wheel  {wheel.get('name')}  sha256 {wheel.get('sha256')}",
        f"lock   {lock['file']}  sha256 {lock['sha256']}  ({lock.get('wheels')} wheels)"
        if lock
        else "lock   none (a registry release built before registry releases were locked)",
    ]


def wheel_for(recipe, progress=lambda msg: None) -> BuiltWheel:
    """A git-source recipe's engine wheel: its prebuilt one (checked by sha256), else
    built from the pinned commit; either way for the hosts' python."""
    g = recipe.git
    if g.wheel_sha256:
        w = prebuilt(g.wheel_path, g.wheel_url, g.wheel_sha256, Path(recipe.source).parent, progress)
    else:
        w = build(g.url, g.commit, g.subdir, g.ref, progress)
    check_python(w, recipe.python)
    return w
