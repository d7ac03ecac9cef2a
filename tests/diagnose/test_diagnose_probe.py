"""`k26ops diagnose cuda-graph` and `diagnose service` on a real lab host: real
nspawn host, real systemd and journald, a real release built by `deploy`, the
engine stand-in as the engine (it notices the probe patch in its release by
itself, like the real engine would run the probed code).

One private 1-host lab for the module (the host is changed and restored).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
import yaml
from jsonshape import validate

from labtools import REPO
from labtools.invoke import k26ops, k26ops_json
from labtools.ports import free_port_block

UNIT = "k26-engine.service"
PLAYBOOK = "name: engine\nsteps:\n  - release: {keep: 3}\n  - service: {}\n  - health: {}\n"
SITE_HASH = (
    'cd $(python3 -c \'import json;print(json.load(open("/opt/k26ops/releases/current/manifest.json"))'
    '["site_packages"])\') && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum'
)
BASE_ENV = {
    "K26OPS_STANDIN_CRASH": "first-request",
    "K26OPS_STANDIN_CRASH_LOG": "none-field",
    "K26OPS_STANDIN_NONE_FIELD": "seq_lens",
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    from labtools.labs import private_lab

    d = tmp_path_factory.mktemp("diagprobe")
    (d / "engine.yml").write_text(PLAYBOOK)
    with private_lab(1, "diagprobe", deployed=True) as lab:
        # the lab hosts share the loopback with other labs: an engine port of our own
        yield {"lab": lab, "dir": d, "name": lab.hosts[0].name, "port": free_port_block(1, start=35000, stop=39000)}


def remote(h, cmd: str) -> str:
    return h["lab"].ssh(h["name"], cmd).strip()


def deploy(h, env: dict, tag: str) -> str:
    inv = yaml.safe_load(h["lab"].inventory.read_text())
    inv["vars"]["engine_env"] = env
    inv["vars"]["engine_profile"] = {"disable_cuda_graph": True}
    inv["hosts"][h["name"]]["vars"]["engine_port"] = h["port"]
    path = h["dir"] / f"inv-{tag}.yml"
    path.write_text(yaml.safe_dump(inv))
    rc, data = k26ops_json("-i", str(path), "deploy", "--playbook", str(h["dir"] / "engine.yml"))
    assert rc == 0, data
    return str(path)


def engine_state(h) -> dict:
    """Everything the probe must leave as it found it."""
    pid = remote(h, f"systemctl show -p MainPID --value {UNIT}")
    return {
        "site": remote(h, SITE_HASH),
        "release": remote(h, "readlink /opt/k26ops/releases/current"),
        "release_dir": remote(h, "ls -a /opt/k26ops/releases/current/"),
        "patch_state": remote(
            h, "cd /opt/k26ops/releases/current && find patch-state -type f | sort | xargs sha256sum"
        ),
        "unit": remote(h, f"systemctl cat {UNIT} | sha256sum; sha256sum /etc/k26ops/sglang.env"),
        "dropins": remote(h, f"ls -la /etc/systemd/system/{UNIT}.d /run/systemd/system/{UNIT}.d 2>&1; true"),
        "active": remote(h, f"systemctl is-active {UNIT}; true"),
        "enabled": remote(h, f"systemctl is-enabled {UNIT}; true"),
        "argv": remote(h, f"tr '\\0' ' ' < /proc/{pid}/cmdline") if pid != "0" else None,
    }


def assert_restored(h, before: dict) -> None:
    after = engine_state(h)
    assert after == before
    assert "--disable-cuda-graph" in after["argv"]
    port = remote(h, f"systemctl cat {UNIT} | grep -o -- '--port [0-9]*' | cut -d' ' -f2")
    code = remote(
        h,
        "python3 -c \"import urllib.request as u;print(u.urlopen('http://127.0.0.1:"
        f"{port}/health',timeout=5).status)\"",
    )
    assert code == "200"


def test_probe_names_the_none_field_and_restores_everything(host):
    inv = deploy(host, BASE_ENV, "none")
    before = engine_state(host)
    assert before["active"] == "active"
    proc = k26ops("-i", inv, "--json", "diagnose", "cuda-graph", "-y", "--host", host["name"], timeout=300)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    rep = json.loads(proc.stdout)
    validate(rep)  # as labtools.invoke.k26ops_json does (this test also reads the progress on stderr)
    assert rep["exit_code"] == proc.returncode
    d = rep["diagnosis"]
    assert d["signature"] == "cuda-graph-none-field"
    assert d["detail"]["field"] == "seq_lens" and d["detail"]["index"] == 1
    assert "K26OPS-PROBE" in d["evidence"] and d["phase"] == "replay" and d["rank"] == "TP0"
    assert "seq_lens" in d["suggestion"]
    assert rep["canonical"] is True and rep["graphs_enabled_by_dropin"] is True
    assert rep["crashed"] is True and rep["crash_when"] == "request"
    assert rep["restore_errors"] == [] and rep["engine_after"]["ActiveState"] == "active"
    assert "seq_lens" in rep["summary"]
    assert "waiting for ready" in proc.stderr or "ready after" in proc.stderr
    assert_restored(host, before)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_while_waiting_for_ready_reverts_and_restores(host, sig):
    """Ctrl-C, SIGTERM and a closed terminal (SIGHUP) all revert the probe and
    remove its drop-in (before SIGTERM/SIGHUP were handled, both left them)."""
    inv = deploy(host, {**BASE_ENV, "K26OPS_STANDIN_LOAD_SECONDS": "6"}, "slow")
    before = engine_state(host)
    p = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-i", inv, "diagnose", "cuda-graph", "-y", "--host", host["name"]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    t0 = time.monotonic()
    for line in p.stderr:
        seen.append(line)
        if "waiting for ready" in line:
            break
        assert time.monotonic() - t0 < 120, seen
    # the probe is applied on the host right now
    rel = remote(host, "readlink -f /opt/k26ops/releases/current")
    assert remote(host, f"test -f {rel}/probe-state/state.json && echo yes") == "yes"
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (out, err)
    err = "".join(seen) + err
    if sig != signal.SIGHUP:  # after a hang-up there is no terminal to say it on
        assert "interrupted" in err
    assert "Traceback" not in err + out
    assert remote(host, f"test -e {rel}/probe-state && echo left || echo gone") == "gone"
    assert_restored(host, before)


def _kill_diagnose_once_it_waits(inv: str, host) -> None:
    """`diagnose cuda-graph` SIGKILLed once its probed engine is waiting for ready (the probe applied)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-i", inv, "diagnose", "cuda-graph", "-y", "--host", host["name"]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    for line in p.stderr:
        if "waiting for ready" in line:
            break
        assert time.monotonic() - t0 < 120
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)


