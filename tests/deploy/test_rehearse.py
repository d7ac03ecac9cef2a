"""`k26ops rehearse` and `deploy --rehearse`.

- pure: the unit's argv rewritten for a rehearsal, configs fitted to fewer
  layers, the engine log's capture lines (recorded from the real engine on an
  H200, tests/data/rehearsal/);
- `connection: local` (no lab, no systemd needed): the whole command against the
  lab's engine stand-in started by the rehearse agent in its own process group;
- a real lab host (systemd: a transient unit): refusal while the engine serves,
  `--alongside`, and `deploy --rehearse --canary 1` with an engine that crashes on
  its first request: the serving engine is untouched and the crash is named.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k26ops.engine import launch
from k26ops.rehearsal import plan
from k26ops.steps.warmstart import MILESTONES
from labtools.invoke import cli, cli_json, k26ops, k26ops_json
from labtools.ports import free_port_block
from labtools.recipes import recipe_with_extra_patch

DATA = Path(__file__).resolve().parent.parent / "data" / "rehearsal"
PROFILE = {
    "model_path": "/models/Kimi-K2.6",
    "draft_model_path": "/models/Kimi-K2.6-DFlash",
    "speculative_algorithm": "DDTREE",
    "speculative_ddtree_budget": 32,
    "speculative_dflash_block_size": 8,
    "page_size": 1,
    "attention_backend": "triton",
    "cuda_graph_max_bs_decode": 16,
    "port": 30000,
    "release_dir": "/opt/k26ops/releases/current",
    "nnodes": 2,
    "node_rank": 0,
    "dist_init_addr": "10.0.0.1:5000",
    "extra_args": ["--api-key", "sk-SECRET-123", "--mem-fraction-static", "0.85", "--enable-metrics"],
}


# ---------------------------------------------------------------- pure


def test_argv_keeps_the_units_engine_flags_and_changes_only_what_a_rehearsal_must():
    unit = launch.engine_argv(PROFILE)
    argv, changes = plan.rehearsal_argv(unit, plan.Options(mem_fraction=0.07), port=31234, has_draft=True)
    kept = [
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-ddtree-budget",
        "32",
        "--speculative-dflash-block-size",
        "8",
        "--page-size",
        "1",
        "--attention-backend",
        "triton",
        "--cuda-graph-max-bs-decode",
        "16",
        "--tp-size",
        "8",
        "--enable-metrics",
    ]
    s = " ".join(argv)
    for a, b in zip(kept[::2], kept[1::2]):
        assert f"{a} {b}" in s or (b == "--enable-metrics" and b in argv)
    assert argv[:3] == unit[:3]  # the release's python, -m, the engine module
    assert f"--model-path {plan.TMP}/model --load-format dummy" in s
    assert f"--speculative-draft-model-path {plan.TMP}/draft --speculative-draft-load-format dummy" in s
    assert "--skip-tokenizer-init" in argv and "--port 31234" in s and "--host 127.0.0.1" in s
    assert "--mem-fraction-static 0.07" in s and "0.85" not in s
    for gone in (
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--api-key",
        "/models/Kimi-K2.6 ",
        "K26OPS_SECRET",
        "--config",
        "sk-SECRET",
    ):
        assert gone not in s + " "
    assert argv.count("--port") == 1 and argv.count("--model-path") == 1
    assert any("--dist-init-addr dropped" in c for c in changes) and any("--api-key dropped" in c for c in changes)
    assert plan.graphs_on(argv)


def test_argv_tp_override_inline_flags_and_graphs_off():
    unit = [
        "/r/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path=/m",
        "--tp-size=8",
        "--port=30000",
        "--cuda-graph-backend-decode",
        "disabled",
    ]
    argv, changes = plan.rehearsal_argv(unit, plan.Options(tp_size=1), port=1, has_draft=False)
    assert "--tp-size 1" in " ".join(argv) and "--tp-size=8" not in argv
    assert "--speculative-draft-model-path" not in argv and "--port=30000" not in argv
    assert "--tp-size 8 -> 1" in changes
    assert not plan.graphs_on(argv)
    with pytest.raises(Exception, match="python -m"):
        plan.rehearsal_argv(["/bin/engine", "--model-path", "/m"], plan.Options(), port=1, has_draft=False)


def test_fit_model_and_drafter_layers():
    k26 = json.loads(
        (Path(__file__).resolve().parent.parents[1] / "playbooks/recipes/models/kimi-k2.6/config.json").read_text()
    )
    cfg, notes = plan.fit_model(k26, 6)
    assert cfg["num_hidden_layers"] == 6 and k26["num_hidden_layers"] == 61  # a copy
    assert notes == ["target layers 61 -> 6 (config override; the GPUs need not hold the full model)"]
    _cfg, notes = plan.fit_model(k26, 1)
    assert any("every layer is dense" in n for n in notes)  # first_k_dense_replace 1: no MoE layer rehearsed
    mm = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}}
    assert plan.fit_model(mm, 4)[0]["text_config"]["num_hidden_layers"] == 4
    draft = {"dflash_config": {"block_size": 8, "target_layer_ids": [1, 12, 24, 36, 48, 59]}}
    d, notes = plan.fit_draft(draft, 7)
    assert d["dflash_config"]["target_layer_ids"] == [0, 1, 2, 3, 4, 5] and notes
    assert plan.fit_draft(draft, 61) == (draft, [])
    # the last layer's output cannot be captured (sglang captures "before layer id + 1"):
    # ids [0, 1] on a 2-layer target died on the real engine (h200-dsv3-dflash-layers2-crash.log)
    with pytest.raises(Exception, match="--layers 7 or more"):
        plan.fit_draft(draft, 6)
    tiny = {"num_target_layers": 4, "dflash_config": {"target_layer_ids": [1, 2], "num_target_layers": 4}}
    d, notes = plan.fit_draft(tiny, 3)
    assert d["dflash_config"]["target_layer_ids"] == [0, 1]
    assert d["num_target_layers"] == d["dflash_config"]["num_target_layers"] == 3
    with pytest.raises(Exception, match="--layers 3 or more"):
        plan.fit_draft(tiny, 2)


def test_capture_times_from_the_stand_in_and_the_real_engine_logs():
    old = (
        "[2026-05-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
        "[2026-05-01 10:00:01 TP0] Capture cuda graph end. Time elapsed: 1.16 s. mem usage=1.52 GB.\n"
    )
    assert plan.capture_times(old)["total_s"] == 1.16  # older sglang releases' form
    assert plan.capture_times("no graphs here")["total_s"] is None
    # recorded from the real sglang 0.5.17 on the H200 (tests/data/rehearsal/MANIFEST.json)
    qwen = plan.capture_times((DATA / "h200-qwen3-dflash.log").read_text())
    assert qwen["captures"] == [
        {"graph": "target prefill", "seconds": 82.66},
        {"graph": "target verify", "seconds": 2.97},
        {"graph": "draft verify", "seconds": 2.49},
    ]
    assert qwen["begun"] == qwen["ended"] == 3 and qwen["total_s"] == 88.12
    dsv3 = plan.capture_times((DATA / "h200-dsv3-dflash.log").read_text())  # MLA: no prefill graph
    assert [c["graph"] for c in dsv3["captures"]] == ["target verify", "draft verify"]
    metrics = json.loads((DATA / "h200-qwen3-dflash.json").read_text())["hosts"]["h200"]["rehearsal"]["metrics"]
    assert plan.capture_times("", metrics)["metrics_s"] == {
        "prefill": 82.662,
        "target_verify": 2.969,
        "draft_decode": 2.488,
    }


# ---------------------------------------------------------------- connection: local, stand-in


@pytest.fixture
def local_host(tmp_path):
    root = tmp_path / "root"
    rel = root / "releases" / "r1" / "venv" / "bin"
    rel.mkdir(parents=True)
    (rel / "python").symlink_to(sys.executable)
    (root / "releases" / "current").symlink_to("r1")
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    (models / "m" / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4, "vocab_size": 1024})
    )
    (models / "m" / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1024)  # never copied
    (models / "d").mkdir()
    (models / "d" / "config.json").write_text(
        json.dumps(
            {"architectures": ["DFlashDraftModel"], "dflash_config": {"block_size": 8, "target_layer_ids": [1, 30, 59]}}
        )
    )
    port = free_port_block(2, start=41000, stop=45000)

    def inventory(**env) -> Path:
        p = tmp_path / "local.yml"
        p.write_text(
            yaml.safe_dump(
                {
                    "hosts": {
                        "here": {
                            "connection": "local",
                            "vars": {
                                "lab": True,
                                "k26ops_root": str(root),
                                "recipe": "lab",
                                "model_path": str(models / "m"),
                                "draft_model_path": str(models / "d"),
                                "engine_port": port,
                                # the stand-in's weight load 0.1 s (its default 0.5 s was waited for by each test)
                                "engine_env": {"K26OPS_STANDIN_LOAD_SECONDS": "0.1", **env},
                            },
                        }
                    }
                }
            )
        )
        return p

    return {"inventory": inventory, "port": port + 1, "tmp": tmp_path}


def _left_rehearsal_processes() -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    # the engine's own command line names its temp dir's model copy; a private lab's nspawn line binds
    # /var/tmp/k26ops-rehearse-*/model (the lab dir of tag "rehearse") and is not the engine's
    # /opt/k26ops/...: a lab host's engine (another test run's rehearsal shows in this machine's ps too); the
    # local host's runs from its tmp root's release
    return [
        l
        for l in out.splitlines()
        if re.search(r"--model-path \S*/k26ops-rehearse-\w+/model\b", l) and not l.startswith("/opt/k26ops/")
    ]


def test_local_rehearsal_serves_and_leaves_nothing(local_host):
    inv = local_host["inventory"]()
    logs = local_host["tmp"] / "logs"
    logs.mkdir(mode=0o700)
    victim = local_host["tmp"] / "victim"
    victim.write_text("not yours\n")
    (logs / "here.log").symlink_to(victim)  # a planted link is replaced, never written through
    rc, data = cli_json(
        "-i",
        str(inv),
        "rehearse",
        "--rehearse-port",
        str(local_host["port"]),
        "--concurrency",
        "1,2",
        "--temperatures",
        "0,0.7",
        "--save-log",
        str(local_host["tmp"] / "logs"),
        timeout=300,
    )
    assert rc == 0, data
    rep = data["hosts"]["here"]["rehearsal"]
    assert rep["state"] == "served" and rep["runner"].startswith("process group")
    assert rep["cuda_graphs"] is True and rep["capture"]["total_s"] > 0
    assert rep["layers"] == 4 and rep["accept_length"] == 3.2  # the stand-in's knob, read from meta_info
    assert set(rep["smoke"]) == {"greedy", "sampled"}
    assert all(s["status"] == 200 and s["completion_tokens"] == 32 for s in rep["smoke"].values())
    assert [(c["concurrency"], c["temperature"]) for c in rep["bench"]["cells"]] == [(1, 0), (2, 0), (1, 0.7), (2, 0.7)]
    assert rep["tok_s"] > 0
    assert rep["cleanup"]["left"] == [] and _left_rehearsal_processes() == []
    assert not any(
        p.name.startswith("k26ops-rehearse-")
        for p in Path("/tmp").iterdir()
        if p.stat().st_mtime > inv.stat().st_mtime and p.exists() and p.is_dir() and (p / "engine.log").exists()
    )
    log = (local_host["tmp"] / "logs" / "here.log").read_text()
    assert "--load-format='dummy'" in log or "load_format='dummy'" in log
    assert "safetensors" not in log  # dummy weights: no shard was read
    saved = json.loads((local_host["tmp"] / "logs" / "here.json").read_text())
    assert saved["state"] == "served" and "_log" not in saved
    assert victim.read_text() == "not yours\n" and not (logs / "here.log").is_symlink()
    assert oct((logs / "here.log").stat().st_mode & 0o777) == "0o600"


def test_save_log_into_a_directory_another_user_prepared_is_refused(tmp_path):
    """`--save-log DIR` where another user (nobody) made DIR, with DIR/<host>.log planted as a symlink:
    one line naming the owner, before any host is touched, and nothing written through the link."""
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    dest = tmp_path / "shared"
    dest.mkdir(mode=0o777)
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    (dest / "here.log").symlink_to(victim)
    os.chown(dest, nobody, -1)
    link = tmp_path / "link"
    link.symlink_to(dest)
    for target, why in (
        (dest, "belongs to user nobody, not to you"),
        (link, "is a symlink"),
        (dest / "sub", "belongs to user nobody, who could redirect"),
    ):
        rc, data = cli_json("-i", "/nonexistent/inventory.yml", "rehearse", "--save-log", str(target))
        assert rc == 2 and why in data["error"] and "nothing was written" in data["error"], data
        assert "\n" not in data["error"]
    assert victim.read_text() == "root's\n" and not (dest / "sub").exists()


def test_local_rehearsal_names_a_first_request_crash(local_host):
    inv = local_host["inventory"](K26OPS_STANDIN_CRASH="first-request", K26OPS_STANDIN_CRASH_LOG="shape-mismatch")
    rc, data = cli_json("-i", str(inv), "rehearse", "--rehearse-port", str(local_host["port"]), timeout=300)
    assert rc == 1
    h = data["hosts"]["here"]
    assert h["status"] == "failed" and "crashed on the greedy request" in h["error"]
    assert h["diagnosis"]["signature"] == "cuda-graph-shape-mismatch"
    assert "(8)" in h["diagnosis"]["evidence"] and "(33)" in h["diagnosis"]["evidence"]
    assert h["rehearsal"]["cleanup"]["left"] == [] and _left_rehearsal_processes() == []


def test_local_rehearsal_on_a_taken_port_names_the_option_to_change(local_host):
    """Issue 45 item 5: the refusal named `--port`; the option is --rehearse-port."""
    import socket

    inv = local_host["inventory"]()
    with socket.socket() as held:
        held.bind(("127.0.0.1", local_host["port"]))
        held.listen()
        proc = cli("-i", str(inv), "rehearse", "--rehearse-port", str(local_host["port"]), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join((proc.stdout + proc.stderr).split())
    assert f"port {local_host['port']} on the host is taken" in out and "with --rehearse-port" in out, out
    assert "--port " not in out.replace("--rehearse-port", ""), out


def test_local_rehearsal_without_configs_is_one_line(local_host, tmp_path):
    inv = local_host["inventory"]()
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["here"]["vars"]["model_path"] = str(tmp_path / "nothing")
    doc["hosts"]["here"]["vars"]["recipe"] = "lab"
    inv.write_text(yaml.safe_dump(doc))
    # the lab recipe ships a K2-family config: used, and said so
    rc, data = cli_json(
        "-i",
        str(inv),
        "rehearse",
        "--rehearse-port",
        str(local_host["port"]),
        "--no-bench",
        "--layers",
        "7",
        timeout=300,
    )
    assert rc == 0, data
    notes = data["hosts"]["here"]["rehearsal"]["notes"]
    assert any("config.json from the recipe" in n for n in notes)
    assert data["hosts"]["here"]["rehearsal"]["layers"] == 7


# ---------------------------------------------------------------- a real lab host


@pytest.fixture(scope="module")
def labhost(tmp_path_factory):
    from labtools.labs import private_lab

    d = tmp_path_factory.mktemp("rehearse")
    with private_lab(1, "rehearse", deployed=True) as lab:
        yield {"lab": lab, "dir": d, "name": lab.hosts[0].name, "port": free_port_block(2, start=31000, stop=35000)}


def _inv(h, tag: str, env: dict | None = None) -> str:
    inv = yaml.safe_load(h["lab"].inventory.read_text())
    inv["vars"]["engine_env"] = env or {}
    inv["hosts"][h["name"]]["vars"]["engine_port"] = h["port"]
    path = h["dir"] / f"inv-{tag}.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def _remote(h, cmd: str) -> str:
    return h["lab"].ssh(h["name"], cmd).strip()


def test_lab_rehearse_refuses_beside_a_serving_engine_then_runs_alongside(labhost):
    h = labhost
    inv = _inv(h, "ok")
    rc, data = k26ops_json("-i", inv, "deploy", timeout=900)
    assert rc == 0, data
    pid = _remote(h, "systemctl show -p MainPID --value k26-engine.service")
    rport = str(h["port"] + 1)
    # the port is taken too (the lab shares this machine's loopback): the refusal a user acts on first is the
    # serving engine's (--alongside / --stop-serving), not the port (issue 45 item 5)
    with socket.socket() as held:
        held.bind(("127.0.0.1", int(rport)))
        held.listen()
        proc = k26ops("-i", inv, "rehearse", "--rehearse-port", rport, timeout=300)
    assert proc.returncode == 1 and "rehearsal refused: the serving engine" in proc.stdout + proc.stderr
    rc, data = k26ops_json("-i", inv, "rehearse", "--alongside", "--rehearse-port", rport, "--no-bench", timeout=600)
    assert rc == 0, data
    rep = data["hosts"][h["name"]]["rehearsal"]
    assert rep["state"] == "served" and rep["runner"].startswith("transient unit k26ops-rehearse-")
    # the lab model fixture's config.json (k26ops/lab/machines.py LAB_MODEL), copied without its weights
    assert any("model config: /models/Kimi-K2.6/config.json on the host" in n for n in rep["notes"]), rep["notes"]
    assert rep["cleanup"]["left"] == []
    assert _remote(h, "systemctl list-units --all --no-legend 'k26ops-rehearse-*' | wc -l") == "0"
    assert _remote(h, "ls /tmp | grep -c k26ops-rehearse- ; true") == "0"
    assert _remote(h, "systemctl show -p MainPID --value k26-engine.service") == pid  # never restarted


def test_lab_rehearse_stop_serving_starts_the_serving_engine_again(labhost):
    h = labhost
    inv = _inv(h, "ok")
    pid = _remote(h, "systemctl show -p MainPID --value k26-engine.service")
    rc, data = k26ops_json(
        "-i", inv, "rehearse", "--stop-serving", "--rehearse-port", str(h["port"] + 1), "--no-bench", timeout=600
    )
    assert rc == 0, data
    rep = data["hosts"][h["name"]]["rehearsal"]
    assert rep["state"] == "served" and rep["serving_engine"] == "active" and rep["serving_after"] == "healthy"
    assert _remote(h, "systemctl is-active k26-engine.service") == "active"
    assert _remote(h, "systemctl show -p MainPID --value k26-engine.service") != pid  # it was stopped, then started


def test_lab_deploy_rehearse_keeps_the_old_engine_serving_and_names_the_crash(labhost):
    h = labhost
    pid = _remote(h, "systemctl show -p MainPID --value k26-engine.service")
    env_before = _remote(h, "sha256sum /etc/k26ops/sglang.env")
    inv = _inv(
        h,
        "crash",
        {
            "K26OPS_STANDIN_CRASH": "first-request",
            "K26OPS_STANDIN_CRASH_LOG": "none-field",
            "K26OPS_STANDIN_CRASH_GRAPH_ONLY": "0",
        },
    )
    rc, data = k26ops_json(
        "-i", inv, "deploy", "--rehearse", "--canary", "1", "--rehearse-port", str(h["port"] + 1), timeout=900
    )
    assert rc == 1
    r = data["hosts"][h["name"]]
    assert r["status"] == "failed"
    assert "the serving engine was not touched" in r["error"] and "about 390 s of model load" in r["error"]
    assert r["diagnosis"]["signature"] == "cuda-graph-none-field"
    assert r["rehearsal"]["state"] == "crashed" and r["engine_restarted"] is False
    assert _remote(h, "systemctl show -p MainPID --value k26-engine.service") == pid
    assert _remote(h, "systemctl is-active k26-engine.service") == "active"
    assert _remote(h, "sha256sum /etc/k26ops/sglang.env") == env_before  # the crashing env never went in
    assert _remote(h, "systemctl list-units --all --no-legend 'k26ops-rehearse-*' | wc -l") == "0"


WARM_PLAYBOOK = "name: warm\nsteps:\n  - release: {keep: 2}\n  - service: {}\n  - health: {}\n  - smoke: {}\n"


def test_lab_deploy_rehearse_fills_the_new_release_cache_then_the_start_compiles_nothing(labhost):
    """Issue 43: the rehearsal runs in the NEW release's engine cache (before `current` moves) and
    compiles what the real start needs (graphs, then the sampling kernels of the smoke's sampled
    request); the restart then compiles nothing and the report has its time to first good token.
    Two releases get two cache dirs; keep 2 prunes the lab's first release and its cache."""
    h = labhost
    pb = h["dir"] / "warm.yml"
    pb.write_text(WARM_PLAYBOOK)
    dirs = {}
    for label in ("w1", "w2"):
        inv = Path(_inv(h, label))
        doc = yaml.safe_load(inv.read_text())
        doc["hosts"][h["name"]]["vars"]["recipe"] = str(recipe_with_extra_patch(h["dir"] / label, label))
        inv.write_text(yaml.safe_dump(doc))
        rc, data = k26ops_json(
            "-i",
            str(inv),
            "deploy",
            "--playbook",
            str(pb),
            "--rehearse",
            "--rehearse-port",
            str(h["port"] + 1),
            timeout=900,
        )
        assert rc == 0, data
        r = data["hosts"][h["name"]]
        rid, rep = r["release"], r["rehearsal"]
        cache = rep["engine_cache"]
        assert rep["release"].endswith("/releases/" + rid)  # its own dir, not `current`: before the switch
        assert cache["dir"].startswith(f"/opt/k26ops/engine-cache/{rid}/") and cache["variables"] == [
            "SGLANG_CACHE_DIR"
        ]
        assert (cache["before"] or {}).get("kernels", 0) == 0 and cache["filled"]["kernels"] >= 3, cache
        assert r["engine_cache"]["dir"] == cache["dir"]  # the unit reads the dir the rehearsal filled
        assert f'SGLANG_CACHE_DIR="{cache["dir"]}"' in _remote(h, "cat /etc/k26ops/sglang.env")
        assert r["warm_start"]["compiled_new"] == 0, r["warm_start"]
        assert r["warm_start"]["verdict"] == "warm start: no new kernel compiled"
        t = r["ttfgt"]
        assert [m["name"] for m in t["milestones"]] == list(MILESTONES)
        assert {m["name"]: m["source"] for m in t["milestones"]}["graphs captured"] == "log"
        assert t["stop_s"] is not None and t["total_s"] >= t["ready_s"] >= 0
        assert rep["ttfgt"]["first_sampled_s"] is not None  # the rehearsal's own, cold
        dirs[rid] = cache["dir"]
    assert len(set(dirs.values())) == 2  # two releases never share a cache dir
    assert _remote(h, "stat -c %a /opt/k26ops/engine-cache") == "700"
    # keep 2: the lab's own release went, and its engine cache with it
    assert set(_remote(h, "ls /opt/k26ops/engine-cache").split()) == set(dirs)


