"""The drafter: its fact parser (the keys sglang's parse_dflash_draft_config reads),
the preflight check, and `k26ops check` on real lab hosts (the lab's drafter
directory is a fixture config; its block size is what the check compares)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops.facts.drafter import drafter_command, parse_drafter  # noqa: E402
from k26ops.host.preflight import drafter_check  # noqa: E402
from labtools.invoke import k26ops_json

MARK = "== k26ops-drafter "


def test_parser_reads_block_size_where_sglang_does():
    nested = (
        MARK
        + "config\n"
        + json.dumps({"architectures": ["DFlashDraftModel"], "block_size": 16, "dflash_config": {"block_size": 8}})
    )
    assert parse_drafter(nested, 0) == {
        "state": "config",
        "block_size": 8,
        "architectures": ["DFlashDraftModel"],
        "error": None,
    }
    top = MARK + "config\n" + json.dumps({"block_size": 16})
    assert parse_drafter(top, 0)["block_size"] == 16
    assert parse_drafter(MARK + "config\n{}", 0)["block_size"] is None
    assert parse_drafter(MARK + "config\n{not json", 0)["error"].startswith("config.json is not JSON")
    assert parse_drafter(MARK + "missing\n", 0)["error"] == "does not exist"
    assert parse_drafter(MARK + "noconfig\nweights.safetensors\n", 0)["error"] == "has no readable config.json"
    assert parse_drafter("sh: 1: cannot open\n", 2)["state"] is None
    assert "'/m/x y'" in drafter_command("/m/x y")  # quoted for the shell


def test_check_compares_block_size_and_names_the_source():
    want = {"path": "/models/d", "block_size": 8, "repo": "SubSir/Kimi-K2.6-DFlash-tmp-long", "revision": "a" * 40}
    ok = drafter_check({"state": "config", "block_size": 8, "error": None}, want)
    assert ok.ok and "SubSir/Kimi-K2.6-DFlash-tmp-long @ aaaaaaaaaaaa" in ok.detail
    bad = drafter_check({"state": "config", "block_size": 16, "error": None}, want)
    assert not bad.ok and "block_size 16" in bad.detail and "is 8" in bad.detail
    gone = drafter_check({"state": "missing", "block_size": None, "error": "does not exist"}, want)
    assert not gone.ok and gone.detail == "/models/d: does not exist"


def test_check_on_lab_hosts_verifies_the_drafter(lab, tmp_path):
    rc, data = k26ops_json("--limit", "lab1", "check", env=lab.env())
    assert rc == 0, data
    checks = {c["check"]: c for c in data["hosts"]["lab1"]["checks"]}
    assert checks["drafter"]["ok"] and "/models/Kimi-K2.6-DFlash: block size 8" in checks["drafter"]["detail"]
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"]["engine_profile"] = {"speculative_dflash_block_size": 16}
    inv["hosts"]["lab2"]["vars"]["draft_model_path"] = "/models/nope"
    p = tmp_path / "inv.yml"
    p.write_text(yaml.safe_dump(inv))
    rc, data = k26ops_json("-i", str(p), "--limit", "lab1,lab2", "check")
    assert rc == 1
    assert (
        "drafter: /models/Kimi-K2.6-DFlash: config.json block_size 8, the profile's "
        "speculative_dflash_block_size is 16" in data["hosts"]["lab1"]["error"]
    )
    assert "drafter: /models/nope: does not exist" in data["hosts"]["lab2"]["error"]
