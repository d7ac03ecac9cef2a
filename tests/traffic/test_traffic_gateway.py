"""The Model Gateway client and the drain against the REAL sglang-router 0.3.2 (PyPI), run on
loopback in front of the lab's engine stand-in (k26ops/lab/fixtures/engine_standin.py) started
as local processes; the drain's in-flight reads run through the real engine agent on a
`connection: local` session. No lab host: seconds, not minutes.

What is checked: the worker API as 0.3.2 answers it (202 + worker_id + location, 401 without
the admin key, DELETE, GET /workers/{id} 404 once gone, /readiness), the admin key never in a
message, the last healthy worker never removed (one-line refusal, the worker stays), min_serving,
the drain waiting for a stream in flight and counting it, and Ctrl-C during a drain putting the
worker back with the engine never signalled."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from k26ops import interrupt
from k26ops.errors import Interrupted, StepFailed, UserError
from k26ops.inventory.model import Host
from k26ops.traffic.drain import Drain, TrafficConfig
from k26ops.traffic.gateway import Gateway, GatewayError, Watch
from k26ops.transport.ssh import LocalSession
from labtools.labs import sglang_router
from labtools.ports import free_port

STANDIN = Path(__file__).resolve().parent.parent.parent / "k26ops/lab/fixtures/engine_standin.py"
pytest.importorskip("sglang_router")


def wait_http(port: int, path: str, want: int = 200, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == want:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"127.0.0.1:{port}{path} did not answer {want}")


class Proc:
    def __init__(self, argv, env=None, log=None):
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.p = subprocess.Popen(
            argv, env={**os.environ, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(10)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    with sglang_router(tmp_path_factory.mktemp("router")) as r:
        yield r


def standin(tmp_path: Path, name: str, **env) -> tuple[Proc, int]:
    port = free_port()
    p = Proc(
        [
            sys.executable,
            str(STANDIN),
            "--model-path",
            "/models/m",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--enable-metrics",
        ],
        env={"K26OPS_STANDIN_LOAD_SECONDS": "0", "K26OPS_STANDIN_DRAIN_POLL_S": "0.5", **env},
        log=tmp_path / f"{name}.log",
    )
    wait_http(port, "/health")
    return p, port


def stream(port: int, tokens: int, out: list) -> None:
    """One streamed /generate straight to an engine; appends (completion_tokens, [DONE] seen)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(
        "POST",
        "/generate",
        body=json.dumps({"text": "x", "stream": True, "sampling_params": {"max_new_tokens": tokens}}),
    )
    last, done = None, False
    for line in c.getresponse():
        if line.strip() == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: "):
            last = json.loads(line[6:])
    out.append((((last or {}).get("meta_info") or {}).get("completion_tokens"), done))


@pytest.fixture
def engines(router, tmp_path):
    """Two stand-ins registered and healthy at the gateway; removed and stopped after."""
    gw = Gateway(router["url"], router["key"])
    procs = [standin(tmp_path, f"e{i}", K26OPS_STANDIN_DECODE_TOKS="20") for i in range(2)]
    urls = [f"http://127.0.0.1:{port}" for _p, port in procs]
    for u in urls:
        gw.add(u)
        assert gw.wait_healthy(u, 30), u
    yield gw, procs, urls
    for w in gw.workers():
        gw.remove(w.id)
    for p, _port in procs:
        p.stop()


def host(name: str, port: int, **v) -> Host:
    return Host(name=name, address="127.0.0.1", connection="local", vars={"engine_port": port, **v})


def drain_for(router, name: str, port: int, progress=lambda m: None, **v) -> Drain:
    h = host(name, port, model_gateway=router["url"], model_gateway_api_key=router["key"], **v)
    return Drain(TrafficConfig.of(h), name, LocalSession(h), engine_port=port, progress=progress)


def test_worker_api_as_0_3_2_answers(router, tmp_path):
    p, port = standin(tmp_path, "api")
    try:
        url = f"http://127.0.0.1:{port}"
        anon = Gateway(router["url"])
        with pytest.raises(GatewayError, match="401 Unauthorized") as exc:
            anon.add(url)
        gw = Gateway(router["url"], router["key"])
        wrong = Gateway(router["url"], "not-the-key")
        with pytest.raises(GatewayError) as bad:
            wrong.workers()
        for e in (exc.value, bad.value):
            assert router["key"] not in str(e) and "not-the-key" not in str(e)
        assert router["key"] not in repr(gw)
        wid, location = gw.add(url)
        assert wid and location == f"/workers/{wid}"
        w = gw.wait_healthy(url, 30)
        assert w is not None and w.id == wid and w.url == url
        assert gw.worker(wid).healthy and gw.readiness()["ready"] is True
        assert url in gw.loads()
        assert gw.remove(wid) is True
        assert gw.wait_gone(wid, 10) and gw.find(url) is None and gw.worker(wid) is None
        assert gw.remove(wid) is False  # 404: already gone
        assert gw.readiness()["ready"] is False  # 503 with no healthy worker: an answer, not an error
    finally:
        p.stop()


