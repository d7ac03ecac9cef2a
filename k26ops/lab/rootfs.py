"""The lab's base root filesystem: Debian built once with debootstrap, cached.

The cache key is a hash of the recipe (suite, mirror, packages, customisation
version), so changing the recipe rebuilds it and nothing else does. A build
goes into a temporary directory and is renamed into place when complete, so
an interrupted build is never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from k26ops.errors import UserError

SUITE = "bookworm"
# What a GPU host has for k26ops' purposes: systemd as PID 1, sshd, python3
# with venv, TLS roots, tar and git; g++ because nvcc needs a host compiler;
# sudo because real hosts are often reached as a sudoer (inventory `become`).
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "ca-certificates",
    "tar",
    "git",
    "iproute2",
    "procps",
    "g++",
    "curl",
    "sudo",
    "rsync",  # `k26ops model sync` moves shards host to host with it (docs/how-to/weights-sync.md)
]
CUSTOMISE_VERSION = 2  # bump when _customise changes
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def cache_root() -> Path:
    return Path(os.environ.get("K26OPS_ROOTFS_CACHE", "/var/cache/k26ops/rootfs"))


def host_mirror() -> str:
    """The Debian mirror this machine's own apt sources name."""
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in candidates:
        text = path.read_text(errors="replace")
        for block in text.split("\n\n"):
            if re.search(r"^Suites:.*\bbookworm\b(?!-)", block, re.M) or "Suites: bookworm\n" in block:
                m = re.search(r"^URIs:\s*(\S+)", block, re.M)
                if m and "security" not in m.group(1):
                    return m.group(1)
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if m:
                    return m.group(1)
    return DEFAULT_MIRROR


def recipe() -> dict:
    return {"suite": SUITE, "mirror": host_mirror(), "packages": PACKAGES, "customise": CUSTOMISE_VERSION}


def recipe_hash(r: dict | None = None) -> str:
    blob = json.dumps(r or recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _remove_stale_ephemeral_copies(log) -> None:
    """Delete whole-rootfs copies that `nspawn --ephemeral` (what earlier
    k26ops labs booted with) left in the cache when a host was killed: about 760 MB each,
    and they filled a CI disk. nspawn holds a BSD lock on `.#<copy>.lck` while
    a copy is in use, so a copy whose lock we can take is garbage."""
    root = cache_root()
    if not root.is_dir():
        return
    for copy in root.glob(".#machine.*"):
        lock = root / f".#{copy.name}.lck"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a running host still uses it
        try:
            shutil.rmtree(copy, ignore_errors=True)
            lock.unlink(missing_ok=True)
            log(f"removed a stale ephemeral host copy {copy.name} from the rootfs cache")
        finally:
            os.close(fd)


def ensure(log=print) -> Path:
    """Return the cached root filesystem for the current recipe, building it if needed."""
    r = recipe()
    target = cache_root() / f"debian-{SUITE}-{recipe_hash(r)}"
    _remove_stale_ephemeral_copies(log)
    if (target / ".k26ops-rootfs.json").exists():
        return target
    if not shutil.which("debootstrap"):
        raise UserError("debootstrap is missing: apt-get install debootstrap")
    cache_root().mkdir(parents=True, exist_ok=True)
    work = target.with_name(target.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    log(f"building lab root filesystem {target.name} with debootstrap from {r['mirror']} (about 1-2 min, once)")
    cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(work), r["mirror"]]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
        shutil.rmtree(work, ignore_errors=True)
        raise UserError(f"debootstrap failed (exit {proc.returncode}): {tail}")
    _customise(work)
    (work / ".k26ops-rootfs.json").write_text(json.dumps(r, indent=1) + "\n")
    work.rename(target)
    return target


def _customise(root: Path) -> None:
    """Make the image boot cleanly as a lab host."""
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").touch(mode=0o600)
    # Each host gets its own host key from the lab (bound in); the image's own
    # keys would otherwise be shared by every host.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/ssh/k26ops").mkdir(exist_ok=True)
    (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    # Quiet boot: nothing in a container needs these.
    for unit in ("systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        link = root / "etc/systemd/system/timers.target.wants" / unit
        if link.is_symlink():
            link.unlink()
    # The journal lives in /run: a lab host is thrown away anyway, and under a
    # loaded CI machine systemd-journal-flush (moving it to /var/log on the
    # overlay) once failed, leaving a host "degraded" at boot.
    conf = root / "etc/systemd/journald.conf.d"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "k26ops-lab.conf").write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=64M\n")
    (root / "etc/hostname").write_text("lab\n")
