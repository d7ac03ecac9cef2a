"""The fabric manager fact (k26ops/facts/fabric.py) on recorded real fabric manager lines
(tests/data/facts/pub-*-fm-*, sources in MANIFEST.json; the reasons each gives are its case in
tests/data/facts/expected.json), and what `check` and the `facts` health column make of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k26ops.facts import fabric as F
from k26ops.host import preflight

DATA = Path(__file__).parent.parent / "data/facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
FAILED_SHOW = "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n"
SWITCHES = {"present": True, "pci_switches": ["0000:05:00.0"], "dev_nodes": [], "pci_gpus": [], "error": None}
NO_SWITCHES = {"present": False, "pci_switches": [], "dev_nodes": [], "pci_gpus": [], "error": None}


def read(name: str) -> str:
    assert MANIFEST[name]["source"].count("https://") == 1
    return (DATA / name).read_text()


def fact_output(journal: str, show: str = FAILED_SHOW, log: str = "") -> str:
    """What the fact's command prints: systemctl show, then the journal and log sections."""
    return f"{show}{F.SEP}journal\n{journal}{F.SEP}log\n{log}"


@pytest.mark.parametrize(
    "name",
    ["pub-gpu-operator610-journal-fm-nothing-to-do.txt", "pub-cube-studio29-journal-fm-start-sh-nothing-to-do.txt"],
)
def test_nothing_to_do_is_a_fault_only_on_an_nvswitch_host(name):
    fm = F.parse_fabric_manager(fact_output(read(name)), 0)
    assert fm["present"] and fm["active_state"] == "failed"
    assert [r["reason"] for r in fm["reasons"]] == ["nothing-to-do"]
    assert fm["reasons"][0]["evidence"].startswith("request to query NVSwitch device information")
    quiet = F.verdict(fm, NO_SWITCHES)
    assert quiet["ok"] and "not needed: no NVSwitch" in quiet["line"]
    loud = F.verdict(fm, SWITCHES)
    assert not loud["ok"] and loud["line"].startswith("nvidia-fabricmanager nothing-to-do: request to query")
    assert "NVLink subnet manager" in loud["line"]


def test_systemd_failure_line_is_the_reason_when_nothing_else_is_known():
    journal = (
        "\n".join(
            line
            for line in read("pub-akash632-journal-fm-version-mismatch.txt").splitlines()
            if "nv-fabricmanager[" not in line
        )
        + "\n"
    )  # the recorded lines without the FM's own
    fm = F.parse_fabric_manager(fact_output(journal), 0)
    assert [(r["reason"], r["evidence"]) for r in fm["reasons"]] == [
        ("failed", "Control process exited, code=exited, status=1/FAILURE")
    ]
    v = F.verdict(fm, SWITCHES)
    assert not v["ok"] and "journalctl -u nvidia-fabricmanager" in v["line"]


def test_unit_absent_concerns_only_nvswitch_hosts():
    show = (DATA / "lab-systemctl-show-nvidia.txt").read_text().split("\n\n")[1]  # recorded: unit not found
    fm = F.parse_fabric_manager(show, 0)
    assert fm["present"] is False and fm["reasons"] == []
    assert F.verdict(fm, NO_SWITCHES) is None
    v = F.verdict(fm, SWITCHES)
    assert not v["ok"] and v["reason"] == "not-installed" and "k26ops provision" in v["line"]


def test_active_unit_passes_and_a_stopped_one_on_a_switch_host_fails():
    active = F.parse_fabric_manager(
        fact_output("", show="LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\n"), 0
    )
    assert F.verdict(active, SWITCHES)["ok"]
    stopped = F.parse_fabric_manager(
        fact_output("", show="LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\n"), 0
    )
    assert F.verdict(stopped, NO_SWITCHES)["ok"]
    v = F.verdict(stopped, SWITCHES)
    assert not v["ok"] and v["reason"] == "not-running" and "systemctl start nvidia-fabricmanager" in v["line"]


def test_check_and_health_column_name_the_fault_and_action():
    facts = {
        "fabric_manager": F.parse_fabric_manager(fact_output(read("pub-akash632-journal-fm-version-mismatch.txt")), 0),
        "nvswitch": SWITCHES,
    }
    c = preflight.fabric_manager_check(facts)
    assert not c.ok and c.name == "fabric_manager"
    assert c.detail.startswith(
        "nvidia-fabricmanager version-mismatch: fabric manager NVIDIA GPU driver interface "
        "version 550.127.05 don't match with driver version 550.120"
    )
    assert "action: install nvidia-fabricmanager of exactly the loaded driver's version" in c.detail
    assert "fabric manager install-matching (version-mismatch)" in preflight.health_summary(facts)
    checks = preflight.evaluate(facts, {})
    assert [x.name for x in checks].count("fabric_manager") == 1
    assert preflight.fabric_manager_check({"fabric_manager": F.parse_fabric_manager("", 0)}) is None


def test_the_command_is_bounded():
    assert "-n 40" in F.COMMAND and "tail -n 20" in F.COMMAND and "-b" in F.COMMAND


def test_recorded_h200_without_systemd_is_an_error_value_not_a_fault():
    out = (DATA / "h200-fabric-manager-no-systemctl.txt").read_text()
    fm = F.parse_fabric_manager(out, 0)
    assert fm["error"] == "systemctl not found" and fm["reasons"] == []
    assert F.verdict(fm, NO_SWITCHES) is None and preflight.fabric_manager_check({"fabric_manager": fm}) is None


def test_the_latest_start_gives_the_reason():
    older = read("pub-akash632-journal-fm-version-mismatch.txt")  # a start that failed, since fixed
    newer = read("pub-gpu-operator610-journal-fm-nothing-to-do.txt")  # the latest start
    fm = F.parse_fabric_manager(fact_output(older + newer), 0)
    assert [r["reason"] for r in fm["reasons"]] == ["nothing-to-do"]
