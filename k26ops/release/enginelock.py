"""The engine's dependency lock: every wheel the engine needs, by exact version
and sha256, for one target platform.

Why a committed file: the dependency set must be resolved once for the hosts'
platform (cpython X.Y, manylinux x86_64), reviewed as a diff, and installed on
hosts with `pip --require-hashes --no-index`, so a host can only ever get
exactly those bytes. A git source's lock holds what its commit's pyproject
needs (the engine wheel itself is built from the commit); a registry source's
lock holds the sglang wheel itself and, for `install: full`, its whole closure
with the recipe's pins. `k26ops engine lock` makes it; a deploy only reads it
and refuses when it does not belong to the recipe.

Why uv (`uv pip compile --python-version X.Y --python-platform ...`): pip's
resolver evaluates environment markers for the interpreter running it, so
control nodes on 3.11 and 3.12 locked different versions of the same recipe.
uv resolves for the named target whatever runs it; only wheels are taken
(`--only-binary :all:`: nothing is built, so no interpreter of the control
node is ever run), and the one wheel per package that the hosts' pip would
pick (`best_wheel`) is what the lock keeps.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import UserError
from k26ops.release.wheelhouse import PLATFORMS

HEADER = (
    "# k26ops engine lock: made by `k26ops engine lock {recipe}`; commit it beside the recipe\n"
    "# and review changes as a diff. Hosts install exactly these wheels (pip --require-hashes\n"
    "# --no-index) plus the engine wheel built from the source commit below.\n"
)
REGISTRY_HEADER = (
    "# k26ops engine lock: made by `k26ops engine lock {recipe}`; commit it beside the recipe\n"
    "# and review changes as a diff. Hosts install exactly these wheels (pip --require-hashes\n"
    "# --no-index), the engine's own wheel among them.\n"
)
_KEYS = ("source", "commit", "subdir", "engine", "install", "requirements", "python", "platform", "cuda runtime wheels")
# The oldest host k26ops supports is Ubuntu 22.04 (glibc 2.35; Debian 12 has 2.36, Ubuntu 24.04
# 2.39): a locked wheel must install on all of them. sglang 0.5.23's wheels are manylinux_2_34.
GLIBC = (2, 35)
UV_PLATFORM = f"x86_64-manylinux_{GLIBC[0]}_{GLIBC[1]}"
# CUDA runtime wheels a lock review should see with their versions (an unpinned dependency
# can pull nvcc/nvvm/nvjitlink of another CUDA minor than the recipe's toolkit)
_CUDA = re.compile(
    r"nvidia-(cuda-.+|.+-cu1\d|nvjitlink.*|nvvm.*|cublas.*|cufft.*|curand.*|cusolver.*|"
    r"cusparse.*|cufile.*|nvtx.*|nccl.*|nvshmem.*)|cuda-toolkit"
)
_ENTRY = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Lock:
    path: Path
    meta: dict[str, str]
    entries: tuple[tuple[str, str, str], ...]  # (name, version, sha256)
    sha256: str

    @property
    def commit(self) -> str:
        return self.meta.get("commit", "")


def platforms() -> list[str]:
    return PLATFORMS


def parse(text: str, path: Path | str = "<lock>") -> Lock:
    meta: dict[str, str] = {}
    entries = []
    logical, start = "", 0
    lines = text.splitlines()
    for n, raw in enumerate(lines + [""], 1):
        if raw.startswith("#"):
            key, sep, val = raw[1:].strip().partition(":")
            if sep and key.strip() in _KEYS:
                meta[key.strip()] = val.strip()
            continue
        if logical and not raw.startswith((" ", "\t")):
            m = _ENTRY.fullmatch(" ".join(logical.split()))
            if not m:
                raise UserError(
                    f"{path}:{start}: not a lock entry `name==version --hash=sha256:HEX`: {logical.strip()[:80]!r}"
                )
            entries.append((m.group(1), m.group(2), m.group(3)))
            logical = ""
        if raw.strip():
            if not logical:
                start = n
            logical += " " + raw.strip().rstrip("\\")
    for key in ("python",) if meta.get("source") == "registry" else ("commit", "python"):
        if key not in meta:
            raise UserError(f"{path}:1: lock header has no `# {key}:` line (remake it with `k26ops engine lock`)")
    return Lock(Path(path), meta, tuple(entries), hashlib.sha256(text.encode()).hexdigest())


def load(path: Path) -> Lock | None:
    try:
        return parse(path.read_text(), path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot read lock: {exc.strerror}") from None


def platform_line(python: str) -> str:
    return f"cp{python.replace('.', '')} manylinux_{GLIBC[0]}_{GLIBC[1]} x86_64"


def registry_meta(recipe) -> dict[str, str]:
    """The header a registry recipe's lock has: what a deploy checks it against."""
    return {
        "source": "registry",
        "engine": f"sglang=={recipe.sglang}",
        "install": recipe.install,
        "requirements": " ".join(recipe.requirements()),
        "python": recipe.python,
        "platform": platform_line(recipe.python),
    }


