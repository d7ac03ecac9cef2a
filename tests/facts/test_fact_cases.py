"""The fact parsers on every recorded output of tests/data/facts (provenance in MANIFEST.json,
expectations in expected.json), one parametrized test as for the crash logs
(tests/diagnose/test_diagnose_classify.py): a new recording is a file, its MANIFEST entry and
its expected.json case, no new test function.

expected.json maps a file to its cases, each `{"parser": NAME, "args": {...}, "is": VALUE}` or
`{..., "has": {PATH: VALUE, ...}}`. NAME is a key of PARSERS below; the parser gets the file's
text and its MANIFEST rc (the exit status it was recorded with), and `args` as keywords where
the case has them. "is" is the whole parsed value. "has" names parts of it, each PATH a dotted
path: dict keys and list indexes ("gpus.0.name"); `*` stands for every element of a list or
value of a dict, and there must be one ("gpus.*.error": every GPU's); `len(PATH)` is the length
there. Values compare as JSON (true is not 1, 1.0 is not 1). A key with a dot in it
("memory.free", "ssh.service") cannot be named in a path: give its parent whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from k26ops.facts import cuda, disk, driver, engine_user, fabric, gpu, platform, smi_q, smi_table, xid
from k26ops.facts import os as os_facts
from k26ops.steps import driver_plan

DATA = Path(__file__).parent.parent / "data" / "facts"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
EXPECTED = json.loads((DATA / "expected.json").read_text())


def _text_only(parse):
    """A parser of the text alone (an excerpt's parts, a plan's reading): the rc is not its input."""
    return lambda text, rc: parse(text)


def _query_csv(text, rc, fields):
    return gpu.parse_query_csv(text, tuple(fields))


def _kernel_text(text, rc, bus_ids):
    """The Xid events with GPU indexes from nvidia-smi's bus ids, as diagnose reads a log."""
    return [e.to_json() for e in xid.parse_kernel_text(text, bus_ids)]


def _nvidia_module(text, rc, proc=None):
    """The nvidia_module fact's output is /proc's version file, a separator, then modinfo's. Where
    the two were recorded apart, the case's file is modinfo's output (its rc is the fact's) and
    `proc` names the /proc file; without `proc` the file is the whole output."""
    if proc is not None:
        text = (DATA / proc).read_text() + f"{driver.SEP}modinfo\n" + text
    return driver.parse_nvidia_module(text, rc)


# "module.function" (k26ops.facts.<module>; driver_plan is k26ops.steps.driver_plan) -> (text, rc, **args)
PARSERS = {
    "gpu.parse_gpus": gpu.parse_gpus,
    "gpu.parse_gpu_list": gpu.parse_gpu_list,
    "gpu.parse_topology": gpu.parse_topology,
    "gpu.parse_smi_header": gpu.parse_smi_header,
    "gpu.parse_query_csv": _query_csv,
    "smi_table.parse_table": _text_only(smi_table.parse_table),
    "smi_q.parse_health_fact": smi_q.parse_health_fact,
    "xid.parse_xid_fact": xid.parse_xid_fact,
    "xid.parse_kernel_text": _kernel_text,
    "cuda.parse_cuda_toolkit": cuda.parse_cuda_toolkit,
    "os.parse_os_release": os_facts.parse_os_release,
    "os.parse_python_version": os_facts.parse_python_version,
    "os.parse_systemd_version": os_facts.parse_systemd_version,
    "disk.parse_disk_free": disk.parse_disk_free,
    "platform.parse_platform": platform.parse_platform,
    "engine_user.parse_engine_user": engine_user.parse_engine_user,
    "driver.parse_proc_version": _text_only(driver.parse_proc_version),
    "driver.parse_nvidia_module": _nvidia_module,
    "driver.parse_nvswitch": driver.parse_nvswitch,
    "driver.parse_systemctl_show": driver.parse_systemctl_show,
    "driver.parse_packages": driver.parse_packages,
    "driver_plan.parse_policy": _text_only(driver_plan.parse_policy),
    "fabric.reasons": _text_only(fabric.reasons),
    "fabric.parse_fabric_manager": fabric.parse_fabric_manager,
}

