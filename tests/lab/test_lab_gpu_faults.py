"""`facts`, `check` and `status` on a lab host whose GPU stand-ins replay recorded fault
outputs (k26ops/lab/gpufaults.py): Xid 79 in the kernel log, a pending row remap, a thermal
slowdown, a fabric manager that failed to start; and healthy recorded outputs that pass."""

from __future__ import annotations

import time
from pathlib import Path

from k26ops.lab import gpufaults

DATA = Path(__file__).parent.parent / "data" / "facts"


def test_facts_and_check_name_each_replayed_fault_and_its_action(scratch_lab):
    from labtools.invoke import k26ops_json, lab_ssh

    def put(**recorded):
        cmd = gpufaults.clear() + " && " + gpufaults.install(**{k: (DATA / v).read_text() for k, v in recorded.items()})
        res = lab_ssh(scratch_lab.dir, scratch_lab.base_port, cmd)
        assert res.returncode == 0, res.stderr

    def run(command):
        rc, data = k26ops_json(command, env=scratch_lab.env())
        host = data["hosts"]["lab1"]
        return rc, host, host.get("error") or ""

    # healthy recorded outputs (the H200's -q and its kernel log): nothing named
    put(smi_q="h200-nvidia-smi-q.txt", kernel_log="h200-dmesg-nvrm-healthy.txt")
    rc, host, _ = run("facts")
    assert rc == 0 and host["health"] == "ok", host["health"]
    assert host["facts"]["gpu_xid"]["events"] == [] and host["facts"]["gpu_xid"]["error"] is None
    assert host["facts"]["fabric_manager"]["present"] is False
    rc, host, err = run("check")
    assert "gpu_health" not in err and "fabric_manager" not in err, err

    # Xid 79 in the kernel log: the GPU, the Xid and the action
    put(smi_q="h200-nvidia-smi-q.txt", kernel_log="pub-ogkm1151-journal-xid79.txt")
    rc, host, err = run("check")
    assert rc == 1
    assert (
        "gpu_health: GPU 0 (0000:18:00): Xid 79 GPU has fallen off the bus (the GPU is no longer reachable over "
        "PCIe) in the kernel log; action: reboot: drain the host and reboot it"
    ) in err, err  # NVIDIA's catalogue words
    rc, host, _ = run("facts")
    assert host["health"] == "GPU 0 reboot (xid-79)", host["health"]

    # a pending row remap (a real -q excerpt without its GPU line)
    put(smi_q="pub-gpud80-q-remapped-rows-pending.txt", kernel_log="h200-dmesg-nvrm-healthy.txt")
    rc, host, err = run("check")
    assert rc == 1
    assert (
        "gpu_health: GPU: row-remap-pending (Remapped Rows: Pending : Yes (Uncorrectable Error : 4)); "
        "action: reset-gpu" in err
    ), err

    # thermal slowdown (CONSTRUCTED from the H200's -q: see MANIFEST.json)
    put(smi_q="constructed-h200-q-faults.txt")
    rc, host, err = run("check")
    assert (
        rc == 1 and "thermal-slowdown (Clocks Event Reasons: HW Slowdown : Active, HW Thermal Slowdown : Active)" in err
    ), err

    # the fabric manager failed to start (systemd's real unit, the stand-in replays the recorded reason)
    put(smi_q="h200-nvidia-smi-q.txt", fabric_manager_log="pub-akash632-journal-fm-version-mismatch.txt")
    rc, host, err = run("check")
    assert rc == 1
    assert (
        "fabric_manager: nvidia-fabricmanager version-mismatch: fabric manager NVIDIA GPU driver interface "
        "version 550.127.05 don't match with driver version 550.120"
    ) in err, err
    assert "action: install nvidia-fabricmanager of exactly the loaded driver's version" in err
    rc, host, _ = run("facts")
    fm = host["facts"]["fabric_manager"]
    assert (fm["present"], fm["active_state"]) == (True, "failed")
    assert "fabric manager install-matching (version-mismatch)" in host["health"], host["health"]

    # on a host without NVSwitch, NV_WARN_NOTHING_TO_DO is the fabric manager having nothing to do
    put(smi_q="h200-nvidia-smi-q.txt", fabric_manager_log="pub-gpu-operator610-journal-fm-nothing-to-do.txt")
    rc, host, err = run("check")
    assert "fabric_manager" not in err, err
    oks = [c for c in host.get("checks") or [] if c["check"] == "fabric_manager"]
    assert not oks or oks[0]["ok"]