def test_the_last_healthy_worker_is_never_removed(router, tmp_path):
    gw = Gateway(router["url"], router["key"])
    p, port = standin(tmp_path, "only")
    url = f"http://127.0.0.1:{port}"
    try:
        gw.add(url)
        assert gw.wait_healthy(url, 30)
        d = drain_for(router, "only", port)
        with pytest.raises(StepFailed) as exc:
            d.take_out()
        msg = str(exc.value)
        assert "\n" not in msg and "min_serving 1" in msg and "would keep 0 healthy" in msg, msg
        assert gw.find(url) is not None and gw.find(url).healthy  # still in rotation
        assert p.p.poll() is None  # and never signalled
    finally:
        for w in gw.workers():
            gw.remove(w.id)
        p.stop()


def test_min_serving_counts_the_other_healthy_workers(engines, router):
    gw, procs, urls = engines
    port = procs[0][1]
    with pytest.raises(StepFailed, match="min_serving 2"):
        drain_for(router, "e0", port, min_serving=2).take_out()
    assert gw.find(urls[0]) is not None
    d = drain_for(router, "e0", port, min_serving=1)
    d.take_out()
    assert gw.find(urls[0]) is None and d.out
    d.put_back()
    assert gw.find(urls[0]).healthy and d.record["put_back"] is True
    assert d.record["out_of_rotation_s"] is not None


def test_the_drain_waits_for_the_stream_in_flight_and_counts_it(engines, router):
    gw, procs, urls = engines
    port = procs[0][1]
    got, lines = [], []
    t = threading.Thread(target=stream, args=(port, 40, got))  # 2 s at 20 tokens/s
    t.start()
    time.sleep(0.4)
    d = drain_for(router, "e0", port, progress=lines.append)
    with Watch([gw], interval=0.2) as watch:
        t0 = time.monotonic()
        d.take_out()
        waited = time.monotonic() - t0
        t.join(30)
        d.put_back()
    assert got == [(40, True)]  # the stream ended whole
    assert d.record["requests"] == 1 and d.record["left"] == 0, d.record
    assert 1.0 < waited < 10 and d.record["drain_s"] >= 1.0, (waited, d.record)
    assert any(ln.startswith("draining, 1 request in flight, ") for ln in lines), lines
    assert watch.report()["zero_worker_windows"] == 0 and watch.report()["gateways"][gw.name]["min_healthy"] >= 1


def test_ctrl_c_during_the_drain_puts_the_worker_back_and_the_engine_keeps_serving(engines, router):
    gw, procs, urls = engines
    proc, port = procs[0]
    got = []
    t = threading.Thread(target=stream, args=(port, 100, got))  # 5 s
    t.start()
    time.sleep(0.4)
    lines = []
    d = drain_for(router, "e0", port, progress=lines.append)
    timer = threading.Timer(1.5, interrupt.requested.set)
    timer.start()
    try:
        with pytest.raises(Interrupted) as exc:
            d.take_out()
    finally:
        timer.cancel()
        interrupt.requested.clear()
    msg = str(exc.value)
    assert "put back in rotation" in msg and "keeps serving" in msg, msg
    w = gw.find(urls[0])
    assert w is not None and w.healthy  # back in rotation
    assert proc.p.poll() is None  # never signalled
    t.join(30)
    assert got == [(100, True)]


def test_traffic_config_errors_are_one_line_naming_host_and_variable():
    bad = [
        ({"model_gateway": "ftp://x"}, "model_gateway"),
        ({"model_gateway": 7}, "model_gateway"),
        ({"drain": "sometimes"}, "drain"),
        ({"drain": "gateway"}, "model_gateway"),
        ({"drain_timeout": -1}, "drain_timeout"),
        ({"drain_timeout": "5m"}, "drain_timeout"),
        ({"min_serving": 0}, "min_serving"),
        ({"min_serving": 1.5}, "min_serving"),
        ({"drain_hook": "unterminated 'quote"}, "drain_hook"),
        ({"drain": "hook"}, "drain_hook"),
        ({"model_gateway": "http://u:pw@gw:1", "worker_url": "nope"}, "worker_url"),
    ]
    for v, name in bad:
        with pytest.raises(UserError) as exc:
            TrafficConfig.of(host("lab1", 30000, **v))
        msg = str(exc.value)
        assert msg.startswith("lab1: ") and name in msg and "\n" not in msg and "pw" not in msg, (v, msg)


