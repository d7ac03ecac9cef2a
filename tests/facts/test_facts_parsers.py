"""Fact parsers on recorded real outputs (tests/data/facts, see MANIFEST.json).

h200x2-* and local-* were recorded on real machines; constructed-* stand in
for hardware and failures we could not record and say so in the manifest.
"""

import json
from pathlib import Path

import pytest

from k26ops.facts import FACTS, cuda, disk, gpu
from k26ops.facts import os as os_facts

DATA = Path(__file__).parent.parent / "data" / "facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def out(name):
    return (DATA / name).read_text(), MANIFEST[name]["rc"]


H200_UUIDS = ["GPU-c39fec64-dfe7-3a69-075c-0ab0f6a9f891", "GPU-2f1fd670-bf22-9227-5fb6-dcb37f0950d8"]
BASE_KEYS = ("index", "name", "memory_mib", "driver_version", "compute_cap", "uuid")


def base(g):
    return {k: g[k] for k in BASE_KEYS}


@pytest.mark.parametrize(
    "name",
    [
        "h200x2-smi-query-noheader-nounits.txt",
        "h200x2-smi-query-csv.txt",
        "h200x2-smi-query-noheader.txt",
        "h200x2-smi-query-nounits.txt",
    ],
)
def test_gpus_real_h200_every_csv_variant(name):
    v = gpu.parse_gpus(*out(name))
    assert v["error"] is None and v["count"] == 2
    assert [g["index"] for g in v["gpus"]] == [0, 1]
    for g, uuid in zip(v["gpus"], H200_UUIDS):
        assert base(g) == {
            "index": g["index"],
            "name": "NVIDIA H200",
            "memory_mib": 143771,
            "driver_version": "580.159.04",
            "compute_cap": "9.0",
            "uuid": uuid,
        }
        assert g["error"] is None and set(g["sources"].values()) == {"query"}


def test_gpus_real_single_gpu_selection():
    v = gpu.parse_gpus(*out("h200x2-smi-query-i0.txt"))
    assert v["count"] == 1 and v["gpus"][0]["uuid"] == H200_UUIDS[0]


def test_query_csv_real_extra_fields_with_units():
    fields = (
        "index",
        "pci.bus_id",
        "memory.used",
        "memory.free",
        "power.limit",
        "persistence_mode",
        "mig.mode.current",
        "ecc.mode.current",
        "clocks.max.sm",
        "gpu_serial",
        "vbios_version",
        "pcie.link.gen.max",
        "pcie.link.width.max",
        "temperature.gpu",
        "utilization.gpu",
    )
    with_units = gpu.parse_query_csv(out("h200x2-smi-query-extra.txt")[0], fields)
    bare = gpu.parse_query_csv(out("h200x2-smi-query-extra-noheader-nounits.txt")[0], fields)
    assert len(with_units) == 2
    assert with_units[0]["memory.free"] == "143156" and with_units[0]["power.limit"] == "700.00"
    assert with_units[0]["utilization.gpu"] == "0" and with_units[0]["clocks.max.sm"] == "1980"
    for a, b in zip(with_units, bare):  # temperature may differ between the two runs
        assert {k: v for k, v in a.items() if k != "temperature.gpu"} == {
            k: v for k, v in b.items() if k != "temperature.gpu"
        }


def test_gpus_real_error_outputs_are_values():
    v = gpu.parse_gpus(*out("h200x2-smi-query-badfield.txt"))
    assert v["count"] == 0 and "bogus_field" in v["error"] and "exited 2" in v["error"]
    v = gpu.parse_gpus(*out("h200x2-smi-badopt.txt"))
    assert v["count"] == 0 and "not recognized" in v["error"]


def test_gpus_constructed_rtxpro6000():
    for name in ("constructed-rtxpro6000x8-query-noheader-nounits.txt", "constructed-rtxpro6000x8-query-csv.txt"):
        v = gpu.parse_gpus(*out(name))
        assert v["count"] == 8 and v["error"] is None
        assert {g["name"] for g in v["gpus"]} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
        assert {(g["memory_mib"], g["compute_cap"]) for g in v["gpus"]} == {(97887, "12.0")}