def test_a_probe_left_by_a_killed_run_is_reported_as_modified(host):
    """SIGKILL cannot be handled: the probe stays applied, and `status` must say
    the release is modified, never canonical; the next diagnose reverts it."""
    inv = deploy(host, {**BASE_ENV, "K26OPS_STANDIN_LOAD_SECONDS": "6"}, "killed")
    _kill_diagnose_once_it_waits(inv, host)
    rc, data = k26ops_json("-i", inv, "status")
    d = data["hosts"][host["name"]]["drift"]
    assert d["canonical"] is False and d["probe_left"] is True, d
    assert rc == 1, data  # drift is not a healthy answer (issue 42)
    assert "a probe (diagnose cuda-graph, rehearse --probe) is still applied" in data["hosts"][host["name"]]["baseline"]
    # a snapshot would record the probed files as the release's: refused, --allow-unhealthy or not
    snap = k26ops(
        "-i",
        inv,
        "snapshot",
        "--tag",
        "probed",
        "-m",
        "x",
        "--allow-unhealthy",
        env={"K26OPS_BASELINES": str(host["dir"] / "baselines")},
    )
    assert snap.returncode != 0 and "a probe is left applied to release" in snap.stdout + snap.stderr, (
        snap.stdout,
        snap.stderr,
    )
    proc = k26ops("-i", inv, "--json", "diagnose", "cuda-graph", "-y", "--host", host["name"], timeout=300)
    assert "reverted a probe left by an earlier run" in proc.stdout + proc.stderr
    # killed again: the next deploy (nothing else to change) reverts the probe and restarts the engine
    _kill_diagnose_once_it_waits(inv, host)
    rc, data = k26ops_json("-i", inv, "deploy", "--playbook", str(host["dir"] / "engine.yml"))
    assert rc == 0 and data["hosts"][host["name"]].get("probe_reverted"), data
    rc, data = k26ops_json("-i", inv, "status")
    assert data["hosts"][host["name"]]["drift"]["canonical"] is True, data
    remote(
        host, "rm -f /run/systemd/system/k26-engine.service.d/zz-k26ops-probe.conf; systemctl daemon-reload"
    )  # its drop-in
    deploy(host, BASE_ENV, "after-kill")
    rc, data = k26ops_json("-i", inv, "status")
    assert data["hosts"][host["name"]]["drift"]["canonical"] is True


