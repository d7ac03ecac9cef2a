"""The one drain path on real lab hosts (issue 41, item 2 and its done-when): two lab hosts
(nspawn, real systemd) serve the engine stand-in (which drains on SIGTERM as SGLang 0.5.23)
behind the REAL SGLang Model Gateway (PyPI sglang-router 0.3.2) run on the control node's
loopback. Every restarting command is run through the real CLI while a client sends requests
through the gateway:

- deploy registers the engines, renders TimeoutStopSec above drain_timeout (systemctl show),
  rolls one host at a time by default and no client request fails;
- a host that fails its smoke test is never put back (and the next good deploy puts it back);
- rollback --tag, reboot, diagnose cuda-graph and rehearse --stop-serving take the host out and put
  it back the same way;
- Ctrl-C during a deploy's drain puts the worker back and leaves the old engine serving.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from labtools import REPO
from labtools.invoke import k26ops, k26ops_json
from labtools.labs import private_lab, sglang_router
from labtools.ports import free_port_block

pytest.importorskip("sglang_router")

UNIT = "k26-engine.service"
DRAIN_S = 20
JSON = {"Content-Type": "application/json"}
ENV = {"K26OPS_STANDIN_DECODE_TOKS": "20", "K26OPS_STANDIN_DRAIN_POLL_S": "0.5"}


@pytest.fixture(scope="module")
def dl(tmp_path_factory):
    from k26ops.traffic.gateway import Gateway

    d = tmp_path_factory.mktemp("drain")
    with private_lab(2, "drain", deployed=True) as lab, sglang_router(d, "--policy", "round_robin") as r:
        inv = yaml.safe_load(lab.inventory.read_text())
        names = [h.name for h in lab.hosts]
        ports = {n: inv["hosts"][n]["vars"].get("engine_port") or inv["vars"].get("engine_port") for n in names}
        yield {
            "lab": lab,
            "dir": d,
            "router": r,
            "gw": Gateway(r["url"], r["key"]),
            "names": names,
            "urls": {n: f"http://127.0.0.1:{ports[n]}" for n in names},
            "env": {**lab.env(), "K26OPS_BASELINES": str(d / "baselines")},
        }


def inventory(dl, tag: str, env: dict | None = None, host_env: dict | None = None, **v) -> str:
    inv = yaml.safe_load(dl["lab"].inventory.read_text())
    inv["vars"].update(
        {
            "model_gateway": dl["router"]["url"],
            "model_gateway_api_key": dl["router"]["key"],
            "drain_timeout": DRAIN_S,
            "extra_flags": ["--enable-metrics"],
            "engine_profile": {"disable_cuda_graph": True},
            "engine_env": {**ENV, **(env or {})},
            **v,
        }
    )
    for name, extra in (host_env or {}).items():
        inv["hosts"][name]["vars"]["engine_env"] = {**ENV, **(env or {}), **extra}
    path = dl["dir"] / f"inv-{tag}.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def cli(dl, inv: str, *args: str, timeout: float = 600) -> tuple[int, dict]:
    return k26ops_json("-i", inv, *args, env=dl["env"], timeout=timeout)


def remote(dl, name: str, cmd: str) -> str:
    return dl["lab"].ssh(name, cmd).strip()


def healthy(dl) -> dict:
    return {n: bool((w := dl["gw"].find(u)) and w.healthy) for n, u in dl["urls"].items()}


def tokens(body: bytes, stream: bool) -> int | None:
    """completion_tokens of an answer; a stream's last chunk, None unless it ended with [DONE]."""
    if not stream:
        return json.loads(body)["meta_info"]["completion_tokens"]
    head, done, _ = body.partition(b"data: [DONE]")
    return json.loads(head.strip().split(b"data: ")[-1])["meta_info"]["completion_tokens"] if done else None


class Client(threading.Thread):
    """Requests through the gateway, one after another (a streamed one of 2 s every fifth), all counted."""

    def __init__(self, dl):
        super().__init__(daemon=True)
        self.port, self.stop_ev = dl["router"]["port"], threading.Event()
        self.ok, self.failed = 0, []

    def one(self, stream: bool) -> None:
        n = 40 if stream else 3
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(
            "POST",
            "/generate",
            body=json.dumps({"text": "hi", "stream": stream, "sampling_params": {"max_new_tokens": n}}),
            headers=JSON,
        )
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            raise OSError(f"HTTP {r.status}")
        got = tokens(body, stream)
        if got != n:
            raise OSError(f"cut: {got} of {n} tokens")

    def run(self):
        i = 0
        while not self.stop_ev.is_set():
            try:
                self.one(i % 5 == 0)
                self.ok += 1
            except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")
            i += 1
            self.stop_ev.wait(0.05)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.join(90)


