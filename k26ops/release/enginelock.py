"""The engine's dependency lock: every wheel the engine needs besides itself,
by exact version and sha256, for one target platform.

Why a committed file: the dependency pins must be the ones the engine commit
itself declares (its pyproject), resolved once for the hosts' platform
(cpython X.Y, manylinux x86_64), reviewed as a diff, and installed on hosts
with `pip --require-hashes --no-index`, so a host can only ever get exactly
those bytes. `k26ops engine lock` makes it (pip's own resolver, dry run with a
JSON report); a deploy only reads it and refuses when it does not belong to the
recipe's source commit.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import UserError

HEADER = ("# k26ops engine lock: made by `k26ops engine lock {recipe}`; commit it beside the recipe\n"
          "# and review changes as a diff. Hosts install exactly these wheels (pip --require-hashes\n"
          "# --no-index) plus the engine wheel built from the source commit below.\n")
_KEYS = ("source", "commit", "subdir", "engine", "python", "platform")
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
    from k26ops.release.wheelhouse import PLATFORMS
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
                raise UserError(f"{path}:{start}: not a lock entry `name==version --hash=sha256:HEX`: "
                                f"{logical.strip()[:80]!r}")
            entries.append((m.group(1), m.group(2), m.group(3)))
            logical = ""
        if raw.strip():
            if not logical:
                start = n
            logical += " " + raw.strip().rstrip("\\")
    for key in ("commit", "python"):
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


def render(recipe_name: str, meta: dict[str, str], entries) -> str:
    out = [HEADER.format(recipe=recipe_name)]
    out += [f"# {k}: {meta[k]}\n" for k in _KEYS if k in meta]
    for name, version, sha in sorted(entries, key=lambda e: e[0].lower()):
        out.append(f"{name}=={version} \\\n    --hash=sha256:{sha}\n")
    return "".join(out)


def resolve(engine_wheel: Path, python: str, index_urls=()) -> list[tuple[str, str, str]]:
    """(name, version, sha256) of every wheel the engine wheel needs on the hosts'
    platform, from pip's resolver (dry run, JSON report); the engine itself excluded."""
    with tempfile.TemporaryDirectory(prefix="k26ops-lock-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--dry-run",
               "--ignore-installed", "--report", str(report), "--only-binary=:all:", "--implementation", "cp",
               "--python-version", python, "--target", str(Path(tmp) / "t")]
        for p in platforms():
            cmd += ["--platform", p]
        for u in index_urls:
            cmd += ["--extra-index-url", u]
        proc = subprocess.run(cmd + [str(engine_wheel)], capture_output=True, text=True)
        if proc.returncode != 0:
            errs = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
            raise UserError("engine lock: resolving the engine's dependencies failed: "
                            + (errs[-1] if errs else proc.stderr.strip()[-300:]))
        data = json.loads(report.read_text())
    out = []
    for item in data.get("install", []):
        if item.get("is_direct"):
            continue  # the engine wheel itself
        md, info = item["metadata"], item.get("download_info") or {}
        sha = ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256")
        if not sha:
            raise UserError(f"engine lock: the index gave no sha256 for {md['name']}=={md['version']}; "
                            "use an index that publishes hashes")
        out.append((md["name"], md["version"], sha))
    return out


def requirement_lines(entries) -> list[str]:
    return [f"{n}=={v} --hash=sha256:{s}" for n, v, s in entries]
