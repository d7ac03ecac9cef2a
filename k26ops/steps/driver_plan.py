"""Which NVIDIA driver packages a host needs, from where: pure functions.

Supported: Ubuntu 22.04 and 24.04, Debian 12. Two sources
(`nvidia_driver_source`), see docs/how-to/driver.md for the NVIDIA pages each fact
was checked against:

- `distro` (Ubuntu's default): Ubuntu's restricted archive,
  `nvidia-driver-<branch>-open` (open kernel modules, DKMS) and, on NVSwitch
  hosts, `nvidia-fabricmanager-<branch>`. Debian 12's own packages
  (`nvidia-driver`, `nvidia-open-kernel-dkms` in non-free/contrib) are 535,
  below CUDA 13's 580: refused with the repository to use instead.
- `nvidia` (Debian 12's default): NVIDIA's CUDA apt repository
  (https://developer.download.nvidia.com/compute/cuda/repos/<dist>/x86_64/,
  added with its cuda-keyring package), the `nvidia-open` meta-package
  held on the branch by an apt preferences pin (the distribution's own
  version-locking mechanism, as NVIDIA's "Version locking" page says), and
  `cuda-drivers-fabricmanager-<branch>` on NVSwitch hosts.
"""

from __future__ import annotations

REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"
KEYRING = "cuda-keyring_1.1-1_all.deb"
PIN_FILE = "/etc/apt/preferences.d/k26ops-nvidia-driver"
SUPPORTED = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")}
DEBIAN12_OWN = "535"  # bookworm's nvidia-driver / nvidia-open-kernel-dkms branch (packages.debian.org)


class PlanError(Exception):
    """The host or inventory asks for something the driver step cannot do; one line."""


def distribution(osr: dict) -> tuple[str, str]:
    dist = (str(osr.get("id") or ""), str(osr.get("version_id") or ""))
    if dist not in SUPPORTED:
        raise PlanError(
            f"{osr.get('pretty_name') or 'unknown distribution'}: the driver step supports "
            "Ubuntu 22.04/24.04 and Debian 12"
        )
    return dist


def default_source(dist: tuple[str, str]) -> str:
    return "distro" if dist[0] == "ubuntu" else "nvidia"


def repo_url(dist: tuple[str, str]) -> str:
    return f"{REPO_BASE}/{dist[0]}{dist[1].replace('.', '')}/x86_64"


def packages(dist: tuple[str, str], source: str, branch: int, fabric: bool) -> list[str]:
    """The packages to install (the first is the driver's own)."""
    if source == "distro":
        if dist[0] != "ubuntu":
            raise PlanError(
                f"Debian 12's own NVIDIA driver packages are {DEBIAN12_OWN}, below the pinned "
                f"branch {branch}: set nvidia_driver_source: nvidia (NVIDIA's CUDA repository, "
                f"{repo_url(dist)})"
            )
        return [f"nvidia-driver-{branch}-open"] + ([f"nvidia-fabricmanager-{branch}"] if fabric else [])
    if source == "nvidia":
        return ["nvidia-open"] + ([f"cuda-drivers-fabricmanager-{branch}"] if fabric else [])
    raise PlanError(f"nvidia_driver_source {source!r}: use distro or nvidia")


def pin_text(branch: int) -> str:
    """apt preferences holding NVIDIA's driver packages on one branch."""
    return (
        "# k26ops: hold the NVIDIA driver on branch %d (nvidia_driver_branch)\n"
        "Package: nvidia-* libnvidia-* cuda-drivers* libcuda1 libxnvctrl0 firmware-nvidia-gsp\n"
        "Pin: version %d.*\n"
        "Pin-Priority: 1001\n" % (branch, branch)
    )


def parse_policy(stdout: str) -> dict[str, dict]:
    """`apt-cache policy A B ...` -> {name: {"installed", "candidate"}} ("(none)" -> None).
    Names apt does not know print nothing and are absent."""
    out, cur = {}, None
    for line in stdout.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            cur = line.rstrip()[:-1]
            out[cur] = {"installed": None, "candidate": None}
        elif cur and line.strip().startswith(("Installed:", "Candidate:")):
            key, _, value = line.strip().partition(":")
            value = value.strip()
            out[cur][key.lower()] = None if value in ("(none)", "") else value
    return out


def branch_of(version: str | None) -> int | None:
    """'580.95.05-0ubuntu1' / '580.95.05' -> 580; epochs ('1:580...') allowed."""
    if not version:
        return None
    head = version.split(":", 1)[-1].split(".", 1)[0]
    return int(head) if head.isdigit() else None
