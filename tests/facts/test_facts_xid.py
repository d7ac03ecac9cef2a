"""The kernel Xid parser (k26ops/facts/xid.py) on recorded real kernel logs
(tests/data/facts/pub-*, sources in MANIFEST.json; what each parses to is its case in
tests/data/facts/expected.json) and on the crash logs' kernel lines (tests/data/logs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k26ops.facts import xid as X

DATA = Path(__file__).parent.parent / "data/facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def read(name: str) -> str:
    assert MANIFEST[name]["source"].count("https://") == 1
    return (DATA / name).read_text()


def test_an_xid_45_naming_no_cause_is_only_an_echo():
    # one naming its cause takes that cause's kind and action: pub-ogkm1150-journal-xid45-after-149.txt in expected.json
    plain = X.parse_kernel_text("NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001\n")
    assert (plain[0].kind, plain[0].action) == ("echo", "none")


@pytest.mark.parametrize(
    "raw, want",
    [
        ("PCI:0000:2b:00", "0000:2b:00"),
        ("00000000:2B:00.0", "0000:2b:00"),
        ("0000:19:00.0", "0000:19:00"),
        ("db:00", "0000:db:00"),
    ],
)
def test_pci_spellings_meet(raw, want):
    assert X.norm_pci(raw) == want


def test_fact_parser_bounds_and_refusals():
    text = read("pub-pytorch51382-dmesg-xid43-31.txt") + "__K26OPS_RC=0\n"
    got = X.parse_xid_fact(text, 0)
    assert got["count"] == 7 and got["error"] is None and got["worst_action"] == "restart-app"
    gpus = [{"index": 0, "bus_id": "00000000:3D:00.0"}, {"index": 1, "bus_id": "00000000:DB:00.0"}]
    X.with_gpu_index(got, gpus)
    assert [e["gpu"] for e in got["events"]] == [0, 0, 0, 0, 1, 1, 1]
    assert len(X.parse_kernel_text(text, limit=2)) == 2
    refused = X.parse_xid_fact("dmesg: read kernel buffer failed: Operation not permitted\n__K26OPS_RC=0\n", 0)
    assert refused["error"].startswith("the kernel log could not be read") and refused["events"] == []
    assert X.parse_xid_fact("", 0) == {"events": [], "count": 0, "worst_action": "none", "error": None}


# ------------------------------------------- issue 46: NVSwitch, GSP, nvidia-smi, Xid 154

LOGS = Path(__file__).parent.parent / "data/logs"


def log(name: str) -> str:
    meta = json.loads((LOGS / "MANIFEST.json").read_text())[name]
    assert meta["source"].startswith("https://")
    return (LOGS / name).read_text()


def test_nvswitch_sxid_fatal_and_non_fatal_with_their_detail_lines_folded():
    quiet = X.parse_kernel_text(log("kernel_sxid_nvswitch_nonfatal_boot.log"))
    (e,) = quiet  # its Data and Severity lines are the same SXid of the same switch
    assert (e.source, e.xid, e.pci, e.name) == ("sxid", 22013, "0000:04:00", "nvidia-nvswitch3")
    assert (e.kind, e.action, e.label) == ("info", "none", "SXid 22013 (non-fatal)")
    events = X.parse_kernel_text(log("kernel_xid79_sxid20034_fatal.log"))
    sx = [e for e in events if e.source == "sxid"]
    assert [e.xid for e in events if e.source == "xid"] == [79]
    assert {(e.name, e.pci) for e in sx} >= {("nvidia-nvswitch1", "0000:06:00"), ("nvidia-nvswitch0", "0000:05:00")}
    assert all((e.kind, e.action) == ("hardware", "reboot") for e in sx if "fatal" in e.label and "non" not in e.label)
    assert "Link 48 LTSSM Fault Up" in sx[0].meaning and sx[0].label == "SXid 20034 (fatal)"


def test_nvswitch_sxid_seen_only_by_its_data_line_takes_nvidias_severity():
    """No Fatal/Non-fatal word in the lines at hand: NVIDIA's SXid tables (xid_table.SXID_TABLE) name
    it and give its severity (gpud#338's dmesg scan: 12028, non-fatal in the guide's D.4)."""
    (e,) = X.parse_kernel_text(log("kernel_sxid12028_data_line_only.log"))
    assert (e.source, e.xid, e.pci, e.name) == ("sxid", 12028, "0000:84:00", "nvidia-nvswitch1")
    assert (e.kind, e.action, e.label) == ("info", "none", "SXid 12028 (non-fatal)")
    assert "egress nonposted PRIV error" in e.meaning
    # a fatal one of NVIDIA's tables, seen by its Data line alone, is a fault: the Data line of
    # kernel_xid79_sxid20034_fatal.log (nvidia-nvswitch0's 20034), on its own
    data = [ln for ln in log("kernel_xid79_sxid20034_fatal.log").splitlines() if "20034, Data" in ln]
    (f,) = X.parse_kernel_text(data[0])
    assert (f.kind, f.action, f.label) == ("hardware", "reboot", "SXid 20034 (fatal)")
    assert "LTSSM Fault Up" in f.meaning


def test_nvswitch_sxid_one_event_per_link_with_that_links_line_as_evidence():
    """gpud's README capture: SXid 20034 on five links of three NVSwitches, their Severity and Data lines
    interleaved. The driver logs a link's error with the link as its instance (NVSWITCH_REPORT_FATAL), so a
    'Severity 1 Engine instance 37' line folds into Link 37's event, and nvidia-nvswitch2's link 60, seen
    only by its Severity line, is an event of its own, not a part of link 37's: no line counted twice."""
    text = log("kernel_xid79_sxid20034_fatal.log")
    sx = [e for e in X.parse_kernel_text(text) if e.source == "sxid"]
    assert [(e.name, e.pci, e.link) for e in sx] == [
        ("nvidia-nvswitch1", "0000:06:00", 48),
        ("nvidia-nvswitch0", "0000:05:00", 63),
        ("nvidia-nvswitch2", "0000:07:00", 60),
        ("nvidia-nvswitch2", "0000:07:00", 37),
        ("nvidia-nvswitch0", "0000:05:00", 62),
    ]
    lines = text.splitlines()
    for e in sx:
        assert e.text in lines[e.line] and (f"Link {e.link} " in e.text or f"instance {e.link} " in e.text)
        assert (e.label, e.kind, e.action) == ("SXid 20034 (fatal)", "hardware", "reboot")
        assert "LTSSM Fault Up" in e.meaning
    assert [e.line for e in sx if "Fatal, Link" in e.text] == [i for i, ln in enumerate(lines) if "Fatal, Link" in ln]
    # nvtrust#124: the Data line comes first; the line naming the severity and link is the evidence
    (q,) = X.parse_kernel_text(log("kernel_sxid_nvswitch_nonfatal_boot.log"))
    assert (q.link, q.line) == (44, 1) and q.text.endswith("22013, Non-fatal, Link 44 Minion Link DLREQ interrupt")


def test_a_fatal_sxid_seen_by_its_severity_line_beside_a_gpus_xid62():
    """A user's Talos journal (open-gpu-kernel-modules#1118, 8x A100 under vLLM): SXid 24007 by its Severity
    and Data lines (one event, link 12; fatal in NVIDIA's tables), then Xid 62 and Xid 45 of the GPU."""
    events = X.parse_kernel_text(log("kernel_sxid24007_xid62_talos_journal.log"))
    assert [(e.label, e.pci, e.link, e.kind) for e in events] == [
        ("SXid 24007 (fatal)", "0000:aa:00", 12, "hardware"),
        ("Xid 62", "0000:48:00", None, "hardware"),
        ("Xid 45", "0000:48:00", None, "echo"),
        ("Xid 45", "0000:48:00", None, "echo"),
    ]
    assert events[0].action == "reboot" and "sourcetrack timeout error" in events[0].meaning
    assert events[1].uuid == "GPU-5fc0bcec-c2e1-38dc-8994-2a9f9f3b709e" and events[2].name == "VLLM::Worker"


def test_gsp_firmware_faults_are_hardware_with_a_reset():
    (e,) = X.parse_kernel_text(log("gsp_heartbeat_timeout_journal.log"))  # two lines, one fault
    assert (e.source, e.xid, e.kind, e.action, e.pci, e.name) == ("gsp", 119, "hardware", "reset-gpu", None, "GPU0")
    assert "heartbeat" in e.meaning
    events = X.parse_kernel_text(log("gsp_rpc_timeout_reset_required_kern.log"))
    assert [(e.label, e.action) for e in events] == [
        ("GSP", "reset-gpu"),
        ("Xid 154", "reset-gpu"),
        ("GSP", "reset-gpu"),
    ]
    assert {e.message for e in events if e.source == "gsp"} == {
        "the driver marked the GPU for reset after a GSP fault (reset required)",
        "GSP firmware RPC timeout",
    }


def test_xid154_takes_the_action_its_line_names():
    (e,) = [e for e in X.parse_kernel_text(log("gsp_heartbeat_then_xid154_consumer.log")) if e.xid == 154]
    assert (e.kind, e.action) == ("hardware", "reset-gpu")
    # the other values NVIDIA's catalogue lists for Xid 154's line
    line = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert X.parse_kernel_text(line)[0].action == "reboot"
    line = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert (X.parse_kernel_text(line)[0].kind, X.parse_kernel_text(line)[0].action) == ("info", "none")


@pytest.mark.parametrize(
    "name, pci, action",
    [
        ("nvidia_smi_device_handle_unknown_error.log", "0000:0b:00", "reboot"),
        ("nvidia_smi_device_handle_nospace.log", "0000:4f:00", "reboot"),
        ("nvidia_smi_device_handle_gpu_lost.log", "0000:02:00", "reboot"),
    ],
)
def test_nvidia_smi_device_handle_failure_is_a_fault_of_that_bus_id(name, pci, action):
    (e,) = X.parse_kernel_text(log(name))
    assert (e.source, e.pci, e.kind, e.action, e.xid) == ("nvidia-smi", pci, "hardware", action, None)
    assert X.who(e.to_json()) == f"GPU ({pci})" and X.label(e.to_json()) == "nvidia-smi"


def test_xid_command_keeps_the_new_lines():
    for word in ("SXid", "kgsp", "GSP", "Reset required"):
        assert word in X.XID_COMMAND


def test_gsp_boot_failures_and_rpc_timeouts_without_an_xid_line():
    """The driver's own words when the GSP firmware cannot boot (open-gpu-kernel-modules #974's title,
    #1230) or an RPC to it times out, with no Xid line beside them."""
    lines = (
        "NVRM: GPU0 kgspBootstrap_GH100: GSP-FMC reported an error while attempting to boot GSP.\n"
        "NVRM: GPU1 _kgspRpcRecvPoll: Timeout after 6s of waiting for RPC response from GPU1 GSP!\n"
    )
    events = X.parse_kernel_text(lines)
    assert [(e.source, e.name, e.message, e.action) for e in events] == [
        ("gsp", "GPU0", "GSP firmware failed to boot", "reset-gpu"),
        ("gsp", "GPU1", "GSP firmware RPC timeout", "reset-gpu"),
    ]
    (boot, *_rest) = [e for e in X.parse_kernel_text(log("gsp_boot_wpr2_rminitadapter_failed.log")) if e.name]
    assert (boot.name, boot.message) == ("GPU6", "GSP firmware failed to boot")
