"""Rolling reboots and the driver step's plan on a private 3-host lab.

What is real here: lab hosts really reboot (`systemctl reboot`: the
container's systemd goes down, the lab boots it again, sshd comes back with a
new boot id), the waiting, canary order, the refusal of a serving engine, the
package plan computed against the lab host's own apt sources. What is not: a
container cannot load kernel modules, so no driver is installed; the lab's
nvidia-smi fixture reports the driver version (K26OPS_LAB_DRIVER knob).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from labtools.invoke import k26ops, lab_ssh
from labtools.labs import private_lab

KNOB = "/etc/k26ops-lab/nvidia-smi.env"


@pytest.fixture(scope="module")
def drvlab():
    with private_lab(3, "drv") as running:
        yield running


def boot_id(lab, name: str) -> str:
    res = lab_ssh(lab.dir, lab.port(name), "cat /proc/sys/kernel/random/boot_id", timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def progress_order(stderr: str) -> list[tuple[str, str]]:
    """(host, message) of the -v progress lines, in order."""
    return re.findall(r"^(lab\d): (rebooting|back after[^\n]*|re-gathering facts)$", stderr, re.M)


def test_rolling_reboot_goes_batch_by_batch_and_a_host_kept_down_stops_it(drvlab):
    names = ["lab1", "lab2", "lab3"]
    before = {n: boot_id(drvlab, n) for n in names}
    proc = k26ops(
        "-v", "reboot", "--canary", "1", "--batch", "1", "--reboot-timeout", "120", env=drvlab.env(), timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = {n: boot_id(drvlab, n) for n in names}
    assert all(after[n] != before[n] for n in names), "every host rebooted"
    # canary order: each host is back and verified before the next one starts rebooting
    order = progress_order(proc.stderr)
    starts = [i for i, (h, m) in enumerate(order) if m == "rebooting"]
    assert [order[i][0] for i in starts] == names
    for host, nxt in zip(names, starts[1:]):
        assert any(h == host and m == "re-gathering facts" for h, m in order[:nxt]), order
    assert "waiting for SSH" in proc.stderr  # progress while a host is down
    for n in names:
        assert re.search(rf"{n}\s.*rebooted, back in \d+s", proc.stdout), proc.stdout
        # the host lock, taken before the reboot, was taken again and released after it
        res = lab_ssh(drvlab.dir, drvlab.port(n), "ls /opt/k26ops/state/", timeout=30)
        assert res.returncode == 0 and "lock.owner" not in res.stdout, res.stdout

    # lab2 does not come back: the rollout stops with one line, lab3 is untouched
    from k26ops.lab.machines import Lab

    lab = Lab(drvlab.dir)
    lab.hold_down("lab2")
    try:
        before = {n: boot_id(drvlab, n) for n in ("lab1", "lab3")}
        proc = k26ops(
            "--json", "reboot", "--canary", "1", "--batch", "1", "--reboot-timeout", "15", env=drvlab.env(), timeout=600
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        hosts = json.loads(proc.stdout)["hosts"]
        assert hosts["lab1"]["status"] == "changed"
        assert hosts["lab2"]["status"] == "failed"
        assert "did not come back within 15s after its reboot" in hosts["lab2"]["error"]
        assert hosts["lab3"]["status"] == "skipped"
        assert boot_id(drvlab, "lab1") != before["lab1"]
        assert boot_id(drvlab, "lab3") == before["lab3"], "lab3 was not rebooted"
        stop = [ln for ln in proc.stderr.splitlines() if ln.startswith("k26ops: rollout stopped")]
        assert len(stop) == 1, proc.stderr
        assert stop[0].startswith("k26ops: rollout stopped: lab2: did not come back within 15s after its reboot ("), (
            stop
        )
        assert stop[0].endswith("); untouched: lab3"), stop
    finally:
        lab.hold_down("lab2", False)
    # released, lab2 boots again and the next rollout finds it
    res = k26ops("--json", "reboot", "--check", env=drvlab.env(), timeout=120)
    for _ in range(60):
        if res.returncode == 0:
            break
        res = k26ops("--json", "reboot", "--check", env=drvlab.env(), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_serving_engine_is_not_rebooted_without_allow_reboot(drvlab):
    ssh = lab_ssh(drvlab.dir, drvlab.port("lab3"), "systemd-run --unit=k26-engine sleep 600", timeout=30)
    assert ssh.returncode == 0, ssh.stderr
    try:
        before = boot_id(drvlab, "lab3")
        rc = k26ops("--json", "reboot", "--check", env=drvlab.env(), timeout=120)
        hosts = json.loads(rc.stdout)["hosts"]
        assert hosts["lab3"]["reboot"] == "would refuse: k26-engine.service is serving (--allow-reboot)"
        assert hosts["lab1"]["reboot"] == "would reboot"
        proc = k26ops("--json", "--limit", "lab3", "reboot", env=drvlab.env(), timeout=120)
        assert proc.returncode == 1
        err = json.loads(proc.stdout)["hosts"]["lab3"]["error"]
        assert err == "k26-engine.service is serving: not rebooting this host without --allow-reboot"
        assert boot_id(drvlab, "lab3") == before
        # a host another k26ops run holds is not rebooted either
        lab_ssh(
            drvlab.dir,
            drvlab.port("lab3"),
            "mkdir -p /opt/k26ops/state && systemd-run --unit=k26-holdlock flock /opt/k26ops/state/lock sleep 600",
            timeout=30,
        )
        proc = k26ops("--json", "--limit", "lab3", "reboot", "--allow-reboot", env=drvlab.env(), timeout=120)
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["hosts"]["lab3"]["error"].startswith("host is locked by another k26ops run")
        assert boot_id(drvlab, "lab3") == before
        lab_ssh(drvlab.dir, drvlab.port("lab3"), "systemctl stop k26-holdlock", timeout=30)
        proc = k26ops(
            "--json",
            "--limit",
            "lab3",
            "reboot",
            "--allow-reboot",
            "--reboot-timeout",
            "120",
            env=drvlab.env(),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert boot_id(drvlab, "lab3") != before
    finally:
        lab_ssh(drvlab.dir, drvlab.port("lab3"), "systemctl stop k26-engine 2>/dev/null; true", timeout=30)


def set_driver(lab, name: str, version: str | None) -> None:
    cmd = f"mkdir -p /etc/k26ops-lab && echo K26OPS_LAB_DRIVER={version} > {KNOB}" if version else f"rm -f {KNOB}"
    assert lab_ssh(lab.dir, lab.port(name), cmd, timeout=30).returncode == 0


def test_provision_check_on_an_old_driver_lists_packages_services_and_the_reboot(drvlab):
    set_driver(drvlab, "lab1", "550.54.15")
    try:
        proc = k26ops("--limit", "lab1", "provision", "--check", "--diff", env=drvlab.env(), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = " ".join(proc.stdout.split())
        assert (
            "lab1: driver: would change: add NVIDIA's CUDA apt repository "
            "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ "
            "(its cuda-keyring_1.1-1_all.deb)"
        ) in out
        assert (
            "lab1: driver: would change: pin the driver to branch 580: /etc/apt/preferences.d/k26ops-nvidia-driver"
            in out
        )
        assert "+Pin: version 580.*" in proc.stdout  # --diff shows the pin file
        assert "lab1: driver: would change: install nvidia-open (branch 580, open kernel modules;" in out
        assert "lab1: driver: would change: enable and start nvidia-persistenced.service" in out
        assert (
            "lab1: driver: would change: reboot (driver 550.54.15 -> branch 580 (open modules)), "
            "one canary batch at a time"
        ) in out
        # --check changed nothing
        res = lab_ssh(drvlab.dir, drvlab.port("lab1"), "ls /etc/apt/preferences.d/", timeout=30)
        assert "k26ops-nvidia-driver" not in res.stdout
        js = json.loads(
            k26ops("--json", "--limit", "lab1", "provision", "--check", env=drvlab.env(), timeout=300).stdout
        )
        assert js["hosts"]["lab1"]["reboot"] == "would reboot"

        # applying on a lab host is refused: no fake driver install
        proc = k26ops("--json", "--limit", "lab1", "provision", env=drvlab.env(), timeout=300)
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["hosts"]["lab1"]["error"].startswith(
            "lab host: a container cannot load kernel modules"
        )
        res = lab_ssh(
            drvlab.dir, drvlab.port("lab1"), "ls /etc/apt/preferences.d/ /etc/apt/sources.list.d/", timeout=30
        )
        assert "k26ops-nvidia-driver" not in res.stdout and "cuda" not in res.stdout

        # a serving engine: --check says the reboot would be refused; applying refuses before any change
        lab_ssh(drvlab.dir, drvlab.port("lab1"), "systemd-run --unit=k26-engine sleep 600", timeout=30)
        try:
            proc = k26ops("--limit", "lab1", "provision", "--check", env=drvlab.env(), timeout=300)
            assert (
                "reboot (driver 550.54.15 -> branch 580 (open modules)): REFUSED while "
                "k26-engine.service is serving; pass --allow-reboot"
            ) in " ".join(proc.stdout.split())
            proc = k26ops("--json", "--limit", "lab1", "provision", env=drvlab.env(), timeout=300)
            assert json.loads(proc.stdout)["hosts"]["lab1"]["error"] == (
                "k26-engine.service is serving and the driver change needs a reboot (driver 550.54.15 -> "
                "branch 580 (open modules)): nothing changed; pass --allow-reboot"
            )
        finally:
            lab_ssh(drvlab.dir, drvlab.port("lab1"), "systemctl stop k26-engine", timeout=30)

        # the distribution's own packages (Debian 12: 535, none in the lab's sources): refused, one line
        inv = yaml.safe_load(drvlab.inventory.read_text())
        inv["hosts"]["lab1"]["vars"]["nvidia_driver_source"] = "distro"
        alt = drvlab.dir / "inventory-distro.yml"
        alt.write_text(yaml.safe_dump(inv))
        proc = k26ops(
            "--json", "-i", str(alt), "--limit", "lab1", "provision", "--check", env=drvlab.env(), timeout=300
        )
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["hosts"]["lab1"]["error"] == (
            "Debian 12's own NVIDIA driver packages are 535, below the pinned branch 580: set "
            "nvidia_driver_source: nvidia (NVIDIA's CUDA repository, "
            "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64) "
            "(this host's apt sources offer nvidia-driver: none)"
        )
        # deploy --check refuses the old driver, as before, and points at provision
        proc = k26ops("--json", "--limit", "lab1", "deploy", "--check", env=drvlab.env(), timeout=300)
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["hosts"]["lab1"]["error"] == (
            "driver 550 is older than CUDA 13.0 needs (>= 580); deploy never changes drivers: "
            "`k26ops provision` upgrades it (with a reboot)"
        )
        # `check` refuses the old driver and points at provision
        proc = k26ops("--limit", "lab1", "check", env=drvlab.env(), timeout=120)
        assert "`k26ops provision` installs it" in " ".join(proc.stdout.split())
    finally:
        set_driver(drvlab, "lab1", None)


def test_provision_is_idempotent_on_a_host_on_the_pinned_branch(drvlab):
    proc = k26ops("--json", "provision", "--check", env=drvlab.env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, h in json.loads(proc.stdout)["hosts"].items():
        assert h["status"] == "ok", (name, h)
        assert [s["changes"] for s in h["steps"]] == [[]]
        assert "reboot" not in h
    # and applying changes nothing either (nothing to do, so nothing refused)
    proc = k26ops("--json", "--limit", "lab2", "provision", env=drvlab.env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["hosts"]["lab2"]["status"] == "ok"


def test_bad_driver_branch_is_one_line_exit_2(drvlab, tmp_path):
    inv = yaml.safe_load(drvlab.inventory.read_text())
    inv["vars"]["nvidia_driver_branch"] = 550
    alt = tmp_path / "inv.yml"
    alt.write_text(yaml.safe_dump(inv))
    proc = k26ops("-i", str(alt), "provision", "--check", env=drvlab.env(), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "k26ops: error: host lab1: nvidia_driver_branch 550: a driver branch number >= 580 (CUDA 13 needs 580 or newer)"
    )


def test_a_host_that_comes_back_with_a_newly_failed_unit_is_unhealthy(drvlab):
    unit = "/etc/systemd/system/k26-failsatboot.service"
    setup = (
        f"printf '[Service]\\nType=oneshot\\nExecStart=/bin/false\\n[Install]\\nWantedBy=multi-user.target\\n' "
        f"> {unit} && systemctl daemon-reload && systemctl enable k26-failsatboot.service"
    )
    assert lab_ssh(drvlab.dir, drvlab.port("lab2"), setup, timeout=30).returncode == 0
    try:
        proc = k26ops("--json", "--limit", "lab2", "reboot", "--reboot-timeout", "120", env=drvlab.env(), timeout=300)
        assert proc.returncode == 1, proc.stdout
        assert json.loads(proc.stdout)["hosts"]["lab2"]["error"] == (
            "came back unhealthy after its reboot: systemd is degraded (failed: k26-failsatboot.service)"
        )
        # failed before the reboot too: degraded by the same unit is not this reboot's doing
        proc = k26ops("--json", "--limit", "lab2", "reboot", "--reboot-timeout", "120", env=drvlab.env(), timeout=300)
        assert proc.returncode == 0, proc.stdout
    finally:
        lab_ssh(
            drvlab.dir,
            drvlab.port("lab2"),
            f"systemctl disable k26-failsatboot.service; rm -f {unit}; systemctl daemon-reload; systemctl reset-failed",
            timeout=30,
        )


def test_nvswitch_host_plans_the_fabric_manager_of_the_same_version(drvlab):
    """Lab stand-in for NVSwitch hardware: a /dev/nvidia-nvswitch0 node (the nvswitch fact counts them)."""
    ssh = lab_ssh(drvlab.dir, drvlab.port("lab1"), "touch /dev/nvidia-nvswitch0", timeout=30)
    assert ssh.returncode == 0
    set_driver(drvlab, "lab1", "550.54.15")
    try:
        proc = k26ops("--limit", "lab1", "provision", "--check", env=drvlab.env(), timeout=300)
        out = " ".join(proc.stdout.split())
        assert "lab1: driver: would change: install nvidia-open cuda-drivers-fabricmanager-580 (branch 580" in out
        assert "lab1: driver: would change: enable and start nvidia-fabricmanager.service (NVSwitch host" in out
        # on the branch already: the fabric manager must match the running driver, from this host's sources
        set_driver(drvlab, "lab1", None)
        proc = k26ops("--json", "--limit", "lab1", "provision", "--check", env=drvlab.env(), timeout=300)
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["hosts"]["lab1"]["error"] == (
            "cuda-drivers-fabricmanager-580 580.95.05 (the running driver's version) is not in this host's apt "
            "sources (offered: none); the fabric manager must match the driver"
        )
    finally:
        set_driver(drvlab, "lab1", None)
        lab_ssh(drvlab.dir, drvlab.port("lab1"), "rm -f /dev/nvidia-nvswitch0", timeout=30)