def test_gpus_constructed_na_and_spaces():
    v = gpu.parse_gpus(*out("constructed-query-na-spaces.txt"))
    assert v["count"] == 2
    assert base(v["gpus"][0]) == {
        "index": 0,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "memory_mib": 97887,
        "driver_version": "580.95.05",
        "compute_cap": None,
        "uuid": None,
    }
    assert v["gpus"][1]["memory_mib"] is None and v["gpus"][1]["compute_cap"] == "12.0"


@pytest.mark.parametrize(
    "name,why",
    [
        ("constructed-nvml-mismatch.txt", "Failed to initialize NVML: Driver/library version mismatch"),
        ("constructed-no-devices.txt", "No devices were found"),
    ],
)
def test_nvidia_smi_failures_become_reasons(name, why):
    for parse in (gpu.parse_gpus, gpu.parse_topology, gpu.parse_smi_header):
        v = parse(*out(name))
        assert v["error"] == why
    assert gpu.parse_gpus(*out(name))["gpus"] == []


@pytest.mark.parametrize("name", ["local-command-not-found-dash.txt", "local-command-not-found-bash.txt"])
def test_command_not_found(name):
    text, rc = out(name)
    assert gpu.parse_gpus(text, rc) == {"count": 0, "gpus": [], "error": "nvidia-smi: command not found"}
    assert os_facts.parse_systemd_version(text, rc) is None
    assert os_facts.parse_python_version(text, rc) is None
    assert cuda.parse_cuda_toolkit("", 0) is None


@pytest.mark.parametrize("name", ["h200x2-smi-topo-m.txt", "h200x2-smi-topo-m-tty.txt"])
def test_topology_real_nvlink(name):
    v = gpu.parse_topology(*out(name))
    assert v["error"] is None and v["interconnect"] == "nvlink"
    assert v["links"] == {"GPU0-GPU1": "NV18"}
    assert v["matrix"]["GPU0"]["GPU0"] == "X" and v["matrix"]["GPU1"]["CPU Affinity"] == "0-31"


def test_topology_constructed_pcie_8_gpus_with_nics():
    v = gpu.parse_topology(*out("constructed-rtxpro6000x8-topo-m.txt"))
    assert v["interconnect"] == "pcie" and v["gpus"] == [f"GPU{i}" for i in range(8)]
    assert len(v["links"]) == 28
    assert set(v["links"].values()) == {"PIX", "PXB", "NODE", "SYS"}
    assert v["matrix"]["NIC0"]["GPU0"] == "PIX"


def test_topology_single_gpu_and_garbage():
    one = "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n"
    v = gpu.parse_topology(one, 0)
    assert v["interconnect"] is None and v["gpus"] == ["GPU0"] and v["links"] == {}
    assert gpu.parse_topology("", 0)["interconnect"] is None


def test_smi_header_real_and_driver610():
    v = gpu.parse_smi_header(*out("h200x2-smi-table.txt"))
    assert (v["driver_version"], v["cuda_version"], v["smi_version"], v["header_style"]) == (
        "580.159.04",
        "13.0",
        "580.159.04",
        "driver",
    )
    assert v["gpu_names"] == ["NVIDIA H200", "NVIDIA H200"]
    v = gpu.parse_smi_header(*out("constructed-driver610-table.txt"))
    assert (v["driver_version"], v["cuda_version"], v["header_style"]) == ("610.12", "13.2", "kmd")
    v = gpu.parse_smi_header(*out("constructed-rtxpro6000x8-table.txt"))
    assert v["driver_version"] == "580.95.05" and len(v["gpu_names"]) == 8


def test_driver_version_without_the_query_from_the_table_or_q_header():
    """A deploy gathers the query and -q, not the table: where the query gave no driver, the
    recorded -q header gives the same driver as the recorded table of that driver."""
    from k26ops.facts import smi_q
    from k26ops.host import preflight

    none = {"gpus": {"gpus": []}}
    table = gpu.parse_smi_header(*out("h200x2-smi-table.txt"))
    health = smi_q.parse_health_fact(*out("h200-nvidia-smi-q.txt"))
    assert preflight.driver_version({**none, "nvidia_smi": table}) == ("580.159.04", 580)
    assert preflight.driver_version({**none, "gpu_health": health}) == ("580.159.04", 580)
    assert preflight.driver_version(none) == (None, None)