def test_modes_defaults_and_the_stop_timeout_is_larger_than_the_drain():
    none = TrafficConfig.of(host("h", 30001))
    assert none.mode == "none" and not none.configured and none.timeout_stop_sec() is None
    g = TrafficConfig.of(host("h", 30001, model_gateway=["http://gw:1/", "http://gw:1"]))
    assert g.mode == "gateway" and g.gateways == ("http://gw:1",) and g.worker_url == "http://127.0.0.1:30001"
    assert g.drain_timeout == 300 and g.drain_timeout_from == "default" and g.min_serving == 1
    assert g.timeout_stop_sec() > g.drain_timeout
    assert TrafficConfig.of(host("h", 1, drain_hook="/bin/true --x")).hook == ("/bin/true", "--x")
    p = TrafficConfig.of(host("h", 1, drain="plain", drain_timeout=900))
    assert p.mode == "plain" and p.timeout_stop_sec() > 900
    b = TrafficConfig.of(host("h", 1, model_gateway="http://gw:1"), bench_p99=(42.5, "tag v1"))
    assert b.drain_timeout == 42.5 and "tag v1" in b.drain_timeout_from


def test_a_worker_is_put_back_only_after_its_own_smoke_request_answers(router, tmp_path):
    """reboot, diagnose cuda-graph and rehearse --stop-serving (drain.back_when_healthy and the
    restores) run the smoke request on the worker itself before putting it back."""
    from k26ops.traffic.drain import smoke_before_put_back

    bad, bad_port = standin(tmp_path, "bad", K26OPS_STANDIN_REQUEST_ERROR="500")  # /health 200, /generate 500
    good, good_port = standin(tmp_path, "good")
    try:
        lines = []
        d = drain_for(router, "bad", bad_port, progress=lines.append)
        with pytest.raises(StepFailed) as exc:
            smoke_before_put_back(d, d.session, None)
        assert str(exc.value) == (
            "the engine answers /health but not its smoke request (HTTP 500): left out of rotation"
        ), exc.value
        g = drain_for(router, "good", good_port, progress=lines.append)
        smoke_before_put_back(g, g.session, None)
        assert lines == ["smoke before putting it back: failed", "smoke before putting it back: answered"]
    finally:
        bad.stop()
        good.stop()


def test_a_drain_hook_runs_out_before_and_in_after_and_a_failing_one_stops_nothing(tmp_path):
    """drain_hook (HAProxy, nginx, Envoy users): run on the control node without a shell, with
    K26OPS_DRAIN=out before the stop and =in after; the in-flight wait between is the same."""
    log, fail = tmp_path / "hook.log", tmp_path / "fail"
    hook = tmp_path / "lb-drain"
    hook.write_text(
        f'#!/bin/sh\necho "$K26OPS_DRAIN $K26OPS_HOST $K26OPS_WORKER_URL $#" >> {log}\n'
        f'if [ -e {fail} ]; then echo "lb: no such backend" >&2; exit 3; fi\n'
    )
    hook.chmod(0o755)
    p, port = standin(tmp_path, "hooked", K26OPS_STANDIN_DECODE_TOKS="20")
    try:
        h = host("h1", port, drain_hook=f"{hook} 'two words'")
        got = []
        t = threading.Thread(target=stream, args=(port, 30, got))  # 1.5 s in flight
        t.start()
        time.sleep(0.4)
        d = Drain(TrafficConfig.of(h), "h1", LocalSession(h), engine_port=port)
        d.take_out()
        assert log.read_text() == f"out h1 http://127.0.0.1:{port} 1\n"
        assert d.record["requests"] == 1 and d.record["left"] == 0 and d.record["drain_s"] >= 0.5, d.record
        t.join(30)
        d.put_back()
        assert log.read_text().splitlines()[-1] == f"in h1 http://127.0.0.1:{port} 1"
        assert d.record["put_back"] is True and d.record["out_of_rotation_s"] is not None
        fail.touch()
        with pytest.raises(StepFailed) as exc:
            Drain(TrafficConfig.of(h), "h1", LocalSession(h), engine_port=port).take_out()
        assert str(exc.value) == (
            f"drain: drain_hook (out) {hook} exited 3: lb: no such backend; nothing was "
            "taken out of rotation; the engine was not stopped"
        )
        assert p.p.poll() is None and got == [(30, True)]
    finally:
        p.stop()
