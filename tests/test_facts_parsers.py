"""Fact parsers on recorded real outputs (tests/data/facts, see MANIFEST.json).

h200x2-* and local-* were recorded on real machines; constructed-* stand in
for hardware and failures we could not record and say so in the manifest.
"""

import json
from pathlib import Path

import pytest

from k26ops.facts import FACTS, cuda, disk, gpu
from k26ops.facts import os as os_facts

DATA = Path(__file__).parent / "data" / "facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())


def out(name):
    return (DATA / name).read_text(), MANIFEST[name]["rc"]


H200_UUIDS = ["GPU-c39fec64-dfe7-3a69-075c-0ab0f6a9f891", "GPU-2f1fd670-bf22-9227-5fb6-dcb37f0950d8"]


def test_manifest_lists_every_file_and_says_where_it_came_from():
    files = {p.name for p in DATA.iterdir()} - {"MANIFEST.json"}
    assert files == set(MANIFEST)
    for name, meta in MANIFEST.items():
        assert ("CONSTRUCTED" in meta["source"]) == name.startswith("constructed-"), name


@pytest.mark.parametrize("name", ["h200x2-smi-query-noheader-nounits.txt", "h200x2-smi-query-csv.txt",
                                  "h200x2-smi-query-noheader.txt", "h200x2-smi-query-nounits.txt"])
def test_gpus_real_h200_every_csv_variant(name):
    v = gpu.parse_gpus(*out(name))
    assert v["error"] is None and v["count"] == 2
    assert [g["index"] for g in v["gpus"]] == [0, 1]
    for g, uuid in zip(v["gpus"], H200_UUIDS):
        assert g == {"index": g["index"], "name": "NVIDIA H200", "memory_mib": 143771,
                     "driver_version": "580.159.04", "compute_cap": "9.0", "uuid": uuid}


def test_gpus_real_single_gpu_selection():
    v = gpu.parse_gpus(*out("h200x2-smi-query-i0.txt"))
    assert v["count"] == 1 and v["gpus"][0]["uuid"] == H200_UUIDS[0]


def test_query_csv_real_extra_fields_with_units():
    fields = ("index", "pci.bus_id", "memory.used", "memory.free", "power.limit", "persistence_mode",
              "mig.mode.current", "ecc.mode.current", "clocks.max.sm", "gpu_serial", "vbios_version",
              "pcie.link.gen.max", "pcie.link.width.max", "temperature.gpu", "utilization.gpu")
    with_units = gpu.parse_query_csv(out("h200x2-smi-query-extra.txt")[0], fields)
    bare = gpu.parse_query_csv(out("h200x2-smi-query-extra-noheader-nounits.txt")[0], fields)
    assert len(with_units) == 2
    assert with_units[0]["memory.free"] == "143156" and with_units[0]["power.limit"] == "700.00"
    assert with_units[0]["utilization.gpu"] == "0" and with_units[0]["clocks.max.sm"] == "1980"
    for a, b in zip(with_units, bare):  # temperature may differ between the two runs
        assert {k: v for k, v in a.items() if k != "temperature.gpu"} == \
               {k: v for k, v in b.items() if k != "temperature.gpu"}


def test_gpus_real_error_outputs_are_values():
    v = gpu.parse_gpus(*out("h200x2-smi-query-badfield.txt"))
    assert v["count"] == 0 and 'bogus_field' in v["error"] and "exited 2" in v["error"]
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
    assert v["gpus"][0] == {"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                            "memory_mib": 97887, "driver_version": "580.95.05", "compute_cap": None, "uuid": None}
    assert v["gpus"][1]["memory_mib"] is None and v["gpus"][1]["compute_cap"] == "12.0"


@pytest.mark.parametrize("name,why", [("constructed-nvml-mismatch.txt", "Failed to initialize NVML: Driver/library version mismatch"),
                                      ("constructed-no-devices.txt", "No devices were found")])
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
    assert (v["driver_version"], v["cuda_version"], v["smi_version"], v["header_style"]) == \
           ("580.159.04", "13.0", "580.159.04", "driver")
    assert v["gpu_names"] == ["NVIDIA H200", "NVIDIA H200"]
    v = gpu.parse_smi_header(*out("constructed-driver610-table.txt"))
    assert (v["driver_version"], v["cuda_version"], v["header_style"]) == ("610.12", "13.2", "kmd")
    v = gpu.parse_smi_header(*out("constructed-rtxpro6000x8-table.txt"))
    assert v["driver_version"] == "580.95.05" and len(v["gpu_names"]) == 8


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
