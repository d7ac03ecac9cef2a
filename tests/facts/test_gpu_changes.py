"""k26ops.facts.changes: GPU health over a run, from two gatherings of the health facts, on
recorded nvidia-smi -q outputs and kernel logs (tests/data/facts; MANIFEST says which are
real and which constructed), and the report's section of it."""

from __future__ import annotations

import copy

from k26ops.facts import changes, smi_q, xid
from k26ops.report import model, page
from labtools import REPO

FACTS = REPO / "tests/data/facts"
HEALTHY = smi_q.parse_health((FACTS / "h200-nvidia-smi-q.txt").read_text())  # the real H200
FAULTY = smi_q.parse_health((FACTS / "constructed-h200-q-faults.txt").read_text())  # the same GPU, faults
QUIET = xid.parse_xid_fact((FACTS / "h200-xid-fact-healthy.txt").read_text(), 0)  # the real H200, no Xid
XIDS = xid.parse_xid_fact((FACTS / "pub-gpud46-dmesg-xid13-109.txt").read_text(), 0)  # a public kernel log


def test_nothing_changed_is_an_empty_list():
    assert (
        changes.gpu_changes(
            {"gpu_health": HEALTHY, "gpu_xid": QUIET},
            {"gpu_health": copy.deepcopy(HEALTHY), "gpu_xid": copy.deepcopy(QUIET)},
        )
        == []
    )


def test_ecc_row_remaps_and_new_faults_are_named_per_gpu():
    got = changes.gpu_changes({"gpu_health": HEALTHY}, {"gpu_health": FAULTY})
    what = [(c["gpu"], c["change"], c["before"], c["after"]) for c in got]
    assert ("0000:00:06.0", "uncorrectable ECC errors (volatile)", 0, 2) in what
    assert ("0000:00:06.0", "rows remapped for uncorrectable errors", 0, 2) in what
    assert ("0000:00:06.0", "row remap pending", "No", "Yes") in what
    assert any(c.startswith("new fault recovery-action") for _g, c, _b, _a in what)
    assert not any("ecc-uncorrectable" in c for _g, c, _b, _a in what)  # said once, by its counter
    # a fault there before is no change; the GPU index is used where the gpus fact gave it
    idx = copy.deepcopy(FAULTY)
    idx["gpus"][0]["index"] = 3
    assert changes.gpu_changes({"gpu_health": FAULTY}, {"gpu_health": idx}) == []
    assert {c["gpu"] for c in changes.gpu_changes({"gpu_health": HEALTHY}, {"gpu_health": idx})} == {3}
    # counters cleared (a GPU reset clears the volatile ones) and faults gone: nothing new went wrong
    assert changes.gpu_changes({"gpu_health": FAULTY}, {"gpu_health": HEALTHY}) == []
    fewer = copy.deepcopy(FAULTY)
    fewer["gpus"][0]["ecc"]["volatile_uncorrectable"] = 1
    assert changes.gpu_changes({"gpu_health": FAULTY}, {"gpu_health": fewer}) == []
    gone = changes.gpu_changes({"gpu_health": HEALTHY}, {"gpu_health": {**HEALTHY, "gpus": []}})
    assert [c["change"] for c in gone] == ["gone from nvidia-smi -q"]


def test_new_xids_one_line_per_gpu_and_code():
    got = changes.gpu_changes({"gpu_xid": QUIET}, {"gpu_xid": XIDS})
    assert [(c["after"], c["change"].split(":")[0]) for c in got] == [
        (13, "new Xid 13 (3 times)"),
        (109, "new Xid 109"),
    ]
    assert changes.gpu_changes({"gpu_xid": XIDS}, {"gpu_xid": copy.deepcopy(XIDS)}) == []  # the same log: none new


def test_nothing_compared_when_a_fact_could_not_be_read():
    unread = {"events": [], "count": 0, "worst_action": "none", "error": "the kernel log could not be read"}
    assert changes.gpu_changes({"gpu_xid": QUIET}, {"gpu_xid": unread}) is None
    assert changes.gpu_changes({}, {"gpu_health": HEALTHY}) is None
    assert (
        changes.gpu_changes({"gpu_xid": unread, "gpu_health": HEALTHY}, {"gpu_xid": XIDS, "gpu_health": HEALTHY}) == []
    )


def test_the_report_draws_them_or_says_none_changed():
    run = {
        "command": "deploy",
        "hosts": {
            "h": {
                "status": "changed",
                "engine_restarted": True,
                "health": {"state": "ok", "wait_s": 5.0},
                "gpu_changes": changes.gpu_changes({"gpu_xid": QUIET}, {"gpu_xid": XIDS}),
            }
        },
    }
    html = page.build_html(model.from_run(run))
    assert "GPU health changes in the window" in html and "new Xid 109: Context Switch Timeout Error" in html
    run["hosts"]["h"]["gpu_changes"] = []
    assert "no new Xid, ECC error, row remap or GPU fault" in page.build_html(model.from_run(run))
    del run["hosts"]["h"]["gpu_changes"]
    assert "GPU health" not in page.build_html(model.from_run(run))
