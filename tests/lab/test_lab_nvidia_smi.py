"""The lab's nvidia-smi fixture, run for real and read with the fact parsers.

Its formats are held to the outputs recorded on a real H200 host: with the
h200 profile it must reproduce them (tests/data/facts/h200x2-*).
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from k26ops.facts import gpu

ROOT = Path(__file__).resolve().parent.parents[1]
FIXTURE = ROOT / "k26ops" / "lab" / "fixtures" / "nvidia-smi"
DATA = ROOT / "tests" / "data" / "facts"
Q = "index,name,memory.total,driver_version,compute_cap,uuid"


def smi(*args, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_LAB_")}
    e.update(env)
    p = subprocess.run([str(FIXTURE), *args], capture_output=True, text=True, env=e, timeout=30)
    return p.stdout + p.stderr, p.returncode


def recorded(name):
    return (DATA / f"h200x2-{name}.txt").read_text()


def test_header_comment_and_executable():
    lines = FIXTURE.read_text().splitlines()
    assert lines[0].startswith("#!")
    assert (
        "k26ops LAB FIXTURE — stands in for nvidia-smi on lab hosts without GPUs; never installed outside the lab"
        in lines[1]
    )
    assert os.access(FIXTURE, os.X_OK)


@pytest.mark.parametrize("fmt", ["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"])
def test_query_gpus_every_format(fmt):
    text, rc = smi(f"--query-gpu={Q}", f"--format={fmt}")
    v = gpu.parse_gpus(text, rc)
    assert rc == 0 and v["error"] is None and v["count"] == 8
    assert [g["index"] for g in v["gpus"]] == list(range(8))
    for g in v["gpus"]:
        assert g["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        assert g["memory_mib"] == 97887 and g["compute_cap"] == "12.0"
        assert g["driver_version"].startswith("580.") and g["uuid"].startswith("GPU-")
    assert len({g["uuid"] for g in v["gpus"]}) == 8


def test_fields_come_back_in_the_order_asked_with_aliases():
    fields = ("uuid", "compute_cap", "gpu_name", "memory.free", "index", "power.limit", "fan.speed")
    text, rc = smi("--query-gpu=" + ",".join(fields), "--format=csv")
    header = text.splitlines()[0]
    assert header == "uuid, compute_cap, name, memory.free [MiB], index, power.limit [W], fan.speed"
    rows = gpu.parse_query_csv(text, fields)
    assert rows[3]["index"] == "3" and rows[3]["compute_cap"] == "12.0"
    assert rows[0]["gpu_name"].startswith("NVIDIA RTX PRO 6000") and rows[0]["fan.speed"] is None


def test_id_selection_and_count():
    text, rc = smi("-i", "2,5", "--query-gpu=index,count", "--format=csv,noheader")
    assert text.split() == ["2,", "2", "5,", "2"]


def test_topology_is_pcie_only():
    v = gpu.parse_topology(*smi("topo", "-m"))
    assert v["interconnect"] == "pcie" and len(v["links"]) == 28
    assert not any(re.fullmatch(r"NV\d+", x) for x in v["links"].values())
    assert {"PIX", "PXB", "NODE", "SYS"} == set(v["links"].values())


def test_table_and_list():
    h = gpu.parse_smi_header(*smi())
    assert h["driver_version"].startswith("580.") and h["cuda_version"] == "13.0" and len(h["gpu_names"]) == 8
    text, rc = smi("-L")
    uuids = [g["uuid"] for g in gpu.parse_gpus(*smi(f"--query-gpu={Q}", "--format=csv,noheader"))["gpus"]]
    assert text.splitlines() == [
        f"GPU {i}: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: {u})" for i, u in enumerate(uuids)
    ]


def test_errors_look_like_the_real_ones():
    text, rc = smi("--bogus-option")
    assert (text, rc) == (recorded("smi-badopt"), 255)
    text, rc = smi("--query-gpu=index,bogus_field", "--format=csv")
    assert (text, rc) == (recorded("smi-query-badfield"), 2)
    text, rc = smi("topo", "-x")
    assert (text, rc) == (recorded("smi-topo-badopt"), 2)
    assert smi("--query-gpu=index")[0] == "index\n" + "".join(f"{i}\n" for i in range(8))


@pytest.mark.parametrize(
    "mode,why,code",
    [
        ("nvml-mismatch", "Failed to initialize NVML: Driver/library version mismatch", 18),
        ("no-devices", "No devices were found", 6),
    ],
)
def test_failure_modes(mode, why, code):
    text, rc = smi(f"--query-gpu={Q}", "--format=csv,noheader,nounits", K26OPS_LAB_NVIDIA_SMI=mode)
    assert rc == code and gpu.parse_gpus(text, rc)["error"] == why


def test_h200_profile_reproduces_the_recorded_formats():
    env = dict(K26OPS_LAB_GPU_PROFILE="h200", K26OPS_LAB_GPUS="2")
    assert smi("topo", "-m", **env)[0] == recorded("smi-topo-m")
    assert smi("--version", **env)[0] == recorded("smi-version")
    uuid = re.compile(r"GPU-[0-9a-f-]{36}")
    for fmt in ("csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"):
        name = (
            "smi-query-"
            + {
                "csv": "csv",
                "csv,noheader": "noheader",
                "csv,nounits": "nounits",
                "csv,noheader,nounits": "noheader-nounits",
            }[fmt]
        )
        assert uuid.sub("U", smi(f"--query-gpu={Q}", f"--format={fmt}", **env)[0]) == uuid.sub("U", recorded(name))
    power = re.compile(r"\d+W /")  # the recorded table's power draw differs by GPU
    mine, real = smi(**env)[0].splitlines()[1:], recorded("smi-table").splitlines()[1:]
    assert [power.sub("W /", l) for l in mine] == [power.sub("W /", l) for l in real]


def gpus_fact(**env):
    """The gpus fact's real command run with /bin/sh, this fixture as nvidia-smi."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_LAB_")}
    e.update(env, PATH=f"{FIXTURE.parent}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(["/bin/sh", "-c", gpu.GPU_COMMAND], capture_output=True, text=True, env=e, timeout=60)
    return gpu.parse_gpus(p.stdout, p.returncode), p.stdout


def test_err_gpu_mode_fails_one_gpu_in_query_and_table():
    v, raw = gpus_fact(K26OPS_LAB_NVIDIA_SMI="err-gpu", K26OPS_LAB_ERR_GPU="5")
    assert "== k26ops: table" in raw and v["count"] == 8 and v["source"] == "query"
    assert v["gpu_errors"] == ["GPU 5 (00000000:AB:00.0): [Unknown Error] in the GPU query; ERR! in nvidia-smi's table"]
    t = gpu.parse_smi_header(*smi(K26OPS_LAB_NVIDIA_SMI="err-gpu", K26OPS_LAB_ERR_GPU="5"))
    assert [g["name"] for g in t["gpus"]].count(None) == 1 and t["gpus"][5]["name"] is None  # ERR! is no name
    assert t["gpus"][5]["errors"] == ["ERR!"] and t["gpu_errors"] == [
        "GPU 5 (00000000:AB:00.0): ERR! in nvidia-smi's table"
    ]
    ok, raw = gpus_fact()
    assert "== k26ops:" not in raw and ok["gpu_errors"] == [] and ok["count"] == 8  # a clean query runs nothing more


def test_old_driver_mode_falls_back_and_says_so():
    text, rc = smi(f"--query-gpu={Q}", "--format=csv", K26OPS_LAB_NVIDIA_SMI="old-driver")
    assert (text, rc) == ('Field "compute_cap" is not a valid field to query.\n\n', 2)
    v, raw = gpus_fact(K26OPS_LAB_NVIDIA_SMI="old-driver")
    assert (
        v["error"] is None and v["count"] == 8 and v["source"] == "query_no_cc" and v["query_refused"] == "compute_cap"
    )
    g = v["gpus"][0]
    assert (g["name"], g["memory_mib"], g["compute_cap"]) == (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        97887,
        "12.0",
    )
    assert g["sources"]["memory_mib"] == "query_no_cc" and g["sources"]["compute_cap"] == "name"


def test_check_on_a_lab_host_with_a_failed_gpu_names_it(scratch_lab):
    from labtools.invoke import k26ops, k26ops_json, lab_ssh

    port = scratch_lab.base_port
    res = lab_ssh(
        scratch_lab.dir,
        port,
        "mkdir -p /etc/k26ops-lab && printf 'K26OPS_LAB_NVIDIA_SMI=err-gpu\\n"
        "K26OPS_LAB_ERR_GPU=2\\n' > /etc/k26ops-lab/nvidia-smi.env",
    )
    assert res.returncode == 0, res.stderr
    rc, data = k26ops_json("check", env=scratch_lab.env())
    assert rc == 1, data
    err = data["hosts"]["lab1"]["error"]
    assert "gpu_health: GPU 2 (00000000:3A:00.0): [Unknown Error] in the GPU query; ERR! in nvidia-smi's table" in err
    assert "gpus: " not in err  # still 8 GPUs: the failed one is named, not lost
    proc = k26ops("check", env=scratch_lab.env())
    assert proc.returncode == 1 and "GPU 2 (00000000:3A:00.0)" in proc.stdout + proc.stderr


def test_q_replays_a_recorded_output_with_the_lab_gpus_bus_ids_or_refuses():
    from k26ops.facts import smi_q

    text, rc = smi("-q", K26OPS_LAB_SMI_Q="none")
    assert rc == 255 and "Option -q is not recognized" in text
    # unset: the recorded healthy H200 -q (a byte copy beside the fixture), one GPU block per lab GPU
    # (issue 45 item 6: every lab host showed "ok, -q unread" and an ok line with ERROR in it)
    recorded_q = (DATA / "h200-nvidia-smi-q.txt").read_text()
    assert (FIXTURE.parent / "nvidia-smi-q.txt").read_text() == recorded_q
    text, rc = smi("-q")
    h = smi_q.parse_health_fact(text, rc)
    assert rc == 0 and h["faults"] == 0 and not h.get("error"), h
    assert [g["bus_id"] for g in h["gpus"]] == [
        "00000000:18:00.0",
        "00000000:2A:00.0",
        "00000000:3A:00.0",
        "00000000:5D:00.0",
        "00000000:9A:00.0",
        "00000000:AB:00.0",
        "00000000:BA:00.0",
        "00000000:DB:00.0",
    ]
    block = recorded_q.split("\nGPU ", 1)[1].split("\n", 1)[1]  # the recorded GPU block after its bus id line
    assert text.count(block.replace("NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition")) == 8
    text, rc = smi("-q", K26OPS_LAB_SMI_Q=str(DATA / "h200-nvidia-smi-q.txt"))
    recorded_q = (DATA / "h200-nvidia-smi-q.txt").read_text()
    assert rc == 0 and text == recorded_q.replace("GPU 00000000:00:06.0\n", "GPU 00000000:18:00.0\n")
    h = smi_q.parse_health_fact(text, rc)
    assert [g["bus_id"] for g in h["gpus"]] == ["00000000:18:00.0"] and h["faults"] == 0


def test_check_and_facts_on_a_lab_host_replaying_recorded_q_outputs(scratch_lab):
    import base64

    from labtools.invoke import k26ops, k26ops_json, lab_ssh

    port = scratch_lab.base_port

    def replay(name):
        b64 = base64.b64encode((DATA / name).read_bytes()).decode()
        cmd = (
            f"mkdir -p /etc/k26ops-lab && echo {b64} | base64 -d > /etc/k26ops-lab/q.txt"
            " && echo K26OPS_LAB_SMI_Q=/etc/k26ops-lab/q.txt > /etc/k26ops-lab/nvidia-smi.env"
        )
        res = lab_ssh(scratch_lab.dir, port, cmd)
        assert res.returncode == 0, res.stderr

    replay("h200-nvidia-smi-q.txt")
    rc, data = k26ops_json("facts", env=scratch_lab.env())
    assert rc == 0, data
    host = data["hosts"]["lab1"]
    assert host["health"] in ("ok", "ok, kernel log unread"), host["health"]
    assert host["facts"]["gpu_health"]["gpus"][0]["index"] == 0
    rc, data = k26ops_json("check", env=scratch_lab.env())
    err = data["hosts"]["lab1"].get("error") or ""
    assert "gpu_health" not in err, err

    replay("constructed-h200-q-faults.txt")
    rc, data = k26ops_json("check", env=scratch_lab.env())
    assert rc == 1, data
    err = data["hosts"]["lab1"]["error"]
    assert (
        "gpu_health: GPU 0 (00000000:18:00.0): ecc-uncorrectable (ECC Errors, Volatile: DRAM Uncorrectable : 2), "
        "row-remap-pending"
    ) in err
    assert "; action: reset-gpu: drain the host" in err
    proc = k26ops("facts", env=scratch_lab.env())
    assert "GPU 0 reset-gpu" in proc.stdout, proc.stdout


def test_a_lab_host_reads_its_recorded_q_and_check_prints_only_what_is_not_ok(scratch_lab):
    """Issue 45 item 6: every lab host showed "ok, -q unread" (the stand-in refused -q) and `check`
    printed 11 ok lines per host, one of them with the refusal's ERROR in it."""
    from labtools.invoke import k26ops, k26ops_json, lab_ssh

    res = lab_ssh(scratch_lab.dir, scratch_lab.base_port, "rm -f /etc/k26ops-lab/nvidia-smi.env")
    assert res.returncode == 0, res.stderr
    rc, data = k26ops_json("facts", env=scratch_lab.env())
    host = data["hosts"]["lab1"]
    assert rc == 0 and "-q unread" not in host["health"], host["health"]
    assert len(host["facts"]["gpu_health"]["gpus"]) == 8
    rc, data = k26ops_json("check", env=scratch_lab.env())
    checks = data["hosts"]["lab1"].get("checks") or []
    assert not any("ERROR" in c["detail"] for c in checks), checks
    proc = k26ops("check", env=scratch_lab.env())
    assert not [line for line in proc.stdout.splitlines() if ": ok " in line], proc.stdout
    if rc == 0:  # a passing host: -v lists what passed
        proc = k26ops("-v", "check", env=scratch_lab.env())
        assert "lab1: ok gpu_health: no GPU reports an error" in proc.stdout, proc.stdout
