"""k26ops' Xid table (k26ops/facts/xid_table.py) against NVIDIA's Xid catalogue as recorded in
tests/data/facts/nvidia-xid-catalog.txt (source and date in its header and in MANIFEST.json):
every catalogue row is in the table with NVIDIA's mnemonic, description and immediate bucket, and
the table's action is the one its bucket maps to, except the few overrides, each with a reason."""

from __future__ import annotations

import json
from pathlib import Path

from k26ops.facts import xid as X
from k26ops.facts import xid_table as T

DATA = Path(__file__).parent.parent / "data/facts"
CATALOGUE = DATA / "nvidia-xid-catalog.txt"


def recorded() -> dict[int, tuple[str, str, str]]:
    rows = {}
    for line in CATALOGUE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        xid, mnemonic, description, bucket = line.split("|")
        rows[int(xid)] = (mnemonic, description, bucket)
    return rows


def test_the_recording_names_its_source_and_date():
    head = CATALOGUE.read_text().splitlines()[:4]
    assert any("https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in h for h in head)
    assert any("2026-12-07" in h for h in head)
    meta = json.loads((DATA / "MANIFEST.json").read_text())["nvidia-xid-catalog.txt"]
    assert meta["source"].count("https://") == 1


def test_table_holds_every_catalogue_row_as_recorded():
    rows = recorded()
    assert sorted(rows) == list(range(1, 173))  # the catalogue's Xid 1 to 172, none skipped
    assert T.CATALOG == rows
    assert set(X.XID_TABLE) == set(rows)


def test_each_action_follows_its_bucket_or_a_stated_override():
    kinds = {"hardware", "application", "echo", "info", "unused"}
    for xid, (_mnemonic, description, bucket) in recorded().items():
        meaning, kind, action = X.XID_TABLE[xid]
        assert meaning.startswith(description), xid
        assert kind in kinds and action in X.ACTIONS, xid
        if xid in T.OVERRIDES:
            assert T.OVERRIDES[xid][2], xid  # every override says why
            assert (kind, action) == T.OVERRIDES[xid][:2], xid
        else:
            assert action == T.BUCKETS[bucket][1], (xid, bucket, action)
            assert kind == ("unused" if description == "Unused" else T.BUCKETS[bucket][0]), xid


def test_the_xids_issue_46_found_without_meaning_have_one():
    for xid in (45, 48, 61, 62, 63, 64, 74, 92, 94, 95, 120, 154):
        meaning, kind, action = X.XID_TABLE[xid]
        assert meaning and "not in k26ops' table" not in meaning, xid
    assert X.XID_TABLE[48][1:] == ("hardware", "reset-gpu")  # WORKFLOW_XID_48: reset or reboot
    assert X.XID_TABLE[95][1:] == ("hardware", "reset-gpu")  # RESET_GPU
    assert X.XID_TABLE[94][1:] == ("hardware", "restart-app")  # contained: restart the program
    assert X.XID_TABLE[63][1:] == ("info", "none")  # IGNORE: a remap recorded
    assert X.XID_TABLE[64][1:] == ("hardware", "reset-gpu")  # RESET_GPU
    assert X.XID_TABLE[61][1] == "unused"  # NVIDIA: Unused
    assert X.XID_TABLE[79][1:] == ("hardware", "reboot")  # RESTART_BM


SXID_CATALOGUE = DATA / "nvidia-sxid-catalog.txt"


def recorded_sxids() -> dict[int, tuple[str, str]]:
    rows = {}
    for line in SXID_CATALOGUE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sxid, name, section = line.split("|")
        rows[int(sxid)] = (name, section)
    return rows


def test_the_sxid_recording_names_its_source():
    head = "\n".join(SXID_CATALOGUE.read_text().splitlines()[:5])
    assert "DU-09883-001_v1.3" in head and "fabric-manager-user-guide" in head and "2026-12-07" in head
    meta = json.loads((DATA / "MANIFEST.json").read_text())["nvidia-sxid-catalog.txt"]
    assert meta["source"].count("https://") == 1


def test_sxid_table_holds_every_recorded_row_with_its_sections_severity():
    rows = recorded_sxids()
    assert T.SXID_CATALOG == rows
    assert {section for _name, section in rows.values()} == {"D.4", "D.5", "D.6", "D.7"}
    for sxid, (name, section) in rows.items():
        tname, severity, kind, action = X.SXID_TABLE[sxid]
        assert tname == name
        fatal = section in ("D.5", "D.6") or sxid in T.SXID_FATAL_NOTABLE
        assert (severity, kind, action) == (
            ("fatal", "hardware", "reboot") if fatal else ("non-fatal", "info", "none")
        ), sxid
    # the SXids the recorded kernel lines show, as NVIDIA's tables give them
    assert X.SXID_TABLE[22013][:2] == ("Minion Link DLREQ interrupt", "non-fatal")
    assert X.SXID_TABLE[12028][:2] == ("egress nonposted PRIV error", "non-fatal")
    assert X.SXID_TABLE[20034][:2] == ("LTSSM Fault Up", "fatal")
    assert X.SXID_TABLE[24007][1] == X.SXID_TABLE[12020][1] == "fatal"
