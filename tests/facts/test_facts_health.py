"""The `nvidia-smi -q` health parser (k26ops/facts/smi_q.py) on recorded outputs
(tests/data/facts/, each with its source in MANIFEST.json): the real healthy H200, real
public excerpts of a pending row remap, an older driver's absolute thresholds and its
"Clocks Throttle Reasons", and one CONSTRUCTED faulty variant of the H200 recording. What
each output parses to is its case in tests/data/facts/expected.json; here are the fault
lines, the recordings changed in the test, and the check and facts column built on them."""

from __future__ import annotations

import json
from pathlib import Path

from k26ops.facts import smi_q as Q

DATA = Path(__file__).parent.parent / "data/facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def read(name: str) -> str:
    src = MANIFEST[name]["source"]
    assert src.startswith(("recorded on", "CONSTRUCTED")) or src.count("https://") == 1
    return (DATA / name).read_text()


def test_constructed_faulty_h200_is_one_fault_line_with_the_gpu_index_and_the_worst_action():
    h = Q.parse_health_fact(read("constructed-h200-q-faults.txt"), 0)  # its five faults: expected.json
    Q.with_gpu_index(h, [{"index": 3, "bus_id": "00000000:00:06.0"}])
    (line,) = Q.fault_lines(h)
    assert line.startswith("GPU 3 (00000000:00:06.0): ecc-uncorrectable (ECC Errors, Volatile: DRAM Uncorrectable : 2)")
    assert "action: reset-gpu: " in line


def test_remap_failure_is_rma_and_absolute_temperature_over_slowdown():
    # the real H200 recording with two values flipped in the test (not a recording of its own)
    text = read("h200-nvidia-smi-q.txt").replace(
        "Remapping Failure Occurred                     : No", "Remapping Failure Occurred                     : Yes"
    )
    (g,) = Q.parse_health(text)["gpus"]
    assert [(f["fault"], f["action"]) for f in g["faults"]] == [("row-remap-failure", "drain-and-rma")]
    hot = read("pub-thermald300-q-temperature.txt").replace(
        "GPU Current Temp                  : 56 C", "GPU Current Temp                  : 98 C"
    )
    (g,) = Q.parse_health(hot)["gpus"]
    assert [(f["fault"], f["action"]) for f in g["faults"]] == [("over-slowdown-temp", "check-cooling")]


