"""The wheelhouse: every wheel a release needs, downloaded once on the control
node (cached, sha256 recorded), then pushed to hosts that install with no index.

N hosts cost one download; hosts need no internet. A download set is keyed by
what it resolves (requirements, --no-deps, target python and platform), taken
under a file lock so parallel hosts wait for one download instead of racing.
Every real download is appended to `downloads.log` (the tests count them).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import StepFailed, UserError
from k26ops.shell import q
from k26ops.transport.ssh import Session

PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(17, 40)] + ["manylinux2014_x86_64", "linux_x86_64"]


def cache_root() -> Path:
    return Path(os.environ.get("K26OPS_WHEELHOUSE") or Path.home() / ".cache/k26ops/wheelhouse")


@dataclass(frozen=True)
class Wheel:
    name: str
    sha256: str
    size: int
    path: Path


def file_sha256(path: Path) -> str:
    """A file's sha256, read in 1 MB chunks (wheels are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure(requirements: list[str], *, no_deps: bool, python: str = "3.11", hashes: bool = False) -> list[Wheel]:
    """The wheels for `requirements` (downloaded once; cached by content of the request).

    hashes=True: the requirements are lock lines (`name==ver --hash=sha256:...`);
    pip downloads exactly those files and refuses any other bytes."""
    key_doc = {"req": sorted(requirements), "no_deps": no_deps, "python": python, "platforms": PLATFORMS}
    if hashes:
        key_doc["hashes"] = True
        if not requirements:
            return []
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_root()
    d = root / key
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = d / "manifest.json"
        if not manifest.exists():
            _download(d, requirements, no_deps, python, hashes)
            wheels = [
                {"name": p.name, "sha256": file_sha256(p), "size": p.stat().st_size} for p in sorted(d.glob("*.whl"))
            ]
            manifest.write_text(json.dumps({"request": key_doc, "wheels": wheels}, indent=1))
            with open(root / "downloads.log", "a") as log:
                log.write(
                    json.dumps(
                        {
                            "time": time.time(),
                            "key": key,
                            "requirements": requirements,
                            "bytes": sum(w["size"] for w in wheels),
                        }
                    )
                    + "\n"
                )
        data = json.loads(manifest.read_text())
    return [Wheel(w["name"], w["sha256"], w["size"], d / w["name"]) for w in data["wheels"]]


def _download(d: Path, requirements: list[str], no_deps: bool, python: str, hashes: bool = False) -> None:
    tmp = d.with_name(d.name + ".partial")
    if tmp.exists():
        for p in tmp.iterdir():
            p.unlink()
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "-d",
        str(tmp),
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    if no_deps:
        cmd.append("--no-deps")
    if hashes:
        reqs = d.with_name(d.name + ".requirements.txt")
        reqs.write_text("".join(r + "\n" for r in requirements))
        args, shown = ["--require-hashes", "-r", str(reqs)], f"the {len(requirements)} locked wheels"
    else:
        args, shown = list(requirements), " ".join(requirements)
    proc = subprocess.run(cmd + args, capture_output=True, text=True)
    if proc.returncode != 0:
        errs = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        raise UserError(f"pip download {shown} failed: " + (errs[-1] if errs else proc.stderr.strip()[-300:]))
    tmp.rename(d)


def requirements_file(wheels: list[Wheel]) -> str:
    """What a host installs: every wheel pinned to its version and sha256, so
    `pip install --require-hashes --no-index` can only take these bytes."""
    lines = []
    for w in sorted(wheels, key=lambda w: w.name):
        name, version = wheel_name_version(w.name)
        # `===`: exactly this version string (`==0.5.23` would also take 0.5.23+lab)
        lines.append(f"{name}==={version} --hash=sha256:{w.sha256}\n")
    return "".join(lines)


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(distribution, version) from `name-version-python-abi-platform.whl` (PEP 427)."""
    parts = filename[: -len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) < 5:
        raise UserError(f"{filename}: not a wheel file name (name-version-python-abi-platform.whl)")
    return parts[0], parts[1]


def missing(session: Session, wheels: list[Wheel], remote_dir: str) -> list[Wheel]:
    """The wheels the host's `remote_dir` lacks (by name and sha256)."""
    names = " ".join(q(w.name) for w in wheels)
    res = session.run(
        f"mkdir -p {q(remote_dir)} && cd {q(remote_dir)} && "
        f'for f in {names}; do [ -f "$f" ] && sha256sum "$f"; done; true',
        check=True,
    )
    have = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            have[parts[1]] = parts[0]
    return [w for w in wheels if have.get(w.name) != w.sha256]


def push(session: Session, wheels: list[Wheel], remote_dir: str) -> list[str]:
    """Upload the wheels the host lacks (by sha256); return the names uploaded."""
    todo = missing(session, wheels, remote_dir)
    need_free(session, remote_dir, sum(w.size for w in todo), "the wheels to upload")
    sent = []
    for w in todo:
        session.put_file(w.path, f"{remote_dir}/{w.name}")
        sent.append(w.name)
    return sent


def need_free(session: Session, directory: str, need: int, what: str) -> None:
    """Refuse, in one line naming the directory and the bytes, before writing
    `need` bytes where there is not room (a half-written upload helps nobody)."""
    if need <= 0:
        return
    res = session.run(f"df -P -B1 -- {q(directory)} 2>/dev/null | awk 'NR==2 {{print $4}}'")
    free = res.stdout.strip()
    if free.isdigit() and int(free) < need:
        raise StepFailed(
            f"not enough disk space for {what} in {directory}: needs {need:,} bytes, {int(free):,} bytes free"
        )