# ---------------------------------------------------------------- recorded: the real engine on an H200


def _recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())["hosts"]["h200"]


def test_recorded_real_rehearsal_served_dflash_with_cuda_graphs():
    h = _recorded("h200-qwen3-dflash.json")
    rep = h["rehearsal"]
    assert h["status"] == "ok" and rep["state"] == "served" and rep["cuda_graphs"] is True
    assert "--speculative-algorithm DFLASH" in rep["argv"] and "--load-format dummy" in rep["argv"]
    for name, temp in (("greedy", 0), ("sampled", 0.7)):
        s = rep["smoke"][name]
        assert s["status"] == 200 and s["sampling"]["temperature"] == temp and s["completion_tokens"] == 32
        # the engine's own figure: completion tokens / verify steps (32 / 31 on random weights)
        assert s["spec_accept_length"] == pytest.approx(s["completion_tokens"] / s["spec_verify_ct"])
        assert len(s["output_ids"]) == 16  # token ids out: --skip-tokenizer-init
    assert rep["smoke"]["sampled"]["latency_s"] > 60  # the cold first T>0 request JIT-builds sampling ops
    assert rep["cleanup"]["left"] == []
    cells = {(c["concurrency"], c["temperature"]): c for c in rep["bench"]["cells"]}
    assert set(cells) == {(1, 0), (4, 0), (1, 0.7), (4, 0.7)}
    assert all(c["accept_source"] == "meta_info.spec_accept_length" for c in cells.values())
    for key, value in rep["metrics"].items():
        if key.startswith("sglang:spec_accept_length"):
            assert value == 1.0  # dummy weights: the drafter's guesses are (almost) never accepted