def test_check_shows_the_plan_and_a_serving_engine_is_not_restarted_unasked(host):
    """--check changes nothing; with no terminal to ask on and no -y, one line and no change."""
    inv = deploy(host, BASE_ENV, "none")
    before = engine_state(host)
    assert before["active"] == "active"
    proc = k26ops("-i", inv, "diagnose", "cuda-graph", "--host", host["name"], "--check", input="", timeout=120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{host['name']}: would (nothing changed):", proc.stdout
    assert any("restart k26-engine.service with CUDA graphs on (it is serving now" in ln for ln in lines)
    assert lines[-1].strip() == "revert the probe, then restart k26-engine.service as deployed"
    rc, doc = k26ops_json("-i", inv, "diagnose", "cuda-graph", "--host", host["name"], "-C", input="")
    assert rc == 0 and doc["check"] is True and len(doc["plan"]) == 4, doc
    assert engine_state(host) == before
    proc = k26ops("-i", inv, "diagnose", "cuda-graph", "--host", host["name"], input="", timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("k26ops: error:")]
    assert len(errors) == 1 and proc.stderr.splitlines()[-1] == errors[0] and "Traceback" not in proc.stderr
    assert "pass -y to go ahead" in errors[0] and "nothing changed" in errors[0]
    assert engine_state(host) == before


def test_not_canonical_is_refused_and_nothing_changes(host):
    inv = deploy(host, BASE_ENV, "none")
    manifest = json.loads(remote(host, "cat /opt/k26ops/releases/current/manifest.json"))
    rel = sorted(manifest["patched_files"])[0]
    path = f"{manifest['site_packages']}/{rel}"
    remote(host, f"cp -p {path} /root/keep.py && echo '# local edit' >> {path}")
    try:
        before = engine_state(host)
        proc = k26ops("-i", inv, "diagnose", "cuda-graph", "--host", host["name"], timeout=120)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("k26ops: error:")]
        assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0]
        line = errors[0]
        assert "not canonical" in line and rel in line and "--force" in line
        assert engine_state(host) == before
    finally:
        remote(host, f"cp -p /root/keep.py {path} && rm /root/keep.py")


def first_request(h) -> None:
    """One /generate request to the deployed engine (it crashes on it), then a moment."""
    port = remote(h, f"systemctl cat {UNIT} | grep -o -- '--port [0-9]*' | cut -d' ' -f2")
    remote(
        h,
        "python3 -c \"import urllib.request as u\ntry: u.urlopen(u.Request('http://127.0.0.1:"
        f"{port}/generate', data=b'{{}}'), timeout=10)\nexcept Exception as e: print(e)\"",
    )
    time.sleep(1.5)


