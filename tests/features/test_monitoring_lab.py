"""`monitoring: true` on real lab hosts: the deploy starts the engine with --enable-metrics
and `k26ops monitoring --verify` asks each engine (over SSH, from the host) for its /metrics
and finds every engine name of the dashboard; without it the engine serves no /metrics and
--verify says what to do. The engine is the lab's stand-in, whose names are the real
engine's recorded ones (test_monitoring.py)."""

from __future__ import annotations

import json

import yaml

from labtools.invoke import k26ops_json, lab_ssh

HOST = "lab1"
UNIT = "/etc/systemd/system/k26-engine.service"
ENV_FILE = "/etc/k26ops/sglang.env"


def test_monitoring_true_runs_metrics_and_verify_finds_the_dashboards_names(lab, tmp_path):
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"]["monitoring"] = True
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    env = {**lab.env(), "K26OPS_INVENTORY": str(path)}
    try:
        rc, data = k26ops_json("--limit", HOST, "deploy", env=env)
        assert rc == 0, data
        unit = lab_ssh(lab.dir, lab.port(HOST), f"cat {UNIT}").stdout
        assert "--enable-metrics" in unit
        out = tmp_path / "mon"
        rc, data = k26ops_json("--limit", HOST, "monitoring", "--out", str(out), "--verify", env=env)
        assert rc == 0, data
        assert data["hosts"][HOST]["verdict"].startswith("serves all 9 engine metrics"), data
        targets = json.loads((out / "targets/k26-engine.json").read_text())
        assert [t["labels"]["host"] for t in targets] == [HOST]
        # the same host without `monitoring`: no /metrics, and --verify says what to do
        del inv["vars"]["monitoring"]
        path.write_text(yaml.safe_dump(inv))
        rc, data = k26ops_json("--limit", HOST, "deploy", env=env)
        assert rc == 0, data
        assert "--enable-metrics" not in lab_ssh(lab.dir, lab.port(HOST), f"cat {UNIT}").stdout
        rc, data = k26ops_json("--limit", HOST, "monitoring", "--out", str(out), "--verify", env=env)
        assert rc == 1 and "monitoring: true` and deploy" in data["hosts"][HOST]["error"], data
    finally:
        lab_ssh(
            lab.dir,
            lab.port(HOST),
            f"systemctl disable --now k26-engine.service; rm -f {UNIT} {ENV_FILE} "
            "/opt/k26ops/state/pinned-releases; systemctl daemon-reload",
        )