def cuda_runtime(entries) -> list[tuple[str, str]]:
    """(name, version) of the CUDA runtime wheels among the lock's entries."""
    return sorted((_norm(n), v) for n, v, _ in entries if _CUDA.fullmatch(_norm(n)))


def render(recipe_name: str, meta: dict[str, str], entries) -> str:
    meta = dict(meta)
    if "platform" in meta or meta.get("source") == "registry":
        cuda = cuda_runtime(entries)
        meta["cuda runtime wheels"] = ", ".join(f"{n} {v}" for n, v in cuda) if cuda else "none"
    out = [(REGISTRY_HEADER if meta.get("source") == "registry" else HEADER).format(recipe=recipe_name)]
    out += [f"# {k}: {meta[k]}\n" for k in _KEYS if k in meta]
    for name, version, sha in sorted(entries, key=lambda e: e[0].lower()):
        out.append(f"{name}=={version} \\\n    --hash=sha256:{sha}\n")
    return "".join(out)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uv_bin() -> str:
    """The uv executable: the `uv` package's own (a k26ops dependency), else one on PATH."""
    try:
        from uv import find_uv_bin  # optional: the uv package may be missing; then one on PATH

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise UserError("engine lock: uv is not installed (pip install uv; it is a k26ops dependency)")


def supported_tags(python: str) -> list[tuple[str, str, str]]:
    """(python, abi, platform) tags the hosts' pip accepts for cpython `python` on
    manylinux x86_64 up to GLIBC, best first (the order of packaging.tags.sys_tags)."""
    major, minor = (int(x) for x in python.split("."))
    plats = [f"manylinux_{GLIBC[0]}_{m}_x86_64" for m in range(GLIBC[1], 4, -1)]
    legacy = {
        "manylinux_2_17_x86_64": "manylinux2014_x86_64",
        "manylinux_2_12_x86_64": "manylinux2010_x86_64",
        "manylinux_2_5_x86_64": "manylinux1_x86_64",
    }
    plats = [q for p in plats for q in ((p, legacy[p]) if p in legacy else (p,))] + ["linux_x86_64"]
    cp = f"cp{major}{minor}"
    tags = [(cp, cp, p) for p in plats] + [(cp, "abi3", p) for p in plats] + [(cp, "none", p) for p in plats]
    tags += [(f"cp{major}{m}", "abi3", p) for m in range(minor - 1, 1, -1) for p in plats]
    pys = [f"py{major}{minor}", f"py{major}"] + [f"py{major}{m}" for m in range(minor - 1, -1, -1)]
    tags += [(py, "none", p) for py in pys for p in plats]
    tags += [(cp, "none", "any")] + [(py, "none", "any") for py in pys]
    return tags