def test_nvcc_real_device_and_local():
    for name in ("h200x2-nvcc-version.txt", "local-nvcc-version.txt"):
        v = cuda.parse_cuda_toolkit(*out(name))
        assert (v["release"], v["version"]) == ("13.0", "13.0.88")


def test_os_release_real():
    v = os_facts.parse_os_release(*out("h200x2-os-release.txt"))
    assert (v["id"], v["version_id"], v["codename"]) == ("ubuntu", "24.04", "noble")
    assert v["pretty_name"] == "Ubuntu 24.04.3 LTS"
    v = os_facts.parse_os_release(*out("local-os-release.txt"))
    assert (v["id"], v["version_id"], v["codename"]) == ("debian", "12", "bookworm")
    assert os_facts.parse_os_release("cat: /usr/lib/os-release: No such file or directory\n", 1)["error"]


def test_python_real():
    assert os_facts.parse_python_version(*out("h200x2-python3-version.txt"))["tuple"] == [3, 12, 3]
    # the gather agent's own answer ("Python " + sys.version's first word) is the recorded
    # `python3 --version` of the same host, from its recorded sys.version
    assert "Python %s\n" % out("h200x2-python3-sysversion.txt")[0].split()[0] == out("h200x2-python3-version.txt")[0]
    v = os_facts.parse_python_version(*out("local-python3-version.txt"))
    assert v["error"] is None and v["tuple"][0] == 3


def test_systemd_real():
    v = os_facts.parse_systemd_version(*out("local-systemctl-version.txt"))
    assert v["version"] == 252 and v["full"] == "252.39-1~deb12u2" and "+PAM" in v["features"]


def test_df_real_plain_output():
    v = disk.parse_disk_free(*out("h200x2-df.txt"))
    assert v["/"]["size"] == 270553174016 and v["/"]["available"] == 137421373440
    v = disk.parse_disk_free(*out("local-df.txt"))
    assert all(r["available"] > 0 for r in v.values())
    assert "No such file" in disk.parse_disk_free(*out("h200x2-df-missing.txt"))["error"]


def test_gather_output_recorded_on_device_parses():
    raw = json.loads((DATA / "h200x2-gather-output.json").read_text())
    extra = [disk.disk_free_fact(["/", "/tmp", "/models/k26/not-yet"])]
    from k26ops.facts import parse_results

    v = parse_results(raw, extra=extra)
    assert v["gpus"]["count"] == 2 and v["gpu_topology"]["interconnect"] == "nvlink"
    assert v["nvidia_smi"]["driver_version"] == "580.159.04"
    assert v["cuda_toolkit"]["version"] == "13.0.88"
    assert v["os_release"]["id"] == "ubuntu" and v["python3"]["version"] == "3.12.3"
    assert v["systemd"] is None  # no systemctl in that container: rc 127
    assert v["disk_free"]["/models/k26/not-yet"]["path"] == "/"
    assert v["disk_free"]["/tmp"]["available"] > 0


def test_parsers_never_raise_on_garbage():
    for fact in FACTS.values():
        for text, rc in (("", 0), ("\x00\xff garbage\n,,,\n== \n", 1), ("a, b\n" * 3, 0)):
            fact.parse(text, rc)  # must return a value, not raise


# --- every nvidia-smi layout (issue 17): tables with processes, MIG, failed GPUs, old drivers ---


def table(name):
    return gpu.parse_smi_header(*out(name))


def test_table_with_a_processes_block_counts_only_gpus():
    v = table("h200x1-smi-table-procs.txt")  # recorded with a torch process holding 6 GiB
    assert [(g["index"], g["name"], g["bus_id"], g["memory_used_mib"], g["memory_mib"]) for g in v["gpus"]] == [
        (0, "NVIDIA H200", "00000000:00:06.0", 6671, 143771)
    ]
    assert v["processes"] == [
        {"gpu": 0, "gi": None, "ci": None, "pid": 441, "type": "C", "name": "python3", "memory_mib": 6662}
    ]
    assert v["gpu_names"] == ["NVIDIA H200"] and v["gpu_errors"] == []
    old = table("pub-cfsworks-nvml-fix11-smi-table-396.txt")  # pre-MIG process columns
    assert len(old["gpus"]) == 1 and old["gpus"][0]["memory_mib"] == 8114
    assert [(p["pid"], p["type"], p["name"], p["memory_mib"]) for p in old["processes"]] == [
        (489, "G", "/usr/bin/X", 1025),
        (662, "G", "kwin_x11", 313),
        (668, "G", "/usr/bin/krunner", 3),
    ]
    v = table("pub-gpu-t121-smi-table-340.txt")  # driver 340: "Compute processes", short bus id
    assert [(g["name"], g["bus_id"], g["memory_mib"]) for g in v["gpus"]] == [("GeForce 8400M GS", "0000:01:00.0", 127)]
    assert v["processes"] == [] and v["driver_version"] == "340.108"