def test_diagnose_service_names_the_shape_mismatch(host):
    env = {
        "K26OPS_STANDIN_CRASH": "first-request",
        "K26OPS_STANDIN_CRASH_LOG": "shape-mismatch",
        "K26OPS_STANDIN_CRASH_GRAPH_ONLY": "0",
    }
    inv = deploy(host, env, "shape")
    rc, data = k26ops_json("-i", inv, "diagnose", "service")
    assert rc == 0, json.dumps(data)[:3000]
    # earlier tests (the probe's crash) may have left a crash in the journal: not this one
    earlier = data["hosts"][host["name"]].get("invocation")
    assert data["hosts"][host["name"]].get("signature") != "cuda-graph-shape-mismatch"
    first_request(host)
    rc, data = k26ops_json("-i", inv, "diagnose", "service")
    assert rc == 0, data
    r = data["hosts"][host["name"]]
    assert r["crashed"] is True and r["signature"] == "cuda-graph-shape-mismatch", r
    assert r["invocation"] != earlier and r["crashed_at"]
    assert r["detail"] == {"got": 8, "expected": 33, "dim": 0}
    assert r["phase"] == "replay" and r["rank"] == "TP0" and "budget+1" in r["suggestion"]
    assert "status=1" in r["exit"]
    proc = k26ops("-i", inv, "diagnose", "service")
    assert proc.returncode == 0 and "cuda-graph-shape-mismatch" in proc.stdout
    # put the host back to the healthy configuration
    deploy(host, BASE_ENV, "none")


def test_diagnose_service_exits_1_for_a_crash_of_no_known_kind(host):
    """A real public crash log of no known kind (tests/data/logs, MANIFEST.json) printed by
    the stand-in on its first request: named `unclassified` with its first error, exit 1."""
    text = (REPO / "tests/data/logs/sglang_nextn_arange_power_of_2.log").read_text()
    path = "/var/lib/k26-unknown-crash.log"
    remote(host, f"printf %s {shlex.quote(text)} > {path} && chmod 0644 {path}")
    env = {
        "K26OPS_STANDIN_CRASH": "first-request",
        "K26OPS_STANDIN_CRASH_LOG": path,
        "K26OPS_STANDIN_CRASH_GRAPH_ONLY": "0",
    }
    inv = deploy(host, env, "unknown")
    first_request(host)
    rc, data = k26ops_json("-i", inv, "diagnose", "service")
    r = data["hosts"][host["name"]]
    assert rc == 1, r
    assert r["status"] == "ok" and r["crashed"] is True and r["signature"] == "unclassified", r
    assert r["error_found"] is True and "arange's range must be a power of 2" in r["evidence"]
    proc = k26ops("-i", inv, "diagnose", "service")
    assert proc.returncode == 1 and "unclassified" in proc.stdout and "Traceback" not in proc.stderr
    deploy(host, BASE_ENV, "none")


# ---------------------------------------------------------------- 0.5.23 DFLASH: fill_from drops a None

SILENT_ENV = {**BASE_ENV, "K26OPS_STANDIN_NONE_SILENT": "1"}


def test_probe_names_a_none_that_fill_from_drops_silently(host):
    """Without the probe the engine serves the None (0.5.23's fill_from skips it: no crash);
    with it, the probe's fill_from error names the slot and the graph."""
    inv = deploy(host, SILENT_ENV, "silent")
    first_request(host)
    assert remote(host, f"systemctl is-active {UNIT}; true") == "active"  # silently served
    rc, rep = k26ops_json("-i", inv, "diagnose", "cuda-graph", "-y", "--host", host["name"], timeout=300)
    assert rc == 0, rep
    d = rep["diagnosis"]
    assert d["signature"] == "cuda-graph-none-field", d
    assert d["detail"]["field"] == "seq_lens" and d["detail"]["graph"] == "verify"
    assert d["detail"]["copy"] == "fill_from" and d["phase"] == "replay"
    assert rep["crashed"] is True and rep["crash_when"] == "request"
    assert rep["summary"] == "cuda-graph-none-field: `seq_lens` (verify graph, fill_from) was None"
    assert rep["watched"]["fill_from"] == {"draft": 1, "verify": 1}
    assert rep["restore_errors"] == [] and rep["engine_after"]["ActiveState"] == "active"


