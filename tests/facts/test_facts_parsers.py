"""Fact parsers on recorded real outputs (tests/data/facts, see MANIFEST.json): what one
output's parsed value is, is a case in tests/data/facts/expected.json (test_fact_cases.py);
here are the checks a case cannot say: outputs joined or compared, properties over several
outputs, inputs written in the test.

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


def test_query_csv_with_and_without_units_agree():
    """nvidia-smi's units and header are stripped: the two formats of one query parse alike."""
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
    assert len(with_units) == len(bare) == 2
    for a, b in zip(with_units, bare):  # temperature may differ between the two runs
        assert {k: v for k, v in a.items() if k != "temperature.gpu"} == {
            k: v for k, v in b.items() if k != "temperature.gpu"
        }


def test_no_nvcc_output_is_no_toolkit():
    assert cuda.parse_cuda_toolkit("", 0) is None


def test_topology_single_gpu_and_garbage():
    one = "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n"
    v = gpu.parse_topology(one, 0)
    assert v["interconnect"] is None and v["gpus"] == ["GPU0"] and v["links"] == {}
    assert gpu.parse_topology("", 0)["interconnect"] is None


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


def test_os_release_unreadable_is_an_error():
    assert os_facts.parse_os_release("cat: /usr/lib/os-release: No such file or directory\n", 1)["error"]


def test_python_sys_version_makes_the_recorded_version_line():
    # the gather agent's own answer ("Python " + sys.version's first word) is the recorded
    # `python3 --version` of the same host, from its recorded sys.version
    assert "Python %s\n" % out("h200x2-python3-sysversion.txt")[0].split()[0] == out("h200x2-python3-version.txt")[0]


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


def test_mig_devices_and_their_processes_are_not_gpus():
    """The three recorded parts of one MIG table, joined: its GPUs, MIG devices and processes."""
    both = gpu.parse_smi_header(
        out("pub-go-nvml57-smi-table-mig-enabled.txt")[0]
        + "\n"
        + out("pub-nvitop8-smi-mig-devices.txt")[0]
        + "\n"
        + out("pub-nvitop8-smi-processes-mig.txt")[0],
        0,
    )
    assert len(both["gpus"]) == 2 and len(both["mig_devices"]) == 3 and len(both["processes"]) == 7


def test_err_gpu_fails_the_health_check_naming_index_and_bus_id():
    # ERR! in the name cell is the GPU's fault, never its name (issue 46): expected.json has the table's values
    v = gpu.parse_smi_header(*out("pub-gpu-operator559-smi-table-err.txt"))
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
    v = gpu.parse_gpus(refused, 0)  # as recorded (rc 2) in expected.json; rc 0 must not make a phantom GPU either
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
    "name",
    [
        "pub-datadog33120-smi-L-mig.txt",
        "pub-telegraf5812-smi-L-mig.txt",
        "pub-gpu-burn36-smi-L-8gpu.txt",
        "h200x1-smi-L.txt",
        "h200x2-smi-L.txt",
    ],
)
def test_list_uuids_are_gpu_and_mig_uuids(name):
    """-L's GPU lines and the MIG lines under them are told apart on every recorded -L."""
    v = gpu.parse_gpu_list(*out(name))
    assert all(g["uuid"].startswith("GPU-") and all(m["uuid"].startswith("MIG-") for m in g["mig"]) for g in v["gpus"])


def test_bus_id_the_query_lacks_comes_from_the_table():
    q, rc = out("h200x2-smi-query-noheader-nounits.txt")  # recorded before bus ids were asked for
    v = gpu.parse_gpus(q + "== k26ops: table\n" + out("h200x2-smi-table.txt")[0], rc)
    assert [(g["bus_id"], g["sources"]["bus_id"], g["sources"]["name"]) for g in v["gpus"]] == [
        ("00000000:00:06.0", "table", "query"),
        ("00000000:00:07.0", "table", "query"),
    ]
