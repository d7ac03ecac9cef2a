"""What k26ops believes about an engine's stop, against the real engine's recording
(tests/data/drain: sglang 0.5.17 on the lent H100, bench/device/service_record.sh; the
MANIFEST says how). The lab's engine stand-in is started as a local process and stopped the
way systemd stops the unit (SIGTERM to the main process: KillMode=mixed); it must drain as the
recording shows. No lab host: seconds."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from k26ops.engine import units
from labtools.ports import free_port

DATA = Path(__file__).resolve().parent.parent / "data" / "drain"
STANDIN = Path(__file__).resolve().parent.parent.parent / "k26ops/lab/fixtures/engine_standin.py"
MAIN = json.loads((DATA / "sigterm-main-h100.json").read_text())
GROUP = json.loads((DATA / "sigterm-group-h100.json").read_text())
# the drain's own lines in the real log, in order (numbers and pids made patterns)
DRAIN_LINES = (
    "SIGTERM received",
    "Health check request received during shutdown",
    "Gracefully exiting",
    "kill_process_tree called",
)


def _drain_lines(text: str) -> list[str]:
    """The drain's lines of a log, time stamps cut, in order, each kind once (repeats dropped)."""
    seen, out = set(), []
    for line in text.splitlines():
        body = re.sub(r"^\[[^\]]*\]\s*", "", line)
        kind = next((k for k in DRAIN_LINES if body.startswith(k)), None)
        if kind and kind not in seen:
            seen.add(kind)
            out.append(body)
    return out


def _pattern(real_line: str) -> re.Pattern:
    """A recorded line as a pattern: numbers, pids, rid lists and frames may differ."""
    p = re.escape(real_line)
    p = re.sub(r"\d+", r"\\d+", p)
    p = p.replace(r"signum=None\ frame=None", r"signum=\S+\ frame=.*")
    p = re.sub(r"remaining_rids=\\\[.*?\\\]", r"remaining_rids=\\[.*?\\]", p)
    return re.compile(p)


def test_the_recording_says_what_the_drain_design_rests_on():
    """Read from the real engine: a SIGTERM to the main process drains (health 503 at once, the
    in-flight stream completes, NEW requests are still accepted: the router must stop sending
    first), then the process ends by its own SIGKILL. A SIGTERM to the whole process group
    (KillMode=control-group) kills the scheduler and cuts the stream."""
    assert MAIN["drain"]["sigterm_to"] == "main process"
    s = MAIN["drain"]["stream"]
    assert s["done_marker"] and s["final_meta"]["completion_tokens"] == 3800
    serving = [p for p in MAIN["drain"]["polls"] if p["num_running_reqs"] == 1.0]  # before the exit began
    assert len(serving) > 10 and {p["/health"] for p in serving} == {p["/health_generate"] for p in serving} == {503}
    assert [n["status"] for n in MAIN["drain"]["new_requests_during_drain"]] == [200, 200]
    assert MAIN["drain"]["returncode"] == -9 and not MAIN["drain"]["killed_by_us"]
    g = GROUP["drain"]
    assert not g["stream"]["done_marker"] and g["stream"]["final_meta"]["finish_reason"] is None
    assert "scheduler_0" in (DATA / "engine-group-sigterm-h100.log").read_text()


def test_the_unit_signals_only_the_main_process():
    """KillMode=mixed: systemd's SIGTERM reaches the launcher only (the recorded drain); the
    default control-group would SIGTERM the scheduler too (the recorded cut stream)."""
    text = units.render_unit(
        {"profile": {"model_path": "/models/m", "tp": 8}, "release_id": "r", "env_file": "/etc/k26ops/sglang.env"}
    )
    assert "KillMode=mixed" in text.splitlines()


def _get(port: int, path: str) -> int | str:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        c.request("GET", path)
        return c.getresponse().status
    except OSError as exc:
        return type(exc).__name__


def _generate(port: int, tokens: int, stream: bool = False) -> tuple[int, dict | None, bool]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(
        "POST",
        "/generate",
        body=json.dumps({"text": "x", "stream": stream, "sampling_params": {"max_new_tokens": tokens}}),
    )
    r = c.getresponse()
    if not stream:
        return r.status, json.loads(r.read() or b"null"), False
    last, done = None, False
    for line in r:
        if line.strip() == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: "):
            last = json.loads(line[6:])
    return r.status, last, done


def test_the_stand_in_drains_as_the_real_engine_did(tmp_path):
    port = free_port()
    log = tmp_path / "engine.log"
    with open(log, "w") as out:
        p = subprocess.Popen(
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
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "K26OPS_STANDIN_LOAD_SECONDS": "0",
                "K26OPS_STANDIN_DRAIN_POLL_S": "0.3",
                "K26OPS_STANDIN_DECODE_TOKS": "100",
            },
            start_new_session=True,
        )
    try:
        end = time.monotonic() + 30
        while _get(port, "/health") != 200:
            assert time.monotonic() < end and p.poll() is None, log.read_text()
            time.sleep(0.1)
        got: list = []
        t = threading.Thread(target=lambda: got.append(_generate(port, 200, stream=True)))
        t.start()
        time.sleep(0.5)
        os.kill(p.pid, signal.SIGTERM)  # what systemd sends with KillMode=mixed
        time.sleep(0.3)
        health = {_get(port, "/health"), _get(port, "/health_generate")}
        new_status, _body, _ = _generate(port, 4)  # accepted while draining, as recorded
        t.join(60)
        rc = p.wait(30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert health == {503}
    assert new_status == 200
    status, last, done = got[0]
    assert status == 200 and done and last["meta_info"]["completion_tokens"] == 200  # the stream completed
    assert rc == MAIN["drain"]["returncode"] == -9  # ends by its own SIGKILL, as the launcher does
    real = _drain_lines((DATA / "engine-cold-then-drain-h100.log").read_text())
    mine = _drain_lines(log.read_text())
    assert [k for k in DRAIN_LINES if any(r.startswith(k) for r in real)] == list(DRAIN_LINES)
    for r in real:
        kind = next(k for k in DRAIN_LINES if r.startswith(k))
        if kind.startswith("Health check"):
            continue  # the stand-in answers 503 without a log line per probe
        ours = [m for m in mine if m.startswith(kind)]
        assert ours and _pattern(r).fullmatch(ours[0]), (r, ours)