def test_mig_devices_and_their_processes_are_not_gpus():
    v = table("pub-go-nvml57-smi-table-mig-enabled.txt")
    assert [(g["index"], g["name"], g["bus_id"]) for g in v["gpus"]] == [
        (0, "NVIDIA A100 80G...", "00000000:31:00.0"),
        (1, "NVIDIA A100 80G...", "00000000:B1:00.0"),
    ]
    mig = gpu.parse_table(out("pub-nvitop8-smi-mig-devices.txt")[0])
    assert mig["gpus"] == [] and [
        (m["gpu"], m["gi"], m["ci"], m["device"], m["memory_used_mib"], m["memory_mib"], m["sm"])
        for m in mig["mig_devices"]
    ] == [(1, 3, 0, 0, 14366, 19968, 28), (1, 5, 0, 1, 9826, 19968, 28), (1, 6, 0, 2, 13, 19968, 28)]
    procs = gpu.parse_table(out("pub-nvitop8-smi-processes-mig.txt")[0])
    assert procs["gpus"] == [] and len(procs["processes"]) == 7
    assert procs["processes"][2] == {
        "gpu": 1,
        "gi": "3",
        "ci": "0",
        "pid": 34965,
        "type": "C",
        "name": "python",
        "memory_mib": 14195,
    }
    both = gpu.parse_smi_header(
        out("pub-go-nvml57-smi-table-mig-enabled.txt")[0]
        + "\n"
        + out("pub-nvitop8-smi-mig-devices.txt")[0]
        + "\n"
        + out("pub-nvitop8-smi-processes-mig.txt")[0],
        0,
    )
    assert len(both["gpus"]) == 2 and len(both["mig_devices"]) == 3 and len(both["processes"]) == 7


def test_err_gpu_is_an_error_naming_index_and_bus_id():
    v = table("pub-gpu-operator559-smi-table-err.txt")
    # ERR! in the name cell is the GPU's fault, never its name (issue 46)
    assert [(g["index"], g["name"], g["errors"]) for g in v["gpus"]] == [(0, None, ["ERR!"]), (1, "NVIDIA A40", [])]
    assert v["gpu_errors"] == ["GPU 0 (00000000:19:00.0): ERR! in nvidia-smi's table"]
    fan = table("pub-nvidia-gpu-exporter393-smi-table-err-fan.txt")  # excerpt below the header
    assert [g["index"] for g in fan["gpus"]] == [13, 14]
    assert fan["gpu_errors"] == ["GPU 14 (00000000:CC:00.0): ERR! in nvidia-smi's table"]
    from k26ops.host import preflight

    c = preflight.gpu_health_check({"gpus": {"gpus": [], "gpu_errors": []}, "nvidia_smi": v})
    assert not c.ok and c.detail == "GPU 0 (00000000:19:00.0): ERR! in nvidia-smi's table"


def test_gpus_fact_merges_the_table_errors():
    refused_free = (
        "0, [Unknown Error], 46068, 525.125.06, [Unknown Error], GPU-x, 00000000:19:00.0\n"  # CONSTRUCTED row
    )
    v = gpu.parse_gpus(refused_free + "== k26ops: table\n" + out("pub-gpu-operator559-smi-table-err.txt")[0], 0)
    assert v["count"] == 1 and v["gpu_errors"] == [
        "GPU 0 (00000000:19:00.0): [Unknown Error] in the GPU query; ERR! in nvidia-smi's table"
    ]