def test_recorded_real_engine_health_codes_are_what_the_ready_wait_expects():
    """The real engine answers /health 503 while it captures graphs, then 200 (op_poll: 503 = loading)."""
    import re

    codes = [
        int(c)
        for c in re.findall(
            r'"GET /health\?from=k26ops HTTP/1.1" (\d{3})', (DATA / "h200-qwen3-dflash.log").read_text()
        )
    ]
    assert codes and set(codes) <= {200, 503}
    assert codes[0] == 503 and codes[-1] == 200 and codes.index(200) == codes.count(503)


def test_recorded_probe_watched_the_real_dflash_graph_copies():
    from k26ops.diagnose.probe import watched_counts

    rep = _recorded("h200-qwen3-dflash-probe.json")["rehearsal"]
    assert rep["probe"]["byte_exact"] is True and rep["probe"]["differ"] == []
    assert rep["probe"]["files"] == [
        "sglang/srt/model_executor/cuda_graph_buffer_registry.py",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
        "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py",
    ]
    w = watched_counts((DATA / "h200-qwen3-dflash-probe.log").read_text())
    assert w["fill_from"]["draft"] > 0 and w["fill_from"]["verify"] > 0 and w["copy_slots"] == 0


def test_recorded_real_logs_are_healthy_for_the_classifier():
    from k26ops.diagnose.classify import classify

    for name in ("h200-qwen3-dflash.log", "h200-qwen3-dflash-probe.log", "h200-dsv3-dflash.log"):
        d = classify((DATA / name).read_text())
        assert d.evidence in (None, ""), (name, d.signature, d.evidence)


