"""Service, health and smoke steps against the real lab: real nspawn hosts,
real systemd and journald, real sshd, the engine stand-in as the engine.

The tests use a releases root of their own on each host (`releases_root`
inventory var: /opt/k26ops-test-service/releases) holding two fake releases
(`test-fake-a`, `test-fake-b`: a venv/bin/python symlink to the host's
python3; the stand-in is stdlib-only), and a test-only step
`test_fake_release` that switches `current` the way the release step does
(its ReleaseDecision: release id, previous release, `current` moved). Everything is removed at
teardown: the lab's hosts are left as found.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from k26ops.cli.context import Settings
from k26ops.cli.rollout import run_rollout
from k26ops.orchestrate.rollout import playbook_work
from k26ops.steps import Change, Step
from k26ops.steps.registry import STEPS
from k26ops.steps.release import ReleaseDecision
from k26ops.transport.ssh import q
from labtools import REPO
from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.ports import free_port_block

UNIT = "k26-engine.service"
ENV_FILE = "/etc/k26ops/sglang.env"
SECRETS_FILE = "/etc/k26ops/sglang-secrets.yaml"
RELEASES = "/opt/k26ops-test-service/releases"
TOKEN = "hf_TESTSECRET_9f8e7d6c5b4a"


class FakeRelease(Step):
    """TEST ONLY: point `current` at the host var `test_release` like the release step would."""

    name = "test_fake_release"

    def plan(self, ctx):
        want = ctx.vars.get("test_release", "test-fake-a")
        cur = ctx.run(f"readlink {q(ctx.releases_root)}/current || true").stdout.strip() or None
        d = ReleaseDecision.of(ctx)
        d.previous, d.release_id = cur, want
        return [] if cur == want else [Change(f"switch current: {cur} -> {want}")]

    def apply(self, ctx, changes):
        want = ctx.vars.get("test_release", "test-fake-a")
        ctx.run(
            f"cd {q(ctx.releases_root)} && ln -sfn {q(want)} .current.tmp && mv -T .current.tmp current", check=True
        )
        ReleaseDecision.of(ctx).changed = True


def main_pid(lab, host: str) -> int:
    return int(lab.ssh(host, f"systemctl show -p MainPID --value {UNIT}").strip())


@pytest.fixture(scope="module")
def engine(lab, tmp_path_factory):
    """The shared lab prepared for engine tests; cleaned up afterwards."""
    names = [h.name for h in lab.hosts]
    base = free_port_block(len(names), start=31000, stop=35000)
    ports = {n: base + i for i, n in enumerate(names)}
    for n in names:
        lab.ssh(
            n,
            f"set -e; for r in test-fake-a test-fake-b; do mkdir -p {RELEASES}/$r/venv/bin; "
            f"ln -sfn /usr/bin/python3 {RELEASES}/$r/venv/bin/python; done; "
            f"ln -sfn test-fake-a {RELEASES}/current",
        )
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"]["releases_root"] = RELEASES
    inv["vars"]["hf_token"] = TOKEN
    for n in names:
        inv["hosts"][n]["vars"]["engine_port"] = ports[n]
    state = {"dir": tmp_path_factory.mktemp("engine"), "inv": inv, "names": names, "ports": ports}
    yield state
    for n in names:
        lab_ssh(
            lab.dir,
            lab.port(n),
            f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT} {ENV_FILE} {SECRETS_FILE}; "
            f"rmdir /etc/k26ops 2>/dev/null; rm -rf /opt/k26ops/lab /opt/k26ops/state/service /opt/k26ops-test-service; "
            f"systemctl daemon-reload; systemctl reset-failed {UNIT} 2>/dev/null; true",
        )


def inventory(engine, name: str, **host_vars) -> Path:
    """The test inventory with extra vars per host: host_vars = {host: {var: value}}."""
    inv = json.loads(json.dumps(engine["inv"]))
    for host, extra in host_vars.items():
        inv["hosts"][host]["vars"].update(extra)
    path = engine["dir"] / f"{name}.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def deploy(inv: Path, *, canary=0, check=False, release=True, capsys=None):
    names = (["test_fake_release"] if release else []) + ["service", "health", "smoke"]
    steps = [{**STEPS, FakeRelease.name: FakeRelease}[n]({}) for n in names]
    settings = Settings(inventory=str(inv), as_json=False)
    results = run_rollout(settings, playbook_work(steps, check=check), canary=canary, exit=False)
    text = ""
    if capsys is not None:
        cap = capsys.readouterr()
        text = cap.out + cap.err
    return {r.host: r for r in results}, text


def test_deploy_healthy_smoke_then_converged(lab, engine, capsys):
    inv = inventory(engine, "base")
    t0 = time.monotonic()
    res, out = deploy(inv, capsys=capsys)
    for n, r in res.items():
        assert r.status == "changed", (n, r.error)
        assert r.data["health"]["state"] == "healthy"
        assert r.data["smoke"]["ok"] and r.data["smoke"]["text"].strip()
        assert r.data["smoke"]["spec_accept_length"] == pytest.approx(3.2)
        assert r.data["smoke"]["latency_s"] > 0
        # greedy and sampled: DDTree's sampled verify is a path of its own
        assert r.data["smoke"]["greedy"]["sampling"] == {"temperature": 0}
        sampled = r.data["smoke"]["sampled"]
        assert sampled["sampling"]["temperature"] == 0.7 and sampled["sampling"]["top_p"] == 0.9
        assert sampled["ok"] and sampled["latency_s"] > 0 and sampled["spec_accept_length"] == pytest.approx(3.2)
        assert r.data["engine_restarted"] is True
    assert time.monotonic() - t0 < 60
    assert TOKEN not in out and TOKEN not in json.dumps([r.to_json() for r in res.values()])
    pids = {n: main_pid(lab, n) for n in engine["names"]}
    lab1 = engine["names"][0]
    # env file: 0600, holds the token; the unit never does
    assert lab.ssh(lab1, f"stat -c %a {ENV_FILE}").strip() == "600"
    assert TOKEN in lab.ssh(lab1, f"cat {ENV_FILE}")
    unit_text = lab.ssh(lab1, f"cat /etc/systemd/system/{UNIT}")
    assert TOKEN not in unit_text and "-m k26ops_lab_engine" in unit_text
    assert f"--port {engine['ports'][lab1]}" in unit_text
    # the installed, rendered unit passes systemd-analyze verify on the host
    v = lab_ssh(lab.dir, lab.port(lab1), f"systemd-analyze verify /etc/systemd/system/{UNIT}")
    assert v.returncode == 0, v.stderr

    # second run: nothing changes, nothing restarts, few round trips
    res2, out2 = deploy(inv, capsys=capsys)
    for n, r in res2.items():
        assert r.status == "ok", (n, r.error, r.data.get("steps"))
        assert all(not s["changed"] for s in r.data["steps"])
        assert r.data["smoke"]["ok"] and r.data["health"]["state"] == "healthy"
        # the lock, the fake release's read, and one agent for ownership, facts and read + health + smoke
        assert r.commands <= 3, r.commands
    assert {n: main_pid(lab, n) for n in engine["names"]} == pids

    # status and logs through the CLI
    env = {**lab.env(), "K26OPS_INVENTORY": str(inv), "HF_TOKEN": ""}
    rc, st = k26ops_json("status", env=env)
    assert rc == 0, st
    for n in engine["names"]:
        h = st["hosts"][n]
        assert (h["state"], h["health"], h["release"]) == ("active", "healthy", "test-fake-a")
        assert h["model"] == "/models/Kimi-K2.6" and h["pid"] == pids[n] and h["uptime_s"] >= 0
    logs = k26ops("--limit", lab1, "logs", "-n", "30", env=env)
    assert logs.returncode == 0, logs.stderr
    assert "Load weight" in logs.stdout or "/generate" in logs.stdout
    assert TOKEN not in logs.stdout + logs.stderr
    # k26ops' own health/smoke requests are hidden unless --all; the journal's hostname column is dropped
    every = k26ops("--limit", lab1, "logs", "--all", "--since", "1 hour ago", env=env)
    assert every.returncode == 0 and "from=k26ops" in every.stdout and "/generate?from=k26ops" in every.stdout
    mine = k26ops("--limit", lab1, "logs", "--since", "1 hour ago", env=env)
    assert mine.returncode == 0 and "from=k26ops" not in mine.stdout and "Load weight" in mine.stdout
    assert all(
        len(line.split()) < 2 or not line.split()[1].startswith(("lab", "k26")) for line in mine.stdout.splitlines()
    )
    grep = k26ops("--limit", lab1, "logs", "--since", "1 hour ago", "--grep", "Load weight (begin|end)", env=env)
    assert grep.returncode == 0 and len(grep.stdout.splitlines()) >= 2
    assert all("Load weight" in line for line in grep.stdout.splitlines())
    bad = k26ops("--limit", lab1, "logs", "--since", "not a time", env=env)
    assert bad.returncode == 2 and "not a time journalctl understands" in bad.stderr  # a usage error, once


def test_piped_deploy_prints_one_line_per_host_event(lab, engine):
    """Through the CLI with stderr a pipe (as in CI or `| tee`): start, each step, done."""
    inv = inventory(engine, "base")  # converged by the test above
    book = engine["dir"] / "service-only.yml"
    book.write_text("name: service-only\nsteps:\n  - service: {}\n  - health: {}\n  - smoke: {}\n")
    lab1 = engine["names"][0]
    env = {**lab.env(), "K26OPS_INVENTORY": str(inv), "HF_TOKEN": ""}
    proc = k26ops("--limit", lab1, "deploy", "--playbook", str(book), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [line for line in proc.stderr.splitlines() if line.startswith(f"{lab1}: ")]
    assert events[:4] == [f"{lab1}: start", f"{lab1}: 1/3 service", f"{lab1}: 2/3 health", f"{lab1}: 3/3 smoke"], (
        proc.stderr
    )
    assert re.fullmatch(rf"{lab1}: done ok \d+\.\ds", events[4]) and len(events) == 5, proc.stderr


def test_logs_json_is_one_document_and_follow_is_ndjson_of_new_lines_only(lab, engine):
    """docs/reference/json.md: `logs --json` one document; `logs -f --json` a record only when a host has lines."""
    import jsonschema
    from jsonshape import schema

    lab1 = engine["names"][0]
    env = {**lab.env(), "K26OPS_INVENTORY": str(inventory(engine, "base")), "HF_TOKEN": ""}
    rc, doc = k26ops_json("--limit", lab1, "logs", "-n", "3", "--all", env=env)  # validated by labtools
    assert rc == 0 and list(doc["hosts"]) == [lab1] and len(doc["hosts"][lab1]["lines"]) == 3, doc
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "k26ops",
            "--limit",
            lab1,
            "logs",
            "-f",
            "--json",
            "-n",
            "5",
            "--all",
            "--interval",
            "0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
    )
    time.sleep(5)  # ~15 polls; the engine is idle: no new lines, so no more records
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    records = [json.loads(line) for line in out.splitlines()]
    assert records and records[0]["host"] == lab1 and len(records[0]["lines"]) == 5, (out, err)
    for r in records:
        jsonschema.validate(r, schema("logs-follow"))
    assert len(records) < 5, records


def test_check_diff_redacts_secrets(lab, engine):
    lab1 = engine["names"][0]
    deploy(inventory(engine, "base"))
    inv = inventory(engine, "newtoken", **{lab1: {"hf_token": "hf_OTHERSECRET_123456"}})
    res, _ = deploy(inv, check=True)
    steps = {s["step"]: s for s in res[lab1].data["steps"]}
    diff = "\n".join(steps["service"]["diffs"])
    assert "HF_TOKEN" in diff and "<redacted>" in diff
    assert TOKEN not in diff and "hf_OTHERSECRET_123456" not in diff
    assert any(c.startswith("restart") for c in steps["service"]["changes"])
    assert lab.ssh(lab1, f"grep -c {TOKEN} {ENV_FILE}").strip() == "1"  # --check changed nothing


def test_one_flag_change_restarts_only_that_engine(lab, engine):
    names = engine["names"]
    res, _ = deploy(inventory(engine, "base"))
    assert all(r.status == "ok" for r in res.values())
    before = {n: main_pid(lab, n) for n in names}
    inv = inventory(engine, "flag", **{names[1]: {"extra_flags": {"mem-fraction-static": 0.81}}})
    res, _ = deploy(inv)
    assert res[names[1]].status == "changed" and res[names[1]].data["engine_restarted"] is True
    assert [res[n].status for n in names if n != names[1]] == ["ok"] * (len(names) - 1)
    after = {n: main_pid(lab, n) for n in names}
    assert after[names[1]] != before[names[1]]
    assert all(after[n] == before[n] for n in names if n != names[1])
    assert "--mem-fraction-static 0.81" in lab.ssh(names[1], f"cat /etc/systemd/system/{UNIT}")
    deploy(inventory(engine, "base"))  # back to the common state


def _journal_times(lab, host: str, since: float) -> dict:
    out = lab.ssh(host, f"journalctl -u {UNIT} -o json --since @{int(since) - 1} --no-pager")
    times = {}
    for line in out.splitlines():
        e = json.loads(line)
        msg = e.get("MESSAGE") or ""
        t = int(e["__REALTIME_TIMESTAMP"]) / 1e6
        if isinstance(msg, str) and "Main process exited" in msg:
            times.setdefault("exited", t)
        if isinstance(msg, str) and msg.startswith("Stopped") and "exited" in times:
            times.setdefault("stopped_after", t)
    return times


def test_crash_during_load_fails_fast_and_rolls_back(lab, engine, capsys):
    names = engine["names"]
    bad = names[-1]
    res, _ = deploy(inventory(engine, "base"))
    assert all(r.status == "ok" for r in res.values())
    unit_before = lab.ssh(bad, f"cat /etc/systemd/system/{UNIT}")
    env_before = lab.ssh(bad, f"cat {ENV_FILE}")
    pids = {n: main_pid(lab, n) for n in names}
    crash = {
        "engine_env": {
            "K26OPS_STANDIN_CRASH": "load",
            "K26OPS_STANDIN_CRASH_LOG": "shape-mismatch",
            "K26OPS_STANDIN_LOAD_SECONDS": 2,
        },
        "test_release": "test-fake-b",
    }
    since = time.time()
    res, out = deploy(inventory(engine, "crash", **{bad: crash}), capsys=capsys)
    r = res[bad]
    assert r.status == "failed"
    assert "cuda-graph-shape-mismatch" in r.error and "must match the size of tensor" in r.error
    assert "previous engine is healthy again" in r.error and "release" in r.error
    assert "CUDA graph" in r.data["journal_tail"] or "Traceback" in r.data["journal_tail"]
    assert r.data["diagnosis"]["signature"] == "cuda-graph-shape-mismatch"
    assert "journal tail" in out and "cuda-graph-shape-mismatch" in out and TOKEN not in out
    for n in names[:-1]:
        assert res[n].status == "ok", (n, res[n].error)
    # stopped waiting at once: the rollback's stop follows the crash within ~2 s
    t = _journal_times(lab, bad, since)
    assert "exited" in t and "stopped_after" in t, t
    assert t["stopped_after"] - t["exited"] < 3.0, t
    assert r.elapsed < 20  # load 2 s + crash + rollback, nowhere near the 1800 s timeout
    # the previous unit, env file and release are back and running
    assert lab.ssh(bad, f"cat /etc/systemd/system/{UNIT}") == unit_before
    assert lab.ssh(bad, f"cat {ENV_FILE}") == env_before
    assert lab.ssh(bad, f"readlink {RELEASES}/current").strip() == "test-fake-a"
    assert lab.ssh(bad, f"systemctl is-active {UNIT}").strip() == "active"
    assert all(main_pid(lab, n) == pids[n] for n in names[:-1])
    env = {**lab.env(), "K26OPS_INVENTORY": str(inventory(engine, "base"))}
    rc, st = k26ops_json("--limit", bad, "status", env=env)
    assert rc == 0 and st["hosts"][bad]["health"] == "healthy"


@pytest.mark.parametrize("mode,which,temperature", [("first-request", "greedy", 0), ("request:2", "sampled", 0.7)])
def test_a_crash_on_a_smoke_request_is_named(lab, engine, capsys, mode, which, temperature):
    """The seeds' case: the engine starts fine and dies on its first speculative
    verify (or on a later request). The deploy names the crash itself."""
    names = engine["names"]
    bad = names[0]
    res, _ = deploy(inventory(engine, "base"))
    env_before = lab.ssh(bad, f"cat {ENV_FILE}")
    crash = {"engine_env": {"K26OPS_STANDIN_CRASH": mode, "K26OPS_STANDIN_CRASH_LOG": "none-field"}}
    res, out = deploy(inventory(engine, "reqcrash", **{bad: crash}), capsys=capsys)
    r = res[bad]
    assert r.status == "failed"
    assert f"crashed on the {which} smoke request (temperature {temperature})" in r.error, r.error
    assert "cuda-graph-none-field" in r.error and "'NoneType' object has no attribute 'dtype'" in r.error
    assert "previous engine is healthy again" in r.error
    j = r.to_json()
    assert j["diagnosis"]["signature"] == "cuda-graph-none-field"
    assert j["diagnosis"]["evidence"] == "AttributeError: 'NoneType' object has no attribute 'dtype'"
    assert "_grouped_foreach_copy_" in j["journal_tail"] and "Main process exited" in j["journal_tail"]
    assert j["smoke"] == {
        "ok": False,
        "failed": which,
        "status": 0,
        "crashed": True,
        "signature": "cuda-graph-none-field",
    }
    assert "journal tail" in out and "cuda-graph-none-field" in out and TOKEN not in out
    assert r.elapsed < 20
    assert lab.ssh(bad, f"cat {ENV_FILE}") == env_before
    assert lab.ssh(bad, f"systemctl is-active {UNIT}").strip() == "active"
    for n in names[1:]:
        assert res[n].status == "ok", (n, res[n].error)


def test_a_failed_request_from_a_living_engine_says_so(lab, engine):
    bad = engine["names"][0]
    deploy(inventory(engine, "base"))
    pid = main_pid(lab, bad)
    res, _ = deploy(inventory(engine, "http500", **{bad: {"engine_env": {"K26OPS_STANDIN_REQUEST_ERROR": 500}}}))
    r = res[bad]
    assert r.status == "failed"
    assert "the greedy smoke request (temperature 0) to /generate failed (HTTP 500" in r.error, r.error
    assert "the engine did not die" in r.error and "crashed" not in r.error
    assert r.data["smoke"] == {"ok": False, "failed": "greedy", "status": 500, "crashed": False}
    assert "answering /generate with HTTP 500" in r.data["journal_tail"]
    assert main_pid(lab, bad) != pid  # the env change restarted it, the rollback restarted the old one
    assert lab.ssh(bad, f"systemctl is-active {UNIT}").strip() == "active"


def test_a_previous_engine_that_dies_after_the_rollback_is_named_too(lab, engine):
    bad = engine["names"][0]
    deploy(inventory(engine, "base"))
    # the running engine's env file changed behind k26ops' back: it would die on its next start
    lab.ssh(bad, f"echo K26OPS_STANDIN_CRASH=load >> {ENV_FILE}")
    crash = {"engine_env": {"K26OPS_STANDIN_CRASH": "first-request", "K26OPS_STANDIN_CRASH_LOG": "none-field"}}
    res, _ = deploy(inventory(engine, "twice", **{bad: crash}))
    r = res[bad]
    assert r.status == "failed" and "cuda-graph-none-field" in r.error
    assert "the previous engine crashed too" in r.error and "weight-file-corrupt" in r.error, r.error
    res, _ = deploy(inventory(engine, "base"))  # the inventory's env file again: healthy
    assert res[bad].status == "changed", res[bad].error


def test_canary_failure_stops_the_rollout(lab, engine):
    names = engine["names"]
    res, _ = deploy(inventory(engine, "base"))
    pids = {n: main_pid(lab, n) for n in names}
    crash = {"engine_env": {"K26OPS_STANDIN_CRASH": "load"}}
    changed = {n: crash for n in names}
    res, _ = deploy(inventory(engine, "canary", **changed), canary=1)
    assert res[names[0]].status == "failed"
    for n in names[1:]:
        assert res[n].status == "skipped" and "canary" in res[n].error
        assert main_pid(lab, n) == pids[n]
    assert lab.ssh(names[0], f"systemctl is-active {UNIT}").strip() == "active"


def test_bad_unit_never_replaces_the_working_one(lab, engine):
    lab1 = engine["names"][0]
    res, _ = deploy(inventory(engine, "base"))
    unit_before = lab.ssh(lab1, f"cat /etc/systemd/system/{UNIT}")
    pid = main_pid(lab, lab1)
    # a release dir without the engine's python: ExecStart is not executable
    lab.ssh(lab1, f"mkdir -p {RELEASES}/test-fake-empty")
    steps = [STEPS[n]({}) for n in ("service", "health", "smoke")]
    inv2 = inventory(engine, "badroot", **{lab1: {"releases_root": f"{RELEASES}/test-fake-empty"}})
    results = run_rollout(Settings(inventory=str(inv2)), playbook_work(steps), exit=False)
    r = {x.host: x for x in results}[lab1]
    assert r.status == "failed" and "systemd-analyze verify rejected" in r.error
    assert "not executable" in r.error
    assert lab.ssh(lab1, f"cat /etc/systemd/system/{UNIT}") == unit_before
    assert main_pid(lab, lab1) == pid


def test_an_engine_with_an_api_key_is_checked_and_smoked_with_it(lab, engine, capsys):
    """--api-key (an extra flag kept in the env file): SGLang then answers 401 on
    every path but /health*; health, smoke (first and converged runs) and status
    must send the key, and it is never printed nor put in the unit."""
    lab1 = engine["names"][0]
    key = "sk-lab-APIKEY-7f3a9c"
    inv = inventory(engine, "apikey", **{lab1: {"extra_flags": {"api-key": key}}})
    res, out = deploy(inv, capsys=capsys)
    r = res[lab1]
    assert r.status == "changed", r.error
    assert r.data["health"]["state"] == "healthy" and r.data["smoke"]["ok"], r.data
    port = engine["ports"][lab1]
    script = (
        "import sys, urllib.request as u\ntry: u.urlopen(u.Request(sys.argv[1], data=b'{}'))\n"
        "except Exception as e: print(getattr(e, 'code', e))"
    )
    probe = f"python3 -c {q(script)} http://127.0.0.1:{port}/generate"
    assert lab.ssh(lab1, probe).strip() == "401"  # the engine really demands the key
    assert key not in lab.ssh(lab1, f"cat /etc/systemd/system/{UNIT}")
    # The key is in no argv: not in what a local user without root sees in ps, systemctl status and
    # the journal, nor in the engine's /proc cmdline; only the root-only file it reads with --config
    # holds it. (The engine's own start-up line, server_args=, logs it in clear unless the release
    # carries patches/*/redact-api-key-in-startup-log.patch, as the real engine does
    # (tests/data/serving); these fake releases have no sglang: see test_lab_engine_standin.py.)
    seen = lab.ssh(
        lab1,
        f"cd /; for c in 'ps -eo args' 'systemctl status --no-pager -n 50 {UNIT}' "
        f"'journalctl --no-pager -n 500'; do runuser -u nobody -- sh -c \"$c\" 2>&1; done; "
        f"cat /proc/$(systemctl show -p MainPID --value {UNIT})/cmdline | tr '\\0' ' '",
    )
    assert key not in seen and f"--config {SECRETS_FILE}" in seen, seen[-2000:]
    assert lab.ssh(lab1, f"stat -c '%a %U' {SECRETS_FILE}").split() == ["600", "root"]
    assert lab.ssh(lab1, f"runuser -u nobody -- cat {SECRETS_FILE} 2>&1 || true").find(key) < 0
    res2, out2 = deploy(inv, capsys=capsys)  # converged: the one agent call carries the key too
    assert res2[lab1].status == "ok" and res2[lab1].data["smoke"]["ok"], res2[lab1].error
    env = {**lab.env(), "K26OPS_INVENTORY": str(inv), "HF_TOKEN": ""}
    rc, st = k26ops_json("--limit", lab1, "status", env=env)
    assert rc == 0 and st["hosts"][lab1]["model"] == "/models/Kimi-K2.6", st
    assert key not in out + out2 + json.dumps(st) + json.dumps([x.to_json() for x in (r, res2[lab1])])
    res3, _ = deploy(inventory(engine, "base"))  # back to the common state: no secret flags, no secrets file
    assert res3[lab1].status == "changed", res3[lab1].error
    assert lab.ssh(lab1, f"test -e {SECRETS_FILE} && echo present || echo gone").strip() == "gone"


def test_a_unit_k26ops_did_not_write_is_never_overwritten(lab, engine, capsys):
    """`engine_unit: ssh.service` (systemd's own from /lib) and a hand-made unit in
    /etc/systemd/system: one line naming the host and unit, nothing changed."""
    lab1 = engine["names"][0]
    lab.ssh(lab1, "printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/mine-test.service")
    try:
        for unit, why in (
            ("ssh.service", "systemd already has ssh.service from /"),  # /lib or /usr/lib
            ("mine-test.service", "was not written by k26ops"),
        ):
            before = lab.ssh(
                lab1,
                f"systemctl show -p FragmentPath,MainPID {unit}; cat /etc/systemd/system/{unit} 2>/dev/null || true",
            )
            res, out = deploy(
                inventory(engine, "foreign", **{lab1: {"engine_unit": unit}}), release=False, capsys=capsys
            )
            r = res[lab1]
            assert r.status == "failed" and r.error.startswith(f"refusing engine_unit {unit}: ") and why in r.error
            assert "\n" not in r.error
            assert [l for l in out.splitlines() if lab1 in l and f"refusing engine_unit {unit}" in l], out
            assert (
                lab.ssh(
                    lab1,
                    f"systemctl show -p FragmentPath,MainPID {unit}; "
                    f"cat /etc/systemd/system/{unit} 2>/dev/null || true",
                )
                == before
            )
    finally:
        lab.ssh(lab1, "rm -f /etc/systemd/system/mine-test.service")


def test_a_failed_deploy_puts_the_previous_secrets_file_back(lab, engine):
    """The secret-flags file follows the env file's rules: a deploy whose engine
    crashes restores the previous one (its key) with the unit, mode 0600."""
    bad = engine["names"][-1]
    old, new = "sk-lab-OLDKEY-5b1c2d", "sk-lab-NEWKEY-8e9f0a"
    res, _ = deploy(inventory(engine, "key-old", **{bad: {"extra_flags": {"api-key": old}}}))
    assert res[bad].status == "changed", res[bad].error
    before = lab.ssh(bad, f"stat -c '%a %U' {SECRETS_FILE}; cat {SECRETS_FILE}; cat /etc/systemd/system/{UNIT}")
    crash = {"extra_flags": {"api-key": new}, "engine_env": {"K26OPS_STANDIN_CRASH": "load"}}
    res, _ = deploy(inventory(engine, "key-new-crash", **{bad: crash}))
    assert res[bad].status == "failed" and "previous engine is healthy again" in res[bad].error, res[bad].error
    assert lab.ssh(bad, f"stat -c '%a %U' {SECRETS_FILE}; cat {SECRETS_FILE}; cat /etc/systemd/system/{UNIT}") == before
    assert old in before and new not in before
    res, _ = deploy(inventory(engine, "base"))  # back to the common state
    assert res[bad].status == "changed", res[bad].error


FOREIGN = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
log = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        with open(log, "a") as fh:
            fh.write(json.dumps({"path": self.path, "headers": dict(self.headers)}) + "\n")
        body = json.dumps({"text": "hello from a stand-in", "meta_info": {}, "data": [{"id": "x"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def foreign_listener(lab, host: str, port: int) -> tuple[int, str]:
    """A user (nobody) serving on the engine's port, answering 200 to everything and logging what
    it receives: (its pid, its log's path on the host)."""
    log = f"/tmp/foreign-{port}.log"
    lab.ssh(
        host,
        f"rm -f {log}; cat > /tmp/foreign.py <<'PY'\n{FOREIGN}\nPY\n"
        f"touch {log}; chown nobody {log}; cd /; setsid runuser -u nobody -- python3 /tmp/foreign.py {port} {log} "
        f"</dev/null >/dev/null 2>&1 & "
        f"for i in $(seq 50); do ss -ltn 'sport = :{port}' | grep -q LISTEN && break; sleep 0.1; done",
    )
    pid = int(lab.ssh(host, f"pgrep -u nobody -f 'foreign.py {port}'").split()[0])
    return pid, log


def test_a_listener_of_another_user_on_the_engine_port_gets_no_request(lab, engine, capsys):
    """A local user (nobody) listens on the engine's port while the engine is down: the deploy
    refuses to start it in one line naming the listener (pid, user, command), and the health,
    smoke and status requests of the engine agent (the api key with them) never reach it."""
    lab1 = engine["names"][0]
    port = engine["ports"][lab1]
    key = "sk-lab-APIKEY-foreign-51c2"
    inv = inventory(engine, "foreign-port", **{lab1: {"extra_flags": {"api-key": key}}})
    res, _ = deploy(inv)
    assert res[lab1].status in ("changed", "ok"), res[lab1].error
    lab.ssh(lab1, f"systemctl stop {UNIT}")
    pid, log = foreign_listener(lab, lab1, port)
    try:
        res, out = deploy(inv, capsys=capsys)
        r = res[lab1]
        assert r.status == "failed", r.data
        assert (
            f"refusing to start {UNIT}: port {port} is held by pid {pid} (user nobody: python3 /tmp/foreign.py"
            in r.error
            and "nothing changed" in r.error
        ), r.error
        assert "\n" not in r.error
        # the agent's own ops, as the health wait, the smoke and status run them on a running unit
        # (a transient one here: its process tree does not hold the port)
        lab.ssh(lab1, "systemd-run --unit=k26-foreign-test.service sleep 300")
        src = (REPO / "k26ops/agents/engine.py").read_text()
        for op, extra in (
            ("poll", {"window": 1.0}),
            ("smoke", {"prompt": "hi", "max_new_tokens": 4}),
            ("status", {"current": "/nonexistent/current"}),
        ):
            req = {"op": op, "unit": "k26-foreign-test.service", "port": port, "api_key": key, **extra}
            ans = json.loads(lab.ssh(lab1, f"echo {q(json.dumps(req))} | python3 -S -c {q(src)}").splitlines()[-1])
            holder = ans.get("holder") or ans.get("foreign")
            assert holder and holder["pid"] == pid and holder["user"] == "nobody", (op, ans)
            assert ans.get("state", "foreign") == "foreign" and ans.get("health") is None, ans
        seen = lab.ssh(lab1, f"cat {log}")
        assert seen == "", seen  # not one request, let alone one carrying the key
    finally:
        lab.ssh(lab1, f"kill {pid}; systemctl stop k26-foreign-test.service 2>/dev/null; true")
    res, _ = deploy(inventory(engine, "base"))
    assert res[lab1].status == "changed", res[lab1].error