def test_status_names_an_xid_since_the_engine_started(scratch_lab):
    from labtools.invoke import k26ops, k26ops_json, lab_ssh

    def ssh(cmd):
        res = lab_ssh(scratch_lab.dir, scratch_lab.base_port, cmd)
        assert res.returncode == 0, res.stderr

    # a stand-in engine unit: status reads the unit's state, not the engine
    ssh(
        gpufaults.clear() + " && " + gpufaults.install(kernel_log=(DATA / "pub-ogkm1151-journal-xid79.txt").read_text())
    )
    time.sleep(2.5)
    ssh("systemd-run --unit=k26-engine.service --quiet sleep 600")
    rc, data = k26ops_json("status", env=scratch_lab.env())
    assert data["hosts"]["lab1"].get("gpu_xid") == [], data  # the Xid came before the engine started

    time.sleep(2.5)
    ssh(gpufaults.install(kernel_log=(DATA / "pub-ogkm1151-journal-xid79.txt").read_text()))  # again, now
    rc, data = k26ops_json("status", env=scratch_lab.env())
    [line] = data["hosts"]["lab1"]["gpu_xid"]
    assert line.startswith("new since the engine started: GPU 0 (0000:18:00) Xid 79 GPU has fallen off the bus"), line
    assert "action: reboot" in line
    proc = k26ops("status", env=scratch_lab.env())
    assert "lab1: new since the engine started: GPU 0 (0000:18:00) Xid 79" in proc.stdout, proc.stdout


def test_deploy_names_a_crash_after_an_xid_as_the_gpu_fault(scratch_lab, tmp_path):
    """The engine (stand-in) dies at load printing a recorded SGLang illegal memory access while
    the kernel log holds Xid 79: the deploy names gpu-hardware-fault on GPU 0, the IMA its symptom."""
    import base64

    import yaml

    from labtools.invoke import k26ops_json, lab_ssh

    ima = base64.b64encode((Path(__file__).parent.parent / "data/logs/ima_replay_tp8.log").read_bytes()).decode()
    cmd = f"echo {ima} | base64 -d > /var/lib/k26-ima.log && chmod 0644 /var/lib/k26-ima.log && " + gpufaults.install(
        kernel_log=(DATA / "pub-ogkm1151-journal-xid79.txt").read_text()
    )
    res = lab_ssh(scratch_lab.dir, scratch_lab.base_port, cmd)
    assert res.returncode == 0, res.stderr
    inv = yaml.safe_load(scratch_lab.inventory.read_text())
    inv["vars"]["engine_env"] = {
        "K26OPS_STANDIN_CRASH": "load",
        "K26OPS_STANDIN_CRASH_LOG": "/var/lib/k26-ima.log",
        "K26OPS_STANDIN_CRASH_GRAPH_ONLY": "0",
    }
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))
    (tmp_path / "engine.yml").write_text(
        "name: engine\nsteps:\n  - release: {keep: 3}\n  - service: {}\n  - health: {}\n"
    )
    rc, data = k26ops_json(
        "-i", str(tmp_path / "inv.yml"), "deploy", "--playbook", str(tmp_path / "engine.yml"), timeout=600
    )
    host = data["hosts"]["lab1"]
    assert rc == 1, data
    assert (
        "crashed" in host["error"] and "gpu-hardware-fault on GPU 0: NVRM: Xid (PCI:0000:18:00): 79" in host["error"]
    ), host["error"]
    d = host["diagnosis"]
    assert d["signature"] == "gpu-hardware-fault" and d["detail"]["symptom"] == "illegal-memory-access", d
    assert "NVRM: Xid (PCI:0000:18:00): 79" in host["journal_tail"]
