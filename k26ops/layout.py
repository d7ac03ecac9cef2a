"""Where k26ops keeps its files on a host (`Layout`, all under `k26ops_root`), the
engine unit's default name and port: the names every layer needs, with no
dependency of their own beyond the error type."""

from __future__ import annotations

from dataclasses import dataclass

from k26ops.errors import UserError
from k26ops.hostvars import Var, declare
from k26ops.shell import q

DEFAULT_ROOT = "/opt/k26ops"
DEFAULT_UNIT = "k26-engine.service"
DEFAULT_PORT = 30000
UNIT_DIR = "/etc/systemd/system"
LAB_MODULE = "k26ops_lab_engine"
PASS_ENV = ("HF_TOKEN",)
# `nvlink_multicast: false`: NCCL's NVLink SHARP, torch symmetric memory's and NVSHMEM's multicast off
NVLS_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}  # taken from the control node's environment when the inventory lacks it

declare(
    __name__,
    "where things live on the host",
    Var("k26ops_root", "path", DEFAULT_ROOT, "k26ops' directory on the host (state, toolchain, locks)"),
    Var(
        "releases_root",
        "path",
        None,
        "where releases are built; `current` points at the live one",
        "{k26ops_root}/releases",
    ),
)


@dataclass(frozen=True)
class Layout:
    """What k26ops keeps on a host, all under `k26ops_root` (releases under `releases_root`)."""

    root: str = DEFAULT_ROOT
    releases_root: str = f"{DEFAULT_ROOT}/releases"

    @classmethod
    def of(cls, hvars: dict) -> "Layout":
        root = str(hvars.get("k26ops_root") or DEFAULT_ROOT)
        return cls(root, str(hvars.get("releases_root") or f"{root}/releases"))

    @property
    def current(self) -> str:
        return f"{self.releases_root}/current"

    @property
    def state_dir(self) -> str:
        """The host lock, its owner file, the previous unit/env file, the pins."""
        return f"{self.root}/state"

    @property
    def last_start_file(self) -> str:
        """The last engine start k26ops made here: its time to first good token (bench's `@start` figures)."""
        return f"{self.state_dir}/last-start.json"

    @property
    def pins_file(self) -> str:
        """Releases that baselines need: prune never removes them (one id a line)."""
        return f"{self.state_dir}/pinned-releases"

    @property
    def toolchain_dir(self) -> str:
        return f"{self.root}/toolchain"

    @property
    def wheelhouse_dir(self) -> str:
        return f"{self.root}/wheelhouse"

    @property
    def lab_module_dir(self) -> str:
        """Where a `lab: true` host gets the engine stand-in (on its PYTHONPATH)."""
        return f"{self.root}/lab"


def check_unit_name(name: str) -> str:
    if "/" in name or not name.endswith(".service") or len(name) < 9:
        raise UserError(f"engine unit name must be NAME.service, got {name!r}")
    return name


def switch_current(releases_root: str, release: str, require_manifest: bool = True) -> str:
    """The shell command that makes `release` (a directory in releases_root, or a path) the
    current one: a temp symlink renamed over `current` (rename(2) is atomic: a reader sees
    the old release or the new one, never none). `require_manifest`: refuse a release whose
    build did not finish (it writes manifest.json last)."""
    check = f"test -f {q(release)}/manifest.json; " if require_manifest else ""
    # `current` that is not a symlink (a directory someone made): named, nothing switched, no
    # .current.tmp left (mv -T would say only "cannot overwrite directory")
    where = q(f"{releases_root}/current")
    return (
        f"set -e; cd {q(releases_root)}; {check}"
        f"if [ -e current ] && [ ! -L current ]; then echo {where}' is not a symlink (a directory or file "
        "made by hand?): move it aside; current was not switched' >&2; exit 3; fi; "
        f"ln -sfn {q(release)} .current.tmp; mv -T .current.tmp current || {{ rm -f .current.tmp; exit 1; }}"
    )