def test_recorded_real_crash_of_an_uncapturable_drafter_layer_is_named():
    """The real engine, dsv3 target cut to 2 layers with drafter ids [0, 1] (before the fix above)."""
    from k26ops.diagnose.classify import classify

    h = _recorded("h200-dsv3-dflash-layers2-crash.json")
    assert h["status"] == "failed" and h["rehearsal"]["state"] == "crashed"
    assert h["rehearsal"]["cleanup"]["left"] == []  # the crashed engine left nothing behind either
    d = classify((DATA / "h200-dsv3-dflash-layers2-crash.log").read_text())
    assert d.signature == "drafter-target-layers" and "captured 1 of 2 aux hidden states" in d.evidence


def test_recorded_final_rehearsal_reports_capture_times():
    rep = _recorded("h200-qwen3-dflash-final.json")["rehearsal"]
    assert rep["state"] == "served"
    graphs = [c["graph"] for c in rep["capture"]["captures"]]
    assert graphs == ["target prefill", "target verify", "draft verify"] and rep["capture"]["total_s"] > 0
    assert set(rep["capture"]["metrics_s"]) >= {"target_verify", "draft_decode"}


def test_local_rehearsal_sigterm_stops_the_engine_group(local_host):
    """SIGTERM to k26ops while the rehearsal engine starts: the engine's process
    group is stopped and its temp dir removed before k26ops exits 130."""
    import signal
    import time

    inv = local_host["inventory"](K26OPS_STANDIN_DUMMY_SECONDS="120")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-i", str(inv), "rehearse", "--rehearse-port", str(local_host["port"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parents[1],
    )
    try:
        # until the engine shows or k26ops ends (its output then says why); the bound is only for a hang:
        # a loaded machine (the full suite on -n 2 beside other work) took over 60 s to get here
        deadline = time.monotonic() + 300
        while not _left_rehearsal_processes() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _left_rehearsal_processes():
            proc.kill()
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"the rehearsal engine never started (k26ops rc {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert _left_rehearsal_processes() == [], (out, err)
    assert "Traceback" not in err


