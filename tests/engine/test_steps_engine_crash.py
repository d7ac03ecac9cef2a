"""The deploy's crash naming knows the hardware (k26ops/steps/engine.py crash_text,
crash_label): the agent's crash report carries the kernel's NVRM lines of the dead run's time
(agents/engine.py kernel_nvrm); an Xid there names the crash as the GPU's fault, with the GPU
index, not the illegal memory access the engine logged. Recorded logs: tests/data/logs (an
SGLang TP8 illegal memory access) and tests/data/facts (Xid 79), replayed by the lab's
journalctl stand-in as the agent reads them."""

from __future__ import annotations

import time
from pathlib import Path

from k26ops.diagnose.classify import classify
from k26ops.steps.engine import crash_label, crash_text
from labtools.fixtures import lab_bus_ids, lab_kernel_log

LOGS = Path(__file__).parent.parent / "data" / "logs"
IMA = (LOGS / "ima_replay_tp8.log").read_text()


def report(tmp_path, kernel_log: str | None) -> dict:
    crash = {"why": "exited", "journal": IMA, "show": {}}
    if kernel_log:
        kernel = lab_kernel_log(tmp_path, kernel_log, time.time())
        crash.update(kernel="\n".join(line for line in kernel.splitlines() if "NVRM" in line), bus_ids=lab_bus_ids())
    return crash


def test_an_xid79_beside_the_crash_names_the_gpu_fault_on_its_gpu(tmp_path):
    text, bus = crash_text(report(tmp_path, "pub-ogkm1151-journal-xid79.txt"), [])
    assert bus["00000000:18:00.0"] == 0 and text.startswith(IMA.rstrip("\n"))
    d = classify(text, None, bus)
    assert d.signature == "gpu-hardware-fault" and d.detail["gpu"] == 0 and d.detail["xid"] == 79
    assert d.detail["symptom"] == "illegal-memory-access" and d.detail["action"] == "reboot"
    assert crash_label(d) == "gpu-hardware-fault on GPU 0"
    assert "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus." in d.evidence


def test_without_kernel_lines_the_engine_error_stays_the_name(tmp_path):
    text, bus = crash_text(report(tmp_path, None), [])
    d = classify(text, None, bus)
    assert (d.signature, crash_label(d)) == ("illegal-memory-access", "illegal-memory-access")
    healthy = crash_text(report(tmp_path, "h200-dmesg-nvrm-healthy.txt"), [])
    assert classify(*[healthy[0], None, healthy[1]]).signature == "illegal-memory-access"


def test_secrets_in_kernel_lines_are_redacted(tmp_path):
    crash = report(tmp_path, "pub-ogkm1151-journal-xid79.txt")
    crash["kernel"] += "\nNVRM: sk-secret-123 leaked"
    text, _ = crash_text(crash, ["sk-secret-123"])
    assert "sk-secret-123" not in text
