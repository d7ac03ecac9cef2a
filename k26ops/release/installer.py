"""How a host installs a release's locked wheels into its venv: uv (default) or pip.

Why uv: on the real sglang 0.5.23 lock (206 wheels, 4.3 GB) it installs in a
fraction of pip's time (bench/release_install.py, bench/RESULTS.md), and it
links the files from a content-addressed store instead of copying them, so a
release shares every unchanged file with the previous one. The guarantee is
pip's: `--require-hashes --no-index --offline` from the pushed wheelhouse, so
only the locked bytes install and no index is reached from the host.

uv reaches hosts the way the wheels do: its PyPI wheel (a static binary in
`uv-VER.data/scripts/uv`) is pinned here by sha256, downloaded once into the
control node's wheelhouse and pushed (or relayed) with the release's wheels;
the host agent `store` checks its hash and unpacks the binary under
`<k26ops_root>/tools/`. The store is `<k26ops_root>/store` (uv's cache),
one per k26ops_root: two roots never share files. Its files are hard links
into the releases; the patch series replaces files (new inode), never edits
them in place, so the store keeps the wheels' own bytes.

Prune: deleting a release frees only the files it alone holds (one link);
`gc` then drops the store entries no release links any more.
`release_installer: pip` (inventory var) keeps pip's full copies.
"""

from __future__ import annotations

from k26ops.errors import UserError
from k26ops.hostvars import Var, declare
from k26ops.release import wheelhouse
from k26ops.shell import q

INSTALLERS = ("uv", "pip")
DEFAULT_INSTALLER = "uv"
declare(
    __name__,
    "installing a release",
    Var(
        "release_installer",
        "|".join(INSTALLERS),
        DEFAULT_INSTALLER,
        "what installs a release's locked wheels on the host: uv (links from <k26ops_root>/store) or pip",
    ),
)
UV_VERSION = "0.13.9"
# uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl (PyPI)
UV_SHA256 = "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"


def choice(hvars: dict, host: str = "") -> str:
    """The inventory's `release_installer` (default uv); a bad value is a user error."""
    val = hvars.get("release_installer", DEFAULT_INSTALLER)
    if val not in INSTALLERS:
        raise UserError(
            f"{host + ': ' if host else ''}inventory var release_installer: {val!r}: "
            f"choose one of {', '.join(INSTALLERS)}"
        )
    return val


def uv_lock_line() -> str:
    return f"uv=={UV_VERSION} --hash=sha256:{UV_SHA256}"


def uv_wheel():
    """uv's wheel in the control node's wheelhouse (downloaded once, hash-checked)."""
    return wheelhouse.ensure([uv_lock_line()], no_deps=True, hashes=True)[0]


def store_dir(root: str) -> str:
    return f"{root}/store"


def uv_path(root: str) -> str:
    return f"{root}/tools/uv-{UV_VERSION}-{UV_SHA256[:12]}/uv"


def install_command(installer: str, root: str, wheelhouse_dir: str, no_deps: bool, link_mode: str = "hardlink") -> str:
    """The shell command (run in the release dir, venv/ made) that installs
    k26ops/requirements.txt: only the hashed wheels, from the wheelhouse, no index.
    `link_mode`: clone (copy-on-write reflinks, where the store's filesystem has them: a
    release's file is its own) or hardlink (one inode shared by the store and its releases)."""
    nd = "--no-deps " if no_deps else ""
    if installer == "pip":
        return (
            f"venv/bin/python -m pip install -q --disable-pip-version-check --no-index "
            f"--find-links {q(wheelhouse_dir)} --require-hashes {nd}-r k26ops/requirements.txt"
        )
    return (
        f"UV_CACHE_DIR={q(store_dir(root))} UV_NO_CONFIG=1 {q(uv_path(root))} pip install -q --offline "
        f"--no-index --find-links {q(wheelhouse_dir)} --require-hashes {nd}--link-mode {q(link_mode)} "
        f"--python venv/bin/python -r k26ops/requirements.txt"
    )
