"""`deploy` runs the preflight checks about what it will start (model directory,
drafter block size, disk, a GPU that needs a reset) before it touches the host,
in its one fact-gathering call; `check` verifies the model directory too.

Pure parts run the model fact's real command on real directories and the reset
check on recorded `nvidia-smi -q` outputs; the lab test deploys a real lab host,
then shows each refusal leaves its unit, env file, `current` and engine PID as they were."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops.facts.model import INDEX, model_command, parse_model  # noqa: E402
from k26ops.facts.smi_q import parse_health  # noqa: E402
from k26ops.host import preflight  # noqa: E402
from labtools.invoke import cli, cli_json, k26ops_json, lab_ssh

DATA = Path(__file__).parent.parent / "data" / "facts"


def _model(path) -> dict:
    p = subprocess.run(["sh", "-c", model_command(str(path))], capture_output=True, text=True)
    return parse_model(p.stdout, p.returncode)


def test_model_fact_on_real_directories(tmp_path):
    m = tmp_path / "it's a model"  # quoted for the shell
    assert _model(m) == {"state": "missing", "error": "does not exist"}
    m.mkdir()
    assert _model(m)["error"] == "has no readable config.json"
    (m / "config.json").write_text("{not json")
    assert _model(m)["error"].startswith("config.json is not JSON")
    (m / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"]}))
    assert _model(m)["error"] == "has no weights (no *.safetensors)"
    for i in (1, 2, 4, 5, 6):
        (m / f"model-{i:05d}-of-00064.safetensors").write_bytes(b"")
    assert _model(m)["error"] == (
        "is missing 59 of 64 weight shards (model-00003-of-00064.safetensors, "
        "model-00007-of-00064.safetensors, model-00008-of-00064.safetensors "
        "and 56 more)"
    )
    for f in m.glob("*.safetensors"):
        f.unlink()
    for i in (1, 2):
        (m / f"model-{i:05d}-of-00002.safetensors").write_bytes(b"")
    assert _model(m)["error"] == f"has 2 weight shards but no {INDEX}"
    (m / INDEX).write_text("{}")
    got = _model(m)
    assert got["error"] is None and got["shards"] == 2 and got["index"]
    check = preflight.model_check(got, str(m))
    assert check.ok and "KimiK25ForConditionalGeneration" in check.detail
    one = tmp_path / "one"
    one.mkdir()
    (one / "config.json").write_text("{}")
    (one / "model.safetensors").write_bytes(b"")  # an unsharded model needs no index
    assert _model(one)["error"] is None
    (tmp_path / "file").write_text("")
    assert _model(tmp_path / "file")["error"] == "is not a directory"


def test_disk_needs_only_the_margin_beside_a_present_model():
    hv = {"model_path": "/m", "model_size_gb": 590, "disk_margin_gb": 50}
    facts = {"disk_free": {"/m": {"available": 100 * 10**9, "error": None}}}
    absent = {
        c.name: c for c in preflight.evaluate({**facts, "model": {"state": "missing", "error": "does not exist"}}, hv)
    }
    assert not absent["disk_model"].ok and "needs 640 GB" in absent["disk_model"].detail
    assert not absent["model"].ok and absent["model"].detail == "/m: does not exist"
    present = {
        c.name: c for c in preflight.evaluate({**facts, "model": {"state": "dir", "shards": 2, "error": None}}, hv)
    }
    assert present["disk_model"].ok and "needs 50 GB" in present["disk_model"].detail


def test_a_gpu_that_needs_a_reset_is_refused_on_recorded_outputs():
    healthy = parse_health((DATA / "h200-nvidia-smi-q.txt").read_text())
    assert preflight.gpu_reset_check({"gpu_health": healthy}).ok
    pending = parse_health((DATA / "pub-gpud80-q-remapped-rows-pending.txt").read_text())
    c = preflight.gpu_reset_check({"gpu_health": pending})
    assert not c.ok and "needs reset-gpu: Remapped Rows: Pending : Yes" in c.detail, c.detail
    faults = parse_health((DATA / "constructed-h200-q-faults.txt").read_text())
    c = preflight.gpu_reset_check({"gpu_health": faults})
    assert not c.ok and "GPU Recovery Action : GPU Reset" in c.detail
    assert "HW Slowdown" not in c.detail  # a slowdown is check's, it does not stop a deploy
    c = preflight.gpu_reset_check({"gpus": {"gpu_errors": ["GPU 2 (00000000:3A:00.0): GPU requires reset"]}})
    assert not c.ok and c.detail == "GPU 2 (00000000:3A:00.0): GPU requires reset"


# ---------------------------------------------------------------- a real lab host


def _state(lab) -> dict:
    port = lab.hosts[0].port
    cmd = (
        "systemctl show -p MainPID --value k26-engine.service; readlink /opt/k26ops/releases/current; "
        "sha256sum /etc/systemd/system/k26-engine.service /etc/k26ops/sglang.env"
    )
    p = lab_ssh(lab.dir, port, cmd)
    assert p.returncode == 0, p.stderr
    return {"lines": p.stdout.split("\n"), "pid": p.stdout.split("\n")[0]}


def _inv(lab, tmp_path, name: str, **vars) -> str:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"].update(vars)
    p = tmp_path / f"{name}.yml"
    p.write_text(yaml.safe_dump(inv))
    return str(p)


def test_deploy_refuses_a_missing_model_a_drafter_mismatch_and_a_gpu_to_reset_before_any_change(scratch_lab, tmp_path):
    lab = scratch_lab
    rc, data = k26ops_json("deploy", env=lab.env(), timeout=900)
    assert rc == 0, data
    before = _state(lab)
    assert before["pid"] not in ("", "0")
    rc, data = k26ops_json("check", env=lab.env(), timeout=300)
    checks = {c["check"]: c for c in data["hosts"]["lab1"]["checks"]}
    assert rc == 0 and checks["model"]["ok"] and "/models/Kimi-K2.6: config.json (" in checks["model"]["detail"]

    rc, data = k26ops_json("-i", _inv(lab, tmp_path, "nomodel", model_path="/models/nope"), "deploy", timeout=300)
    assert rc == 1, data
    assert data["hosts"]["lab1"]["error"] == ("preflight: model: /models/nope: does not exist; nothing was changed"), (
        data
    )
    assert _state(lab) == before
    rc, data = k26ops_json("-i", _inv(lab, tmp_path, "nomodel2", model_path="/models/nope"), "check", timeout=300)
    assert rc == 1 and "model: /models/nope: does not exist" in data["hosts"]["lab1"]["error"]

    inv = _inv(lab, tmp_path, "block", engine_profile={"speculative_dflash_block_size": 16})
    rc, data = k26ops_json("-i", inv, "deploy", timeout=300)
    assert rc == 1, data
    assert data["hosts"]["lab1"]["error"] == (
        "preflight: drafter: /models/Kimi-K2.6-DFlash: config.json block_size 8, the profile's "
        "speculative_dflash_block_size is 16; nothing was changed"
    ), data
    assert _state(lab) == before

    b64 = base64.b64encode((DATA / "pub-gpud80-q-remapped-rows-pending.txt").read_bytes()).decode()
    p = lab_ssh(
        lab.dir,
        lab.hosts[0].port,
        f"mkdir -p /etc/k26ops-lab && echo {b64} | base64 -d > "
        "/etc/k26ops-lab/q.txt && echo K26OPS_LAB_SMI_Q=/etc/k26ops-lab/q.txt > /etc/k26ops-lab/nvidia-smi.env",
    )
    assert p.returncode == 0, p.stderr
    rc, data = k26ops_json("-i", _inv(lab, tmp_path, "reset", served_model_name="other"), "deploy", timeout=300)
    assert rc == 1, data
    err = data["hosts"]["lab1"]["error"]
    # the recorded excerpt has no "GPU <bus id>" header: the GPU is not named by index
    assert (
        err.startswith(
            "preflight: gpu_reset: GPU needs reset-gpu: Remapped Rows: Pending : Yes "
            "(Uncorrectable Error : 4); drain the host"
        )
        and err.endswith("; nothing was changed")
        and "\n" not in err
    ), err
    assert _state(lab) == before


def test_inventory_list_says_each_hosts_recipe_and_whether_its_lock_exists(tmp_path):

    from k26ops import resources

    mine = tmp_path / "mine.yml"  # a recipe not locked yet (as the default one ships)
    mine.write_text(resources.path("playbooks", "recipes", "lab-registry.yml").read_text())
    inv = tmp_path / "inv.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "vars": {"recipe": str(mine)},
                "hosts": {
                    "a": {"address": "10.0.0.1"},
                    "b": {"address": "10.0.0.2"},
                    "c": {"address": "10.0.0.3", "vars": {"recipe": "lab"}},
                },
            }
        )
    )
    rc, doc = cli_json("-i", str(inv), "inventory", "list")
    assert rc == 0, doc
    by = {tuple(r["hosts"]): r for r in doc["recipes"]}
    unlocked, lab = by[("a", "b")], by[("c",)]
    assert unlocked["source"] == str(mine) and not unlocked["ok"]
    assert unlocked["problem"].startswith(f"{mine}: no dependency lock for sglang==")
    assert f"`k26ops engine lock {mine}`" in unlocked["problem"]
    assert lab["ok"] and lab["lock"].endswith("playbooks/recipes/lab.lock") and lab["problem"] is None
    out = " ".join(cli("-i", str(inv), "inventory", "list", env={"COLUMNS": "200"}).stdout.split())
    assert "recipe lab-registry (a, b): " in out and "no dependency lock" in out
    assert "recipe lab (c): lock " in out
    assert preflight.recipe_check(unlocked).ok is False and preflight.recipe_check(lab).ok