def test_refused_compute_cap_falls_back_to_the_table_with_sources():
    refused, rc = out("pub-inference-snaps128-query-compute-cap-refused.txt")
    for code in (rc, 0):  # rc 0 must not make a phantom GPU either
        v = gpu.parse_gpus(refused, code)
        assert v["count"] == 0 and v["gpus"] == [] and v["query_refused"] == "compute_cap" and v["error"]
    v = gpu.parse_gpus(refused + "== k26ops: table\n" + out("pub-cfsworks-nvml-fix11-smi-table-396.txt")[0], rc)
    assert v["error"] is None and v["count"] == 1 and v["source"] == "table"
    g = v["gpus"][0]
    assert (g["name"], g["memory_mib"], g["driver_version"], g["bus_id"]) == (
        "GeForce GTX 1070",
        8114,
        "396.24",
        "00000000:24:00.0",
    )
    assert g["compute_cap"] is None and "compute_cap" not in g["sources"]  # not in the name table: unknown
    assert g["sources"] == {
        "index": "table",
        "name": "table",
        "memory_mib": "table",
        "bus_id": "table",
        "driver_version": "table",
    }
    v = gpu.parse_gpus(refused + "== k26ops: table\n" + out("pub-go-nvml57-smi-table-mig-enabled.txt")[0], rc)
    assert v["count"] == 2 and {(g["compute_cap"], g["sources"]["compute_cap"]) for g in v["gpus"]} == {("8.0", "name")}


def test_refused_query_uses_the_query_without_compute_cap():
    refused, rc = out("pub-inference-snaps128-query-compute-cap-refused.txt")
    fallback = out("h200x2-smi-query-noheader-nounits.txt")[0].replace(", 9.0,", ",")  # recorded rows minus compute_cap
    v = gpu.parse_gpus(refused + "== k26ops: query without compute_cap\n" + fallback, rc)
    assert v["count"] == 2 and v["source"] == "query_no_cc"
    assert [(g["name"], g["memory_mib"], g["uuid"], g["compute_cap"]) for g in v["gpus"]] == [
        ("NVIDIA H200", 143771, u, "9.0") for u in H200_UUIDS
    ]
    assert v["gpus"][0]["sources"]["name"] == "query_no_cc" and v["gpus"][0]["sources"]["compute_cap"] == "name"


@pytest.mark.parametrize(
    "name,cc",
    [
        ("NVIDIA H200", "9.0"),
        ("NVIDIA A100-SXM...", "8.0"),
        ("NVIDIA A100 80G...", "8.0"),
        ("NVIDIA RTX PRO 6000 Blackw...", "12.0"),
        ("NVIDIA H20", "9.0"),
        ("NVIDIA H20...", None),
        ("NVIDIA RTX 4000 Ada Gene...", None),
        ("ERR!", None),
        ("NVIDIA A10G", None),
        ("GeForce GTX 1070", None),
        (None, None),
    ],
)
def test_compute_cap_from_name_only_where_unambiguous(name, cc):
    from k26ops.facts import compute_cap

    assert compute_cap.from_name(name) == cc


@pytest.mark.parametrize(
    "name,gpus,migs",
    [
        ("pub-datadog33120-smi-L-mig.txt", 1, 7),
        ("pub-telegraf5812-smi-L-mig.txt", 4, 4),
        ("pub-gpu-burn36-smi-L-8gpu.txt", 8, 0),
        ("h200x1-smi-L.txt", 1, 0),
        ("h200x2-smi-L.txt", 2, 0),
    ],
)
def test_list_real(name, gpus, migs):
    v = gpu.parse_gpu_list(*out(name))
    assert v["error"] is None and (v["count"], v["mig_count"]) == (gpus, migs)
    assert all(g["uuid"].startswith("GPU-") and all(m["uuid"].startswith("MIG-") for m in g["mig"]) for g in v["gpus"])


