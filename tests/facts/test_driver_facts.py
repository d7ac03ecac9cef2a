"""Driver-layer facts on recorded outputs (tests/data/facts, MANIFEST.json), the
package plan's pure parts and the rolling batches. No lab needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k26ops.facts import driver
from k26ops.orchestrate.rollout import canary_batches
from k26ops.steps import driver_plan as dp
from k26ops.steps.driver import verify

DATA = Path(__file__).parent.parent / "data" / "facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
SEP = driver.SEP


def text(name: str) -> str:
    return (DATA / name).read_text()


def module_output(proc: str, modinfo: str) -> str:
    """The nvidia_module fact's stdout: the /proc file, the separator, modinfo's output."""
    return text(proc) + f"{SEP}modinfo\n" + text(modinfo)


def test_open_module_loaded_on_the_recorded_h200():
    v = driver.parse_nvidia_module(module_output("h200x1-proc-driver-version.txt", "h200x1-modinfo-missing.txt"), 127)
    assert v == {
        "loaded": True,
        "loaded_version": "580.159.04",
        "flavour": "open",
        "installed_version": None,
        "installed_flavour": None,
        "installed_known": False,
        "mismatch": False,
        "error": None,
    }


def test_proprietary_module_and_its_licence():
    v = driver.parse_nvidia_module(
        module_output("constructed-proc-driver-version-proprietary.txt", "constructed-modinfo-proprietary.txt"), 0
    )
    assert (v["loaded_version"], v["flavour"]) == ("535.104.05", "proprietary")
    assert (v["installed_version"], v["installed_flavour"], v["mismatch"]) == ("535.104.05", "proprietary", False)


def test_installed_module_newer_than_the_loaded_one_is_a_pending_reboot():
    v = driver.parse_nvidia_module(module_output("h200x1-proc-driver-version.txt", "constructed-modinfo-open.txt"), 0)
    assert (v["loaded_version"], v["installed_version"], v["installed_flavour"]) == ("580.159.04", "580.95.05", "open")
    assert v["mismatch"] is True


def test_no_module_in_a_lab_container():
    v = driver.parse_nvidia_module(text("lab-nvidia-module.txt"), MANIFEST["lab-nvidia-module.txt"]["rc"])
    assert (v["loaded"], v["loaded_version"], v["flavour"], v["installed_known"]) == (False, None, None, False)


def test_modinfo_without_the_module():
    v = driver.parse_nvidia_module(
        f"cat: x: No such file or directory\n{SEP}modinfo\nmodinfo: ERROR: Module nvidia not found.\n", 1
    )
    assert v["installed_known"] is True and v["installed_version"] is None


def test_nvswitch_absent_on_the_recorded_h200_and_present_on_hgx():
    v = driver.parse_nvswitch(text("h200x1-sys-pci-nvidia.txt") + f"{SEP}dev\n", 0)
    assert (v["present"], v["pci_gpus"], v["pci_switches"]) == (False, ["0000:00:06.0"], [])
    v = driver.parse_nvswitch(text("constructed-hgx-nvswitch-sysfs.txt"), 0)
    assert v["present"] is True and len(v["pci_gpus"]) == 8 and len(v["pci_switches"]) == 4
    assert v["dev_nodes"] == [f"/dev/nvidia-nvswitch{i}" for i in range(4)]  # not nvidia-nvswitchctl


def test_systemctl_show_units_not_found_and_running():
    v = driver.parse_systemctl_show(text("lab-systemctl-show-nvidia.txt"), 0)
    assert set(v["units"]) == {"nvidia-persistenced.service", "nvidia-fabricmanager.service"}
    assert all(u["present"] is False and u["LoadState"] == "not-found" for u in v["units"].values())
    v = driver.parse_systemctl_show(text("lab-systemctl-show-ssh.txt"), 0)
    assert v["units"]["ssh.service"] == {
        "Id": "ssh.service",
        "LoadState": "loaded",
        "ActiveState": "active",
        "SubState": "running",
        "UnitFileState": "enabled",
        "present": True,
    }
    assert driver.parse_systemctl_show("sh: 1: systemctl: not found\n", 127) == {"error": "systemctl not found"}


def test_packages_only_installed_ones():
    assert driver.parse_packages(text("h200x1-dpkg-query-nvidia.txt"), 1)["installed"] == {}
    v = driver.parse_packages("nvidia-fabricmanager-580 580.95.05-0ubuntu1 ii \nnvidia-open 580.95.05-1 rc \n", 0)
    assert v["installed"] == {"nvidia-fabricmanager-580": "580.95.05-0ubuntu1"}


def test_reboot_required_flag():
    assert driver.parse_reboot_required("", 0) == {"required": False, "packages": [], "error": None}
    assert driver.parse_reboot_required("required\nnvidia-dkms-580\n", 0)["packages"] == ["nvidia-dkms-580"]


def test_apt_cache_policy_on_the_lab_sources():
    assert dp.parse_policy(text("lab-apt-cache-policy.txt")) == {
        "nvidia-driver": {"installed": None, "candidate": None}
    }
    v = dp.parse_policy("nvidia-driver-580-open:\n  Installed: (none)\n  Candidate: 580.95.05-0ubuntu0.24.04.2\n")
    assert dp.branch_of(v["nvidia-driver-580-open"]["candidate"]) == 580


@pytest.mark.parametrize(
    "osr,source,fabric,want",
    [
        (
            {"id": "ubuntu", "version_id": "24.04"},
            "distro",
            True,
            ["nvidia-driver-580-open", "nvidia-fabricmanager-580"],
        ),
        ({"id": "ubuntu", "version_id": "22.04"}, "nvidia", False, ["nvidia-open"]),
        ({"id": "debian", "version_id": "12"}, "nvidia", True, ["nvidia-open", "cuda-drivers-fabricmanager-580"]),
    ],
)
def test_package_names_per_distribution_and_source(osr, source, fabric, want):
    dist = dp.distribution(osr)
    assert dp.packages(dist, source, 580, fabric) == want


def test_repository_defaults_and_refusals():
    assert dp.default_source(("ubuntu", "24.04")) == "distro"
    assert dp.default_source(("debian", "12")) == "nvidia"
    assert dp.repo_url(("ubuntu", "22.04")).endswith("/cuda/repos/ubuntu2204/x86_64")
    with pytest.raises(dp.PlanError, match="below the pinned branch 580"):
        dp.packages(("debian", "12"), "distro", 580, False)
    with pytest.raises(dp.PlanError, match="supports Ubuntu 22.04/24.04 and Debian 12"):
        dp.distribution({"id": "rocky", "version_id": "9", "pretty_name": "Rocky Linux 9"})
    assert "Pin: version 590.*" in dp.pin_text(590)


def facts_with(driver_version="580.95.05", count=8, switches=False, fm_active=False, flavour="open"):
    return {
        "gpus": {"count": count, "gpus": [{"driver_version": driver_version}] * count},
        "nvidia_module": {"flavour": flavour},
        "nvswitch": {"present": switches},
        "nvidia_services": {
            "units": {"nvidia-fabricmanager.service": {"ActiveState": "active" if fm_active else "inactive"}}
        },
    }


def test_verify_after_provisioning():
    w = {"branch": 580, "fabricmanager": "auto"}
    assert verify(facts_with(), w, 8) == []
    assert verify(facts_with("550.54.15"), w, 8) == ["nvidia-smi reports driver 550.54.15, want branch 580"]
    assert verify(facts_with(count=7), w, 8) == ["7 GPUs, want 8"]
    assert verify(facts_with(flavour="proprietary"), w) == [
        "the proprietary kernel modules are loaded; Blackwell needs the open ones"
    ]
    assert verify(facts_with(switches=True), w) == ["nvidia-fabricmanager.service is inactive"]
    assert verify(facts_with(switches=True, fm_active=True), w) == []


def test_rolling_batches_never_all_at_once():
    hosts = ["a", "b", "c", "d", "e"]
    assert canary_batches(hosts, 1, 1) == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert canary_batches(hosts, 1, 2) == [["a"], ["b", "c"], ["d", "e"]]
    assert canary_batches(hosts, 2) == [["a", "b"], ["c", "d", "e"]]  # deploy's canary, unchanged
    assert canary_batches(hosts, 0) == [hosts]