def assert_drained_and_back(doc: dict, names) -> None:
    for n in names:
        t = doc["hosts"][n]["traffic"]
        assert t["mode"] == "gateway" and t["drain_s"] is not None and t["put_back"] is True, (n, t)
        assert t["out_of_rotation_s"] > 0 and t["stop_to_serving_s"] > 0, (n, t)
    tr = doc.get("traffic") or {}
    assert tr.get("zero_worker_windows") == 0, tr


def test_deploy_registers_renders_the_stop_timeout_and_rolls_with_no_request_lost(dl):
    rc, doc = cli(dl, inventory(dl, "first"), "deploy")
    assert rc == 0, doc
    assert healthy(dl) == {n: True for n in dl["names"]}
    for n in dl["names"]:  # the unit systemd runs: TimeoutStopSec = drain_timeout + 60 s, above the drain
        assert remote(dl, n, f"systemctl show -p TimeoutStopUSec --value {UNIT}") == "1min 20s"
    with Client(dl) as client:
        time.sleep(1.0)
        rc, doc = cli(dl, inventory(dl, "second", env={"K26OPS_STANDIN_TTFT_MS": "1"}), "deploy")
        time.sleep(1.0)
    assert rc == 0, doc
    assert_drained_and_back(doc, dl["names"])
    assert doc["traffic"]["gateways"][dl["gw"].name]["min_healthy"] >= 1
    assert client.failed == [] and client.ok >= 10, (client.ok, client.failed[:5])
    assert healthy(dl) == {n: True for n in dl["names"]}


def test_check_says_what_a_stop_does_to_traffic_per_host_or_once_when_nothing_is_set(dl):
    from k26ops.traffic.gateway import shown_url

    inv = inventory(dl, "second", env={"K26OPS_STANDIN_TTFT_MS": "1"})
    p = k26ops("-v", "-i", inv, "check", env=dl["env"], timeout=300)
    out = " ".join(p.stdout.split())
    for n in dl["names"]:
        assert (
            f"{n}: ok traffic: out of rotation at {shown_url(dl['router']['url'])} before a stop, min_serving 1; "
            f"drain_timeout 20s (inventory), TimeoutStopSec 80; {shown_url(dl['router']['url'])}: "
            f"{dl['urls'][n]} healthy"
        ) in out, p.stdout + p.stderr
    assert dl["router"]["key"] not in p.stdout + p.stderr
    assert "no host names a model_gateway" not in out
    p = k26ops("-i", str(dl["lab"].inventory), "check", env=dl["env"], timeout=300)  # the lab's own: nothing set
    assert (
        " ".join(p.stdout.split()).count(
            "traffic: no host names a model_gateway, drain_hook or drain mode: "
            "an engine restart drops its in-flight requests, as before"
        )
        == 1
    )


def test_a_host_that_fails_its_smoke_test_is_not_put_back_and_a_good_deploy_puts_it_back(dl):
    bad = dl["names"][1]
    with Client(dl) as client:
        rc, doc = cli(
            dl,
            inventory(
                dl,
                "smoke-fails",
                env={"K26OPS_STANDIN_TTFT_MS": "1"},
                host_env={bad: {"K26OPS_STANDIN_REQUEST_ERROR": "500"}},
            ),
            "deploy",
        )
    assert rc != 0 and doc["hosts"][bad]["status"] == "failed", doc
    t = doc["hosts"][bad]["traffic"]
    assert t["drain_s"] is not None and t["put_back"] is False and t["out_of_rotation_s"] is None, t
    assert healthy(dl) == {dl["names"][0]: True, bad: False} and dl["gw"].find(dl["urls"][bad]) is None
    assert remote(dl, bad, f"systemctl is-active {UNIT}") == "active"  # the old engine serves again
    assert client.failed == [], client.failed[:5]  # nothing was routed to it meanwhile
    # the next deploy changes nothing on the host but puts the healthy engine back
    rc, doc = cli(dl, inventory(dl, "second", env={"K26OPS_STANDIN_TTFT_MS": "1"}), "deploy")
    assert rc == 0, doc
    assert doc["hosts"][bad]["traffic"]["registered"] == [dl["gw"].name], doc["hosts"][bad]
    assert healthy(dl) == {n: True for n in dl["names"]}


