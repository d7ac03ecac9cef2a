"""Driver-layer facts: the loaded kernel module and its flavour, NVSwitches,
the NVIDIA daemons, installed driver packages and a pending reboot.

Why: the driver step decides from these whether a host is already on the
pinned branch with the open kernel modules (Blackwell needs them), whether it
needs nvidia-fabricmanager (NVSwitch hosts such as HGX B300), and whether the
modules that run are the ones installed (a driver change waits for a reboot).
Sources, all readable without extra tools: /proc/driver/nvidia/version (the
loaded module; "Open Kernel Module" names the open flavour), `modinfo` (the
installed module: licence "Dual MIT/GPL" is the open flavour, "NVIDIA" the
proprietary one), sysfs PCI (class 0x0680 "bridge" NVIDIA devices are
NVSwitches), `systemctl show`, dpkg and /var/run/reboot-required.
"""

from __future__ import annotations

import re

from k26ops.facts.base import Fact, command_missing, first_line, safe, split_marked

SEP = "--- k26ops:"
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")


def _sections(stdout: str) -> dict[str, str]:
    """Split `--- k26ops:NAME` separated output; text before the first is "head"."""
    return split_marked(stdout, SEP, "head")


def flavour_of_license(lic: str | None) -> str | None:
    if not lic:
        return None
    if "MIT" in lic or "GPL" in lic:
        return "open"
    if lic.strip() == "NVIDIA":
        return "proprietary"
    return None


def parse_proc_version(text: str) -> dict:
    """/proc/driver/nvidia/version -> {"loaded", "version", "flavour"}."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            words = line.split()
            after = words[words.index("Module") + 1 :] if "Module" in words else words
            version = next((w for w in after if VERSION_RE.match(w)), None)
            flavour = "open" if "Open Kernel Module" in line else "proprietary"
            return {"loaded": True, "version": version, "flavour": flavour}
    return {"loaded": False, "version": None, "flavour": None}


@safe
def parse_nvidia_module(stdout: str, rc: int) -> dict:
    """The loaded module (/proc) and the installed one (modinfo), and whether they differ."""
    s = _sections(stdout)
    loaded = parse_proc_version(s.get("head", ""))
    mod = s.get("modinfo", "")
    installed = {"version": None, "license": None, "flavour": None, "known": False}
    if mod.strip() and not command_missing(mod, 0):
        lines = [ln.strip() for ln in mod.splitlines() if ln.strip()]
        if lines and "not found" in lines[0].lower():  # modinfo: ERROR: Module nvidia not found.
            installed["known"] = True
        elif len(lines) >= 2 and VERSION_RE.match(lines[0]):
            installed.update(version=lines[0], license=lines[1], flavour=flavour_of_license(lines[1]), known=True)
    pending = bool(loaded["version"] and installed["version"] and loaded["version"] != installed["version"])
    return {
        "loaded": loaded["loaded"],
        "loaded_version": loaded["version"],
        "flavour": loaded["flavour"],
        "installed_version": installed["version"],
        "installed_flavour": installed["flavour"],
        "installed_known": installed["known"],
        "mismatch": pending,
        "error": None,
    }


@safe
def parse_nvswitch(stdout: str, rc: int) -> dict:
    """sysfs NVIDIA PCI devices ("BDF CLASS DEVICE" lines) and /dev/nvidia-nvswitch* nodes."""
    s = _sections(stdout)
    gpus, switches = [], []
    for line in s.get("head", "").splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[1].startswith("0x"):
            continue
        cls = parts[1].lower()
        if cls.startswith(("0x0300", "0x0302")):
            gpus.append(parts[0])
        elif cls.startswith("0x0680"):
            switches.append(parts[0])
    nodes = [
        n
        for n in s.get("dev", "").split()
        if n.startswith("/dev/nvidia-nvswitch") and n[len("/dev/nvidia-nvswitch") :].isdigit()
    ]
    return {
        "present": bool(switches or nodes),
        "pci_switches": switches,
        "dev_nodes": nodes,
        "pci_gpus": gpus,
        "error": None,
    }


@safe
def parse_systemctl_show(stdout: str, rc: int) -> dict:
    """`systemctl show -p Id,LoadState,... A B` -> {unit: {LoadState, ActiveState, ..., "present"}}."""
    if command_missing(stdout, rc):
        return {"error": "systemctl not found"}
    units, cur = {}, {}
    for line in stdout.splitlines() + [""]:
        if not line.strip():
            if cur.get("Id"):
                cur["present"] = cur.get("LoadState") == "loaded"
                units[cur["Id"]] = cur
            cur = {}
            continue
        key, eq, value = line.partition("=")
        if eq:
            cur[key] = value
    if not units:
        return {"error": "unexpected systemctl show output: " + (first_line(stdout)[:200] or f"exit {rc}")}
    return {"units": units, "error": None}


@safe
def parse_packages(stdout: str, rc: int) -> dict:
    """dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}' -> installed {name: version}."""
    if command_missing(stdout, rc):
        return {"installed": {}, "dpkg": False, "error": None}
    installed = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith("ii"):
            installed[parts[0]] = parts[1]
    return {"installed": installed, "dpkg": True, "error": None}


@safe
def parse_reboot_required(stdout: str, rc: int) -> dict:
    """Debian/Ubuntu's /var/run/reboot-required flag and the packages that set it."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    required = bool(lines) and lines[0] == "required"
    return {"required": required, "packages": lines[1:] if required else [], "error": None}


SERVICES = ("nvidia-persistenced.service", "nvidia-fabricmanager.service")
PACKAGE_GLOBS = ("nvidia-*", "libnvidia-*", "cuda-drivers*", "cuda-keyring")

FACTS = {
    "nvidia_module": Fact(
        "nvidia_module",
        f"cat /proc/driver/nvidia/version 2>&1; echo '{SEP}modinfo'; "
        "modinfo -F version nvidia 2>&1 && modinfo -F license nvidia 2>&1",
        parse_nvidia_module,
    ),
    "nvswitch": Fact(
        "nvswitch",
        'for d in /sys/bus/pci/devices/*; do [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && '
        'echo "${d##*/} $(cat "$d/class") $(cat "$d/device")"; done; '
        f"echo '{SEP}dev'; ls -1d /dev/nvidia-nvswitch* 2>/dev/null; true",
        parse_nvswitch,
    ),
    "nvidia_services": Fact(
        "nvidia_services",
        "systemctl show -p Id -p LoadState -p ActiveState -p SubState -p UnitFileState " + " ".join(SERVICES) + " 2>&1",
        parse_systemctl_show,
    ),
    "driver_packages": Fact(
        "driver_packages",
        "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' "
        + " ".join(f"'{g}'" for g in PACKAGE_GLOBS)
        + " 2>/dev/null; "
        "command -v dpkg-query >/dev/null || echo 'dpkg-query: not found'",
        parse_packages,
    ),
    "reboot_required": Fact(
        "reboot_required",
        "if [ -e /var/run/reboot-required ]; then echo required; "
        "cat /var/run/reboot-required.pkgs 2>/dev/null; fi; true",
        parse_reboot_required,
    ),
}