def test_no_crash_is_an_all_clear_only_for_copies_the_probe_watched(host):
    inv = deploy(host, {"K26OPS_STANDIN_NONE_SILENT": "1"}, "clean")
    rc, rep = k26ops_json("-i", inv, "diagnose", "cuda-graph", "-y", "--host", host["name"], timeout=300)
    assert rc == 0 and rep["crashed"] is False and rep["diagnosis"] is None, rep
    assert rep["watched"]["fill_from"] == {"draft": 3, "verify": 3}
    assert rep["summary"].startswith(
        "no crash: with CUDA graphs on and the probe applied, no None or wrongly "
        "sized input reached the copies it watched (fill_from[draft] 3, "
        "fill_from[verify] 3, copy_slots 0)"
    ), rep["summary"]
    # the probed engine never reaches the instrumented copies: no all-clear
    inv = deploy(host, {"K26OPS_STANDIN_NONE_SILENT": "1", "K26OPS_STANDIN_PROBE_WATCH": "0"}, "unwatched")
    proc = k26ops("-i", inv, "diagnose", "cuda-graph", "-y", "--host", host["name"], timeout=300)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "no crash:" not in proc.stdout
    assert "not checked: the engine served without a crash, but the probe reported no watched copy" in proc.stdout
    assert "probe watched: nothing" in proc.stdout
    deploy(host, BASE_ENV, "none")


def test_graphs_on_exec_drops_every_way_of_turning_graphs_off():
    from k26ops.diagnose.probe import graphs_on_exec

    base = "ExecStart=/opt/v/bin/python -m sglang.launch_server --model-path /m --port 30000"
    assert graphs_on_exec(base) is None
    for off in (
        "--disable-cuda-graph",
        "--cuda-graph-backend-decode disabled",
        "--cuda-graph-backend-decode=disabled --cuda-graph-backend-prefill=disabled",
        "--cuda-graph-backend-prefill disabled --disable-cuda-graph",
    ):
        assert graphs_on_exec(f"{base} {off} --tp-size 8") == base[len("ExecStart=") :] + " --tp-size 8", off
    # another backend choice stays: only `disabled` turns graphs off
    assert graphs_on_exec(f"{base} --cuda-graph-backend-decode full") is None


def test_summary_without_graph_path_copies_is_not_an_all_clear():
    from k26ops.diagnose.probe import ProbeReport, summary, watched_counts

    rep = ProbeReport(host="h", crashed=False)
    assert summary(rep).startswith("not checked:")
    rep.watched = watched_counts(
        "x K26OPS-PROBE watched: copy_slots=4 fill_from[decode]=9 slots_checked=50 pid=1\n"
        "K26OPS-PROBE watched: copy_slots=7 fill_from[decode]=12 slots_checked=80 pid=1"
    )
    assert rep.watched == {"fill_from": {"decode": 12}, "copy_slots": 7, "slots_checked": 80}
    assert summary(rep) == (
        "not checked: the engine served without a crash, but the probe watched only "
        "fill_from[decode] 12, copy_slots 7, none on the draft or verify graph path; "
        "that path was not checked"
    )
    rep.watched = watched_counts("K26OPS-PROBE watched: copy_slots=0 fill_from[verify]=5 slots_checked=30 pid=2")
    assert summary(rep) == (
        "no crash: with CUDA graphs on and the probe applied, no None or wrongly sized input "
        "reached the copies it watched (fill_from[verify] 5, copy_slots 0); the draft graph's "
        "fill was not seen, so it was not checked"
    )


@pytest.mark.parametrize("interrupted", [False, True], ids=["done", "interrupted"])
def test_probe_json_fits_the_envelope_and_its_schema(interrupted, monkeypatch, capsys):
    """The document `diagnose cuda-graph --json` prints (k26ops.cli.commands.diagnose._print_probe)
    is a success document: no `error` key (the envelope's mark of an error document;
    the report used to carry an unused `error: null`)."""
    from k26ops.cli import jsonout
    from k26ops.cli.commands.diagnose import _print_probe
    from k26ops.cli.context import Settings
    from k26ops.diagnose.probe import ProbeReport

    monkeypatch.setitem(jsonout.CURRENT, "command", "diagnose cuda-graph")
    rep = ProbeReport(
        host="h",
        release="r1",
        canonical=True,
        crashed=False,
        interrupted=interrupted,
        watched={"fill_from": {"draft": 3, "verify": 3}, "copy_slots": 0, "slots_checked": 30},
    )
    code = 130 if interrupted else 0
    _print_probe(Settings(as_json=True), rep, code)
    doc = json.loads(capsys.readouterr().out)
    validate(doc)
    assert doc["exit_code"] == code and doc["host"] == "h" and "error" not in doc
