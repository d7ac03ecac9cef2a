"""`deploy --canary 1 --batch 1` on the 3-host shared lab: one host restarts at
a time (engine start times and the progress lines in order), and with `--gate`
every batch is benched: a slower engine on the second batch's host is rolled
back, the third host is left untouched, and no "gate passed" is printed for
the failed host. The hosts are left as the lab had them (no engine unit, env
file or pins)."""

from __future__ import annotations

import re

import pytest
import yaml

from labtools.invoke import k26ops, k26ops_json, lab_ssh
from labtools.recipes import recipe_with_extra_patch

HOSTS = ("lab1", "lab2", "lab3")
SHORT = ["--input-len", "16", "--output-len", "16", "--num-prompts", "4"]
UNIT = "/etc/systemd/system/k26-engine.service"
ENV_FILE = "/etc/k26ops/sglang.env"


def knobs(toks: float) -> dict:
    return {
        "K26OPS_STANDIN_DECODE_TOKS": str(toks),
        "K26OPS_STANDIN_TTFT_MS": "40",
        "K26OPS_STANDIN_ACCEPT_LENGTH": "3.2",
        "K26OPS_STANDIN_ACCEPT_LENGTH_SAMPLED": "2.4",
    }


def engine(lab, host: str) -> dict:
    show = lab.ssh(host, "systemctl show -p MainPID -p ExecMainStartTimestampMonotonic k26-engine.service")
    props = dict(line.split("=", 1) for line in show.split())
    return {
        "release": lab.ssh(host, "readlink /opt/k26ops/releases/current").strip(),
        "pid": props["MainPID"],
        "started_us": int(props["ExecMainStartTimestampMonotonic"]),
    }


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    d = tmp_path_factory.mktemp("batches")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["vars"]["engine_env"] = knobs(100.0)
    base = d / "inventory.yml"
    base.write_text(yaml.safe_dump(inv))
    changed = yaml.safe_load(yaml.safe_dump(inv))
    changed["vars"]["recipe"] = str(recipe_with_extra_patch(d, "batches"))  # a second release
    (d / "changed-inv.yml").write_text(yaml.safe_dump(changed))
    inv["hosts"]["lab2"].setdefault("vars", {})["engine_env"] = knobs(50.0)  # lab2 only: half the speed
    (d / "lab2-slower.yml").write_text(yaml.safe_dump(inv))
    e = {**lab.env(), "K26OPS_INVENTORY": str(base), "K26OPS_BASELINES": str(d / "baselines")}
    yield {"env": e, "changed": d / "changed-inv.yml", "lab2_slower": d / "lab2-slower.yml"}
    for h in HOSTS:
        lab_ssh(
            lab.dir,
            lab.port(h),
            f"systemctl disable --now k26-engine.service; rm -f {UNIT} {ENV_FILE} "
            "/opt/k26ops/state/pinned-releases; systemctl daemon-reload",
        )


def test_batch_1_restarts_one_host_at_a_time(lab, env):
    rc, data = k26ops_json("--limit", ",".join(HOSTS), "deploy", env=env["env"])
    assert rc == 0, data
    before = {h: engine(lab, h) for h in HOSTS}
    proc = k26ops(
        "-i", str(env["changed"]), "--limit", ",".join(HOSTS), "deploy", "--canary", "1", "--batch", "1", env=env["env"]
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    after = {h: engine(lab, h) for h in HOSTS}
    for h in HOSTS:
        assert after[h]["pid"] != before[h]["pid"] and after[h]["release"] != before[h]["release"], h
    # the engines started in host order ...
    assert after["lab1"]["started_us"] < after["lab2"]["started_us"] < after["lab3"]["started_us"], after
    # ... and each host was done (healthy, smoke passed) before the next one started (progress lines)
    events = re.findall(r"^(lab\d): (start|done \w+)", proc.stderr, re.M)
    order = [f"{h} {'start' if e == 'start' else 'done'}" for h, e in events]
    assert order == ["lab1 start", "lab1 done", "lab2 start", "lab2 done", "lab3 start", "lab3 done"], proc.stderr


def test_gate_on_every_batch_stops_after_a_slower_host(lab, env):
    rc, data = k26ops_json(
        "-i",
        str(env["changed"]),
        "--limit",
        ",".join(HOSTS),
        "snapshot",
        "--tag",
        "b0",
        "--bench",
        "--concurrency",
        "1",
        "--temperatures",
        "0",
        "--runs",
        "1",
        *SHORT,
        env=env["env"],
    )
    assert rc == 0, data
    before = {h: engine(lab, h) for h in HOSTS}
    # back to the base release everywhere, lab2 at half the speed: lab1 passes its gate, lab2 fails its own
    proc = k26ops(
        "-i",
        str(env["lab2_slower"]),
        "--limit",
        ",".join(HOSTS),
        "deploy",
        "--canary",
        "1",
        "--batch",
        "1",
        "--gate",
        "b0",
        "--gate-threshold",
        "25",
        env=env["env"],
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    after = {h: engine(lab, h) for h in HOSTS}
    assert after["lab1"]["release"] != before["lab1"]["release"]  # deployed, gated, kept
    assert after["lab2"]["release"] == before["lab2"]["release"]  # rolled back after its gate
    assert after["lab3"] == before["lab3"]  # untouched: same release, same engine process
    assert "gate passed on lab1 against b0" in proc.stdout, proc.stdout
    assert "gate passed on lab2" not in proc.stdout and "gate passed on lab3" not in proc.stdout, proc.stdout
    stop = [ln for ln in proc.stderr.splitlines() if ln.startswith("k26ops: rollout stopped")]
    assert len(stop) == 1 and stop[0].startswith("k26ops: rollout stopped: lab2: gate failed"), proc.stderr
    assert stop[0].endswith("untouched: lab3"), stop
    assert re.search(r"lab3\s.*skipped", proc.stdout), proc.stdout


def test_logs_n_counts_the_lines_it_shows_and_a_bad_since_is_a_usage_error(lab, env):
    port = yaml.safe_load(lab.inventory.read_text())["hosts"]["lab1"]["vars"]["engine_port"]
    # 40 of k26ops' own health requests: the newest 40 journal lines are all hidden ones
    lab.ssh(
        "lab1",
        "python3 -c 'import urllib.request as u\nfor _ in range(40): "
        f'u.urlopen("http://127.0.0.1:{port}/health?from=k26ops").read()\'',
    )
    proc = k26ops("--limit", "lab1", "logs", "-n", "5", env=env["env"])
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout.splitlines()
    assert len(shown) == 5 and not any("from=k26ops" in line for line in shown), proc.stdout
    proc = k26ops("--limit", "lab1", "logs", "-n", "5", "--all", env=env["env"])
    assert proc.returncode == 0 and all("from=k26ops" in line for line in proc.stdout.splitlines()), proc.stdout
    proc = k26ops("--limit", ",".join(HOSTS), "logs", "--since", "yesterdy", env=env["env"])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "--since 'yesterdy'" in proc.stderr and proc.stdout == "", proc.stderr
