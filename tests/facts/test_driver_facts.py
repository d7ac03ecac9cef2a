"""Driver-layer facts on outputs written in the test (the recorded ones, tests/data/facts, are
cases in its expected.json: test_fact_cases.py), the package plan's pure parts and the rolling
batches. No lab needed."""

from __future__ import annotations

import pytest

from k26ops.facts import driver
from k26ops.orchestrate.rollout import canary_batches
from k26ops.steps import driver_plan as dp
from k26ops.steps.driver import verify

SEP = driver.SEP


def test_modinfo_without_the_module():
    v = driver.parse_nvidia_module(
        f"cat: x: No such file or directory\n{SEP}modinfo\nmodinfo: ERROR: Module nvidia not found.\n", 1
    )
    assert v["installed_known"] is True and v["installed_version"] is None


def test_systemctl_show_without_systemctl():
    assert driver.parse_systemctl_show("sh: 1: systemctl: not found\n", 127) == {"error": "systemctl not found"}


def test_packages_only_installed_ones():
    v = driver.parse_packages("nvidia-fabricmanager-580 580.95.05-0ubuntu1 ii \nnvidia-open 580.95.05-1 rc \n", 0)
    assert v["installed"] == {"nvidia-fabricmanager-580": "580.95.05-0ubuntu1"}


def test_reboot_required_flag():
    assert driver.parse_reboot_required("", 0) == {"required": False, "packages": [], "error": None}
    assert driver.parse_reboot_required("required\nnvidia-dkms-580\n", 0)["packages"] == ["nvidia-dkms-580"]


def test_apt_cache_policy_candidate_branch():
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
