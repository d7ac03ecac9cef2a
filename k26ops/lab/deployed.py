"""The deployed layer: what a first `k26ops deploy` of the lab recipe writes on a
lab host, built once and cached, so that labs can boot hosts already deployed.

Why: a first deploy of a lab host (CUDA toolkit from pip, the release built and
installed) takes 20-70 s, and most lab tests need one only to reach a converged
host. Hosts already boot on an overlay of the shared rootfs; overlayfs stacks
lower layers, so this layer goes between the rootfs and each host's own upper
dir (`Lab.up(deployed=True)`) and costs nothing per host.

What it holds: only what a deploy writes that belongs to no host in particular,
`KEEP` below (k26ops_root, the env file dir and the engine unit with its enable
link). Never a host's identity: ssh host keys are bound in per host from the lab
dir, and /etc/machine-id, logs, the journal, root's ssh files and systemd's
state stay in the builder's upper dir, thrown away. k26ops' on-host state is
kept only where it names no host: the ownership marker and the pins; the lock's
owner record (a run's control node, pid) and the previous unit/env that a
rollback would restore are dropped, as after a clean run. The unit names the
builder's engine port; each host gets its own copy with its own port
(`host_unit`), so a deploy with the lab inventory finds it converged and the
engine stand-in starts fresh with the host's boot.

The cache key (`key`) is everything that changes what that deploy writes: the
lab recipe's release id (engine commit, lock, patch series, toolkit), the bytes
of the recipe, templates, playbooks, patches and the k26ops sources (steps,
agents, unit rendering, the lab's stand-ins and the engine stand-in's recorded start
phases), and the rootfs it was built on.
A layer is built in a temp dir and renamed into place when complete, under a
lock, so concurrent test runs build it once and never use a half-built one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from k26ops import resources
from k26ops.engine.host import STANDIN_PHASES
from k26ops.errors import UserError
from k26ops.lab import rootfs
from k26ops.layout import DEFAULT_ROOT, DEFAULT_UNIT, UNIT_DIR
from k26ops.release import recipe
from k26ops.steps.release import expected_state

LAYER_VERSION = 1  # bump when what the layer keeps or how it is built changes
META = ".k26ops-layer.json"
# What the layer keeps of the builder's upper dir (paths relative to /).
UNIT_PATH = f"{UNIT_DIR}/{DEFAULT_UNIT}".lstrip("/")
WANTS_LINK = f"{UNIT_DIR}/multi-user.target.wants/{DEFAULT_UNIT}".lstrip("/")
KEEP = (DEFAULT_ROOT.lstrip("/"), "etc/k26ops", UNIT_PATH, WANTS_LINK)
# Under k26ops_root: what one run or one host leaves (dropped from the layer).
DROP = ("state/lock.owner", "state/lock.owner.tmp", "state/service")
KEEP_NEWEST, KEEP_HOURS = 3, 3  # what a build keeps of older layers (_collect)


def cache_root() -> Path:
    return rootfs.cache_root().parent / "deployed"


def _sources() -> list[Path]:
    """Files whose bytes decide what a lab deploy writes (see the module doc)."""
    pkg = Path(__file__).resolve().parent.parent
    top = resources.root()
    files = [
        p
        for p in pkg.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.suffix not in (".pyc",)
        and "_data" not in p.relative_to(pkg).parts[:1]
    ]
    for sub in ("templates", "playbooks", "patches"):
        files += [p for p in (top / sub).rglob("*") if p.is_file()]
    if STANDIN_PHASES.is_file():  # the stand-in is installed with the recorded start phases filled in
        files.append(STANDIN_PHASES)
    return sorted(files)


def key(image: Path, recipe_name: str | Path = "lab") -> dict:
    """The cache key: the release id, the sources' digest, the rootfs image, the layer version.
    `recipe_name`: the lab recipe, or (tests) another copy of it."""
    release_id = expected_state(recipe.load(recipe_name))["release_id"]
    h = hashlib.sha256()
    for p in _sources():
        h.update("/".join(p.parts[-3:]).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return {
        "release_id": release_id,
        "sources": h.hexdigest()[:16],
        "rootfs": Path(image).name,
        "version": LAYER_VERSION,
    }


def layer_dir(k: dict) -> Path:
    digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"{k['release_id']}-{digest}"


def cached(k: dict) -> Path | None:
    """The complete layer for key `k`, or None. A layer is complete when its META
    names this very key (a dir left half-built, or built for another key, is not)."""
    d = layer_dir(k)
    try:
        return d if json.loads((d / META).read_text()).get("key") == k else None
    except (OSError, ValueError):
        return None


def ensure(image: Path, build, log=lambda m: None, recipe_name: str | Path = "lab") -> Path:
    """The deployed layer for the current key, built (once, under a lock) if missing.
    `build(dest, log)` fills `dest` (the lab's `machines.build_layer`: a real lab deploy;
    passed in, since the lab machinery sits above this cache)."""
    k = key(image, recipe_name)
    found = cached(k)
    if found is None:
        cache_root().mkdir(parents=True, exist_ok=True)
        with open(cache_root() / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it: wait, then look again
            found = cached(k)
            if found is None:
                found = _build(k, build, log)
    os.utime(found / META)  # last use, for _collect
    return found


def _build(k: dict, build, log) -> Path:
    target = layer_dir(k)
    work = target.with_name(target.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)  # a dir of this name without a complete META
    work.mkdir(parents=True)
    try:
        meta = build(work, log) or {}
        (work / META).write_text(json.dumps({**meta, "key": k}, indent=1) + "\n")
        work.rename(target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _collect(keep=target, log=log)
    return target


def _collect(keep: Path, log) -> None:
    """Remove old layers (and half-built ones): all but the KEEP_NEWEST last used, among
    those no lab booted on for KEEP_HOURS (a layer is ~600 MB and every change of the
    k26ops sources makes a new one; a lab still running on an old one booted recently)."""
    dirs = []
    for d in cache_root().iterdir():
        if d != keep and d.is_dir():
            try:
                dirs.append((((d / META) if (d / META).exists() else d).stat().st_mtime, d))
            except OSError:
                continue
    cutoff = time.time() - KEEP_HOURS * 3600
    for used, d in sorted(dirs, reverse=True)[KEEP_NEWEST - 1 :]:
        if used < cutoff:
            shutil.rmtree(d, ignore_errors=True)
            log(f"removed the deployed lab layer {d.name} (unused for {KEEP_HOURS} h)")


def host_unit(layer: Path, engine_port: int) -> str:
    """The layer's engine unit with this host's engine port (the one thing in it
    that names a host: see the module doc)."""
    meta = json.loads((layer / META).read_text())
    text = (layer / UNIT_PATH).read_text()
    new, n = re.subn(rf"^(ExecStart=.* --port ){meta['engine_port']}$", rf"\g<1>{engine_port}", text, flags=re.M)
    if n != 1:
        raise UserError(
            f"deployed lab layer {layer}: its unit's ExecStart does not end in "
            f"--port {meta['engine_port']}; remove the layer to rebuild it"
        )
    return new


def place_host_unit(layer: Path, upper: Path, engine_port: int) -> None:
    """Write this host's unit into its (not yet mounted) upper dir, over the layer's."""
    unit = upper / UNIT_PATH
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(host_unit(layer, engine_port))
    shutil.copymode(layer / UNIT_PATH, unit)