def test_nvidia_smi_refusals_are_values_not_gpus():
    h = Q.parse_health_fact("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9)
    assert h["gpus"] == [] and "NVIDIA-SMI has failed" in h["error"]
    h = Q.parse_health_fact("sh: 1: nvidia-smi: not found\n", 127)
    assert h["gpus"] == [] and h["error"] == "nvidia-smi: command not found"


def test_bus_id_spellings_meet():
    assert Q.norm_bus("00000000:00:06.0") == Q.norm_bus("0000:00:06.0") == "0000:00:06.0"
    assert Q.norm_bus("00000000:2B:00.0") == "0000:2b:00.0"


# ------------------------------------------------ wired: facts, check, the facts column


def _facts(health_file=None, xid_file=None, bus="00000000:00:06.0", xid_bus="00000000:2B:00.0"):
    from k26ops import facts
    from k26ops.facts import xid as X

    raw = {
        "gpu_health": {"rc": 0, "stdout": read(health_file) if health_file else "", "stderr": ""},
        "gpu_xid": {"rc": 0, "stdout": (read(xid_file) if xid_file else "") + "__K26OPS_RC=0\n", "stderr": ""},
    }
    v = facts.parse_results(raw, ["gpu_health", "gpu_xid"])
    v["gpus"] = {"gpus": [{"index": 0, "bus_id": bus}, {"index": 3, "bus_id": xid_bus}], "gpu_errors": []}
    v["nvidia_smi"] = {}
    assert X.FACTS["gpu_xid"].name in facts.FACTS and "gpu_health" in facts.FACTS
    return facts.link_gpu_indexes(v)


def test_check_passes_the_real_healthy_h200_and_says_what_it_read():
    from k26ops.host import preflight

    v = _facts("h200-nvidia-smi-q.txt")
    c = preflight.gpu_health_check(v)
    assert c.ok, c.detail
    assert c.detail == "no GPU reports an error; no fault in nvidia-smi -q or kernel Xid log"
    assert preflight.health_summary(v) == "ok"


def test_check_fails_a_faulty_gpu_in_one_line_with_gpu_fault_and_action():
    from k26ops.host import preflight

    v = _facts("constructed-h200-q-faults.txt")
    assert v["gpu_health"]["gpus"][0]["index"] == 0  # bus id mapped through the gpus fact
    c = preflight.gpu_health_check(v)
    assert not c.ok and "\n" not in c.detail
    assert c.detail.startswith("GPU 0 (00000000:00:06.0): ecc-uncorrectable (ECC Errors, Volatile: DRAM Uncorrectable")
    assert "row-remap-pending" in c.detail and "action: reset-gpu: drain the host" in c.detail
    assert preflight.health_summary(v).startswith("GPU 0 reset-gpu (ecc-uncorrectable, row-remap-pending, ")


def test_check_fails_on_a_real_xid79_with_the_gpu_index_from_its_bus_id():
    from k26ops.host import preflight

    v = _facts("h200-nvidia-smi-q.txt", "pub-ogkm1151-journal-xid79.txt")
    assert v["gpu_xid"]["events"][0]["gpu"] == 3
    c = preflight.gpu_health_check(v)
    assert not c.ok
    assert c.detail.startswith("GPU 3 (0000:2b:00): Xid 79 ") and "action: reboot: " in c.detail
    assert preflight.health_summary(v) == "GPU 3 reboot (xid-79)"


def test_an_application_xid_or_an_unreadable_kernel_log_fails_nothing():
    from k26ops.facts import xid as X
    from k26ops.host import preflight

    v = _facts("h200-nvidia-smi-q.txt", "pub-pytorch51382-dmesg-xid43-31.txt")
    assert v["gpu_xid"]["count"] == 7 and preflight.gpu_health_check(v).ok
    v["gpu_xid"] = X.parse_xid_fact("dmesg: read kernel buffer failed: Operation not permitted\n__K26OPS_RC=0\n", 0)
    c = preflight.gpu_health_check(v)
    assert c.ok and "kernel log not read (the kernel log could not be read" in c.detail
    assert preflight.health_summary(v) == "ok, kernel log unread"
    hint = "Hint: You are currently not seeing messages from other users and the system.\n__K26OPS_RC=0\n"
    assert X.parse_xid_fact(hint, 0)["error"]


def test_xid_command_is_bounded_and_keeps_refusals():
    from k26ops.facts import xid as X

    cmd = X.XID_COMMAND
    assert "journalctl -k -b" in cmd and "--since '-24h'" in cmd and cmd.count("tail -n 400") == 2
    for refusal in ("Operation not permitted", "insufficient permissions", "not seeing messages from other users"):
        assert refusal in cmd  # the grep lets the refusal through to the parser


# ------------------------------------------------ issue 46: -q layouts of several drivers


def test_older_layout_double_bit_total_and_retired_pages_pending_are_faults():
    text = read("pub-dcgm-exporter16-q-double-bit-healthy.txt")  # as recorded, healthy: expected.json
    # the same excerpt under its ECC Errors > Volatile parents, once with the Double Bit total at 2
    # (changed in the test, not a recording): the older layout's uncorrectable count is read
    nested = "ECC Errors\n    Volatile\n" + text.split("    Retired Pages")[0]
    (g,) = Q.parse_health(nested)["gpus"]
    assert g["ecc"]["volatile_uncorrectable"] == 0 and g["faults"] == []
    (g,) = Q.parse_health(nested.replace("Total                     : 0", "Total                     : 2"))["gpus"]
    assert [(f["fault"], f["evidence"]) for f in g["faults"]] == [
        ("ecc-uncorrectable", "ECC Errors, Volatile: Double Bit Total : 2")
    ]
    # driver 418's Retired Pages spell it "Pending"
    (g,) = Q.parse_health("Retired Pages\n    Single Bit ECC : 0\n    Double Bit ECC : 1\n    Pending : Yes\n")["gpus"]
    assert [f["fault"] for f in g["faults"]] == ["page-retirement-pending"]


def test_a_gpu_nvidia_smi_cannot_open_is_a_fault_line_with_its_bus_id():
    h = Q.parse_health_fact(read("pub-xxd3vin19-smi-device-handle.txt"), 0)  # its gpu-unreachable fault: expected.json
    assert Q.fault_lines(h)[0].startswith(
        "GPU (0000:0B:00.0): gpu-unreachable (nvidia-smi cannot open it: Unknown Error)"
    )


def test_healthy_q_outputs_are_no_fault_line_and_no_crash_either():
    from k26ops.diagnose import classify

    for name in (
        "h200-nvidia-smi-q.txt",
        "pub-hpe-a100-q-ecc-555-healthy.txt",
        "pub-dcgm-exporter16-q-double-bit-healthy.txt",
    ):
        assert Q.fault_lines(Q.parse_health_fact(read(name), 0)) == [], name
        d = classify(read(name))
        assert not d.error_found, (name, d.evidence)