def test_rollback_goes_through_the_drain_and_raises_the_tags_stop_timeout(dl):
    inv = inventory(dl, "second", env={"K26OPS_STANDIN_TTFT_MS": "1"})
    rc, doc = cli(dl, inv, "snapshot", "--tag", "drain-t1", "-m", "before the change")
    assert rc == 0, doc
    rc, doc = cli(dl, inventory(dl, "third", env={"K26OPS_STANDIN_TTFT_MS": "2"}), "deploy")
    assert rc == 0, doc
    with Client(dl) as client:  # the tag's unit says TimeoutStopSec=80: not above a drain_timeout of 100
        rc, doc = cli(
            dl,
            inventory(dl, "rollback", env={"K26OPS_STANDIN_TTFT_MS": "2"}, drain_timeout=100),
            "rollback",
            "--tag",
            "drain-t1",
            "--canary",
            "1",
            "--batch",
            "1",
            "--max-fail",
            "0",
        )
    assert rc == 0 and doc["canary"] == 1, doc
    assert_drained_and_back(doc, dl["names"])
    assert client.failed == [], client.failed[:5]
    for n in dl["names"]:
        assert remote(dl, n, f"systemctl show -p TimeoutStopUSec --value {UNIT}") == "2min 40s"
        assert "TimeoutStopSec=80 -> TimeoutStopSec=160" in json.dumps(doc["hosts"][n]["steps"])


def test_reboot_and_diagnose_cuda_graph_go_through_the_drain(dl):
    inv = inventory(dl, "second", env={"K26OPS_STANDIN_TTFT_MS": "1"})
    rc, doc = cli(dl, inv, "deploy")  # the rollback's unit back to the inventory's
    assert rc == 0, doc
    host = dl["names"][0]
    with Client(dl) as client:
        rc, doc = cli(dl, inv, "--limit", host, "reboot", "--allow-reboot", "--reboot-timeout", "180")
        assert rc == 0, doc
        assert_drained_and_back(doc, [host])
        rc, rep = cli(dl, inv, "diagnose", "cuda-graph", "-y", "--host", host, timeout=400)
        assert rc == 0, rep
    t = rep["traffic"]
    assert t["drain_s"] is not None and t["put_back"] is True, rep
    assert "back in rotation" in rep["restored"], rep["restored"]
    assert client.failed == [], client.failed[:5]
    assert healthy(dl) == {n: True for n in dl["names"]}


def test_rehearse_stop_serving_goes_through_the_drain(dl):
    inv = inventory(dl, "second", env={"K26OPS_STANDIN_TTFT_MS": "1"})
    host = dl["names"][1]
    with Client(dl) as client:
        rc, doc = cli(
            dl,
            inv,
            "--limit",
            host,
            "rehearse",
            "--stop-serving",
            "--rehearse-port",
            str(free_port_block(1, start=35000, stop=39000)),
            "--no-bench",
        )
    assert rc == 0, doc
    rep = doc["hosts"][host]["rehearsal"]
    assert rep["serving_after"] == "healthy" and rep["traffic"]["put_back"] is True, rep
    assert rep["traffic"]["drain_s"] is not None and rep["traffic"]["out_of_rotation_s"] > 0, rep["traffic"]
    assert doc["traffic"]["zero_worker_windows"] == 0
    assert client.failed == [], client.failed[:5]
    assert healthy(dl) == {n: True for n in dl["names"]}


def test_ctrl_c_during_a_deploys_drain_puts_the_worker_back_and_the_old_engine_serves(dl):
    host = dl["names"][0]
    pid = remote(dl, host, f"systemctl show -p MainPID --value {UNIT}")
    got = []

    def stream():  # 200 tokens at 20/s: 10 s in flight on the host's engine itself (the stand-in answers 256 at most)
        c = http.client.HTTPConnection("127.0.0.1", int(dl["urls"][host].rsplit(":", 1)[1]), timeout=60)
        c.request(
            "POST",
            "/generate",
            body=json.dumps({"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 200}}),
            headers=JSON,
        )
        got.append(c.getresponse().read())

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    time.sleep(0.5)
    inv = inventory(dl, "interrupted", env={"K26OPS_STANDIN_TTFT_MS": "3"})
    p = subprocess.Popen(
        [sys.executable, "-m", "k26ops", "-v", "-i", inv, "--limit", host, "deploy"],
        cwd=REPO,
        env={**os.environ, **dl["env"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    for line in p.stderr:
        seen.append(line)
        if "draining, 1 request in flight" in line:
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=120)
    err = "".join(seen) + err
    assert p.returncode == 130, (p.returncode, out, err[-3000:])
    assert "put back in rotation" in err and "keeps serving" in err, err[-2000:]
    assert healthy(dl)[host] is True
    assert remote(dl, host, f"systemctl show -p MainPID --value {UNIT}") == pid  # never signalled
    t.join(60)
    assert got and tokens(got[0], True) == 200  # the stream in flight ended whole