def test_recorded_real_rehearsal_with_fewer_layers_serves():
    """The same cut as the crash above, with the fix: ids spread over 0..N-2 on the real engine."""
    rep = _recorded("h200-dsv3-dflash-layers3.json")["rehearsal"]
    assert rep["state"] == "served" and rep["layers"] == 3
    assert "drafter target_layer_ids [1, 2] -> [0, 1] (spread over the outputs of target layers 0..1)" in rep["notes"]
    assert [c["graph"] for c in rep["capture"]["captures"]] == ["target verify", "draft verify"]


def test_deploy_prints_one_rehearsal_line_per_host(capsys):
    """deploy --rehearse printed nothing about a passing rehearsal unless --json (issue 45 item 5);
    each figure has one format, the rehearse table's too."""
    from k26ops.cli.changes import render_changes
    from k26ops.cli.commands.rehearse import _columns
    from k26ops.rehearsal import summary
    from k26ops.transport.fleet import HostResult

    rep = _recorded("h200-qwen3-dflash-final.json")["rehearsal"]
    assert summary.line(rep) == "rehearsed: ready 150 s, capture 83 s, accept 1.03"
    assert _columns(rep) == {
        "_state": "served",
        "_ready": "150 s",
        "_capture": "83 s",
        "_accept": "1.03",
        "_toks": "297",
    }
    render_changes(
        [
            HostResult("h200", "changed", data={"rehearsal": rep, "steps": []}),
            HostResult("h2", "failed", data={"rehearsal": {"state": "crashed"}}),
        ],
        check=False,
        diff=False,
    )
    out = capsys.readouterr().out.splitlines()
    assert out == ["  h200: rehearsed: ready 150 s, capture 83 s, accept 1.03", "  h2: rehearsal crashed"], out