# Recorded files no case reads, each checked where its comment says. Keep it short: a recorded
# command output gets a case.
ELSEWHERE = {
    "nvidia-xid-catalog.txt": "NVIDIA's Xid catalogue, not an output: test_facts_xid_catalog",
    "nvidia-sxid-catalog.txt": "NVIDIA's SXid tables, not an output: test_facts_xid_catalog",
    "h200x2-gather-input.json": "the command list the recorded gather was given; its output is the next one",
    "h200x2-gather-output.json": "every fact in one gather: test_facts_parsers, parse_results",
    "h200x2-python3-sysversion.txt": "sys.version, no fact's output: test_facts_parsers compares it with --version",
    "h200x2-smi-version.txt": "nvidia-smi --version, no fact runs it: test_lab_nvidia_smi (the lab's copy of it)",
    "h200x2-smi-help-query-gpu.txt": "nvidia-smi's list of query fields, where the gpus fact's fields come from",
}

CASES = [(name, i) for name in sorted(EXPECTED) for i in range(len(EXPECTED[name]))]


def same(got, want) -> bool:
    return json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def at(value, path: str) -> list:
    """The values at a dotted path: one, or one per element where the path has a `*`."""
    values = [value]
    for key in path.split(".") if path else []:
        found = []
        for v in values:
            if key == "*":
                items = list(v.values()) if isinstance(v, dict) else list(v)
                assert items, f"{path}: `*` over an empty {type(v).__name__}"
                found += items
            elif isinstance(v, list):
                found.append(v[int(key)])
            else:
                found.append(v[key])
        values = found
    return values


def check(got, path: str, want) -> None:
    m = re.fullmatch(r"len\((.*)\)", path)
    try:
        values = [len(v) for v in at(got, m.group(1))] if m else at(got, path)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        pytest.fail(f"{path}: not in the parsed value ({type(e).__name__}: {e}): {json.dumps(got)[:2000]}")
    for v in values:
        assert same(v, want), f"{path}: got {json.dumps(v)}, want {json.dumps(want)}"


@pytest.mark.parametrize("name, i", CASES, ids=[f"{n}:{EXPECTED[n][i]['parser']}" for n, i in CASES])
def test_fact_case(name, i):
    case = EXPECTED[name][i]
    got = PARSERS[case["parser"]]((DATA / name).read_text(), MANIFEST[name]["rc"], **case.get("args", {}))
    if "is" in case:
        assert same(got, case["is"]), f"got {json.dumps(got)}"
    for path, want in case.get("has", {}).items():
        check(got, path, want)


def test_cases_are_well_formed_and_every_parser_is_used():
    for name, cases in EXPECTED.items():
        for case in cases:
            assert set(case) <= {"parser", "args", "is", "has"}, (name, case)
            assert case["parser"] in PARSERS, (name, case["parser"])
            assert ("is" in case) != ("has" in case), (name, case["parser"], "one of is or has")
            assert case.get("has", True), (name, case["parser"], "an empty has checks nothing")
    assert {c["parser"] for cases in EXPECTED.values() for c in cases} == set(PARSERS)


def test_every_recorded_output_has_a_case_or_is_checked_elsewhere():
    """A new recording without expectations fails here: give it a case in expected.json."""
    assert set(EXPECTED) <= set(MANIFEST), set(EXPECTED) - set(MANIFEST)
    assert not set(EXPECTED) & set(ELSEWHERE), set(EXPECTED) & set(ELSEWHERE)
    assert set(MANIFEST) - set(EXPECTED) - set(ELSEWHERE) == set(), "recorded, but no case in expected.json"
    assert set(ELSEWHERE) <= set(MANIFEST)


def test_manifest_lists_every_file_and_says_where_it_came_from():
    """Every file is in MANIFEST.json, and its source says how it was made: recorded on a machine,
    CONSTRUCTED (and named constructed-*), or one public page (pub-* always)."""
    files = {p.name for p in DATA.iterdir()} - {"MANIFEST.json", "expected.json"}
    assert files == set(MANIFEST)
    for name, meta in MANIFEST.items():
        src = meta["source"]
        assert ("CONSTRUCTED" in src) == name.startswith("constructed-"), name
        assert src.startswith("recorded") or "CONSTRUCTED" in src or src.count("https://") == 1, name
        if name.startswith("pub-"):
            assert src.count("https://") == 1, name
        assert isinstance(meta["rc"], int) and meta["command"], name
