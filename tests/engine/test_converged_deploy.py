"""A converged `k26ops deploy` at its physical limit (issue 31 item 2), on the shared lab:
two remote commands (the host lock's channel, and one agent kept on a channel for the run's
reads: ownership, facts, release state, the engine's files + health + smoke) and one
k26ops agent start on the host, with the same checks as ever (health and smoke answered).
A host that differs still gets its full plan.

python3 starts are counted on the host itself: a wrapper first on PATH
(/usr/local/bin/python3, as bench/host_cpu.py does) logs each start's first
argument; agents start as `python3 -S -c SOURCE`. The wrapper, the engine unit and
env file are removed at the end (the lab's hosts are left as found; the release stays,
as in test_baselines).
"""

from __future__ import annotations

import shlex

import yaml

from labtools.invoke import k26ops_json, lab_ssh

HOST = "lab1"
LOG = "/var/tmp/k26ops-test-python3.log"
WRAPPER = f'#!/bin/sh\nprintf \'%s\\n\' "${{1:-}}" >> {LOG}\nexec /usr/bin/python3 "$@"\n'
UNIT = "/etc/systemd/system/k26-engine.service"
ENV_FILE = "/etc/k26ops/sglang.env"


def deploy(lab, inv) -> dict:
    rc, data = k26ops_json("-i", str(inv), "--limit", HOST, "deploy", env=lab.env())
    assert rc == 0, data
    return data["hosts"][HOST]


def agent_starts(lab, run, every: bool = False) -> tuple[dict, list[str]]:
    """`run()`'s result and the python3 starts on the host meanwhile that were agents (-S -c);
    `every`: all python3 starts (their first arguments)."""
    lab.ssh(HOST, f": > {LOG}")
    out = run()
    return out, [line for line in lab.ssh(HOST, f"cat {LOG}").splitlines() if every or line == "-S"]


def test_converged_deploy_is_two_commands_and_one_agent_start(lab, tmp_path):
    inv = yaml.safe_load(lab.inventory.read_text())
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))
    inv["vars"]["engine_env"] = {"K26OPS_TEST_CONVERGED": "2"}  # the env file differs: a full plan
    (tmp_path / "differs.yml").write_text(yaml.safe_dump(inv))
    try:
        first = deploy(lab, tmp_path / "inv.yml")
        assert first["status"] in ("ok", "changed"), first
        lab.ssh(HOST, f"printf %s {shlex.quote(WRAPPER)} > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3")
        r, starts = agent_starts(lab, lambda: deploy(lab, tmp_path / "inv.yml"), every=True)
        assert r["status"] == "ok" and not any(s["changed"] for s in r["steps"]), r
        assert r["commands"] <= 2, r["commands"]
        agents = [s for s in starts if s == "-S"]
        assert len(agents) == 1, starts
        # the rest are the lab's nvidia-smi stand-in (a Python script): the query and -q, not its
        # table, and no `python3 --version` (the agent answers the python3 fact itself)
        assert sorted(s.rsplit("/", 1)[-1] for s in starts if s != "-S") == ["nvidia-smi", "nvidia-smi"], starts
        # the same checks as before: health waited for, both smoke requests answered
        assert r["health"]["state"] == "healthy" and r["smoke"]["ok"] and r["smoke"]["sampled"]["ok"]
        # a host that differs: its full plan (env file, restart), health and smoke after the restart
        r, agents = agent_starts(lab, lambda: deploy(lab, tmp_path / "differs.yml"))
        assert r["status"] == "changed", r
        service = next(s for s in r["steps"] if s["step"] == "service")
        assert service["changed"] and any("restart" in c for c in service["changes"]), service
        assert r["health"]["state"] == "healthy" and r["smoke"]["ok"] and r["engine_restarted"] is True
        assert r["commands"] > 2 and len(agents) > 1, (r["commands"], agents)
        # and converged again at the limit
        r, agents = agent_starts(lab, lambda: deploy(lab, tmp_path / "differs.yml"))
        assert r["status"] == "ok" and r["commands"] <= 2 and len(agents) == 1, (r, agents)
    finally:
        lab_ssh(
            lab.dir,
            lab.port(HOST),
            f"rm -f /usr/local/bin/python3 {LOG}; "
            f"systemctl disable --now k26-engine.service; rm -f {UNIT} {ENV_FILE} "
            "/etc/k26ops/sglang-secrets.yaml; systemctl daemon-reload",
        )