def best_wheel(filenames, python: str) -> str | None:
    """The wheel the hosts' pip would pick among `filenames` (None: none installs there)."""
    rank = {t: i for i, t in enumerate(supported_tags(python))}
    best = None
    for fn in filenames:
        if not fn.endswith(".whl"):
            continue
        parts = fn[:-4].split("-")
        if len(parts) < 5:
            continue
        pyt, abit, platt = parts[-3:]
        r = min(
            (
                rank[(a, b, c)]
                for a in pyt.split(".")
                for b in abit.split(".")
                for c in platt.split(".")
                if (a, b, c) in rank
            ),
            default=None,
        )
        if r is not None and (best is None or (r, fn) < best):
            best = (r, fn)
    return best[1] if best else None


# uv settings from the environment that would change what a lock holds: not taken
_UV_ENV_CHANGES_RESULT = (
    "UV_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_FIND_LINKS",
    "UV_PYTHON",
    "UV_CONSTRAINT",
    "UV_OVERRIDE",
    "UV_EXCLUDE_NEWER",
    "UV_PRERELEASE",
    "UV_RESOLUTION",
    "UV_NO_BINARY",
    "UV_NO_BUILD",
    "UV_TORCH_BACKEND",
    "UV_CONFIG_FILE",
)


def resolve_requirements(
    requirements: list[str], python: str, index_urls=(), *, no_deps: bool = False, exclude: tuple[str, ...] = ()
) -> list[tuple[str, str, str]]:
    """(name, version, sha256) of the wheels `requirements` resolve to for the hosts
    (cpython `python`, manylinux x86_64 up to GLIBC), by uv, whatever python runs this;
    one wheel per package: the one the hosts' pip would pick."""
    with tempfile.TemporaryDirectory(prefix="k26ops-lock-") as tmp:
        req, out = Path(tmp) / "requirements.in", Path(tmp) / "pylock.toml"
        req.write_text("".join(r + "\n" for r in requirements))
        cmd = [
            uv_bin(),
            "pip",
            "compile",
            "--quiet",
            "--no-config",
            "--no-python-downloads",
            "--python-version",
            python,
            "--python-platform",
            UV_PLATFORM,
            "--only-binary",
            ":all:",
            "--format",
            "pylock.toml",
            "--output-file",
            str(out),
            str(req),
        ]
        if no_deps:
            cmd.append("--no-deps")
        for u in index_urls:  # like pip's --extra-index-url: the best version over all indexes
            cmd += ["--extra-index-url", u]
        if index_urls:
            cmd += ["--index-strategy", "unsafe-best-match"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(_UV_ENV_CHANGES_RESULT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            errs = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
            raise UserError(
                "engine lock: resolving the engine's dependencies failed: "
                + (" ".join(errs)[:400] if errs else f"uv exited {proc.returncode}")
            )
        # lazy: tomllib only when a lock is made (engine lock), never in a deploy's start
        import tomllib

        data = tomllib.loads(out.read_text())
    skip = {_norm(e) for e in exclude}
    entries = []
    for pkg in data.get("packages", []):
        name, version = pkg["name"], pkg.get("version")
        if _norm(name) in skip:
            continue
        wheels = {w.get("name") or w.get("url", "").rsplit("/", 1)[-1]: w for w in pkg.get("wheels") or []}
        pick = best_wheel(wheels, python)
        if pick is None or not version:
            raise UserError(
                f"engine lock: {name}{'==' + version if version else ''} has no wheel for cpython "
                f"{python} on {platform_line(python)} (the hosts install wheels only)"
            )
        sha = (wheels[pick].get("hashes") or {}).get("sha256")
        if not sha:
            raise UserError(f"engine lock: the index gave no sha256 for {pick}; use an index that publishes hashes")
        entries.append((name, version, sha))
    return entries


def resolve(engine_wheel: Path, python: str, index_urls=()) -> list[tuple[str, str, str]]:
    """A git source: every wheel the engine wheel built from its commit needs on the
    hosts, the engine itself excluded."""
    dist = Path(engine_wheel).name.split("-")[0]
    return resolve_requirements(
        [f"{dist} @ {Path(engine_wheel).resolve().as_uri()}"], python, index_urls, exclude=(dist,)
    )


def requirement_lines(entries) -> list[str]:
    return [f"{n}=={v} --hash=sha256:{s}" for n, v, s in entries]