def test_list_mig_lines_belong_to_their_gpu():
    v = gpu.parse_gpu_list(*out("pub-telegraf5812-smi-L-mig.txt"))
    assert v["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB" and v["gpus"][0]["mig"][3] == {
        "profile": "1g.20gb",
        "device": 3,
        "uuid": "MIG-930574a9-d43a-5d2b-95da-3e68384c8d6b",
    }
    assert [len(g["mig"]) for g in v["gpus"]] == [4, 0, 0, 0]
    assert gpu.parse_gpu_list(*out("constructed-nvml-mismatch.txt"))["error"].startswith("Failed to initialize NVML")


def test_topology_space_separated_real():
    v = gpu.parse_topology(*out("pub-k8s53497-topo-m-spaces.txt"))
    assert v["interconnect"] == "pcie" and v["gpus"] == [f"GPU{i}" for i in range(5)]
    assert v["links"]["GPU0-GPU1"] == "PIX" and v["links"]["GPU3-GPU4"] == "SYS"
    assert v["matrix"]["GPU4"]["mlx4_0"] == "SYS" and v["matrix"]["GPU4"]["CPU Affinity"] == "10-19,30-39"
    v = gpu.parse_topology(*out("pub-deepep128-topo-m-spaces.txt"))
    assert v["interconnect"] == "pcie" and len(v["gpus"]) == 6
    assert v["matrix"]["GPU4"]["NIC4"] == "PIX" and v["matrix"]["GPU4"]["NUMA Affinity"] == "1"
    assert v["matrix"]["GPU5"]["CPU Affinity"] == "56-111,168-223" and v["matrix"]["GPU5"]["GPU NUMA ID"] == "N/A"
    v = gpu.parse_topology(*out("pub-nccl-tests78-topo-m-spaces.txt"))
    assert v["interconnect"] == "nvlink" and len(v["links"]) == 6 and set(v["links"].values()) == {"NV6"}
    assert v["matrix"]["GPU3"]["mlx5_1"] == "PIX"


def test_topology_single_gpu_recorded():
    v = gpu.parse_topology(*out("h200x1-smi-topo-m.txt"))
    assert v["interconnect"] is None and v["gpus"] == ["GPU0"] and v["matrix"]["GPU0"]["CPU Affinity"] == "0-15"


def test_query_used_memory_recorded():
    rows = gpu.parse_query_csv(
        out("h200x1-smi-query-used.txt")[0], ("index", "name", "pci.bus_id", "memory.used", "memory.total")
    )
    assert rows == [
        {
            "index": "0",
            "name": "NVIDIA H200",
            "pci.bus_id": "00000000:00:06.0",
            "memory.used": "6671",
            "memory.total": "143771",
        }
    ]
    apps = gpu.parse_query_csv(out("h200x1-smi-query-apps.txt")[0], ("pid", "process_name", "used_gpu_memory"))
    assert apps == [{"pid": "441", "process_name": "python3", "used_gpu_memory": "6662"}]


def test_bus_id_the_query_lacks_comes_from_the_table():
    q, rc = out("h200x2-smi-query-noheader-nounits.txt")  # recorded before bus ids were asked for
    v = gpu.parse_gpus(q + "== k26ops: table\n" + out("h200x2-smi-table.txt")[0], rc)
    assert [(g["bus_id"], g["sources"]["bus_id"], g["sources"]["name"]) for g in v["gpus"]] == [
        ("00000000:00:06.0", "table", "query"),
        ("00000000:00:07.0", "table", "query"),
    ]


def test_err_in_the_name_cell_of_an_excerpt_is_no_name():
    v = table("pub-lambda-docs-smi-table-err.txt")
    assert [(g["index"], g["name"], g["bus_id"], g["errors"]) for g in v["gpus"]] == [
        (4, "NVIDIA A100-SXM...", "00000000:8C:00.0", []),
        (5, None, "00000000:91:00.0", ["ERR!"]),
    ]
    h = gpu.parse_smi_header(*out("pub-lambda-docs-smi-table-err.txt"))
    assert h["gpu_names"] == ["NVIDIA A100-SXM...", None]
    assert h["gpu_errors"] == ["GPU 5 (00000000:91:00.0): ERR! in nvidia-smi's table"]


@pytest.mark.parametrize(
    "name, bus, why",
    [
        ("pub-xxd3vin19-smi-device-handle.txt", "0000:0B:00.0", "Unknown Error"),
        ("pub-owod81-smi-device-handle-gpu-lost.txt", "0000:02:00.0", "GPU is lost"),
    ],
)
def test_a_gpu_nvidia_smi_cannot_open_is_a_fault_naming_its_bus_id(name, bus, why):
    v = gpu.parse_gpus(*out(name))
    assert v["count"] == 0 and len(v["gpu_errors"]) == 1
    assert v["gpu_errors"][0].startswith(f"GPU ({bus}): nvidia-smi cannot open it: {why}")
    assert v["failed_gpus"][0]["bus_id"] == bus
    h = gpu.parse_smi_header(*out(name))
    assert h["gpu_errors"] == v["gpu_errors"]
