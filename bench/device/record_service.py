#!/usr/bin/env python3
"""Record, on the lent GPU, what the real engine does around a restart (device only).

Run by bench/device/service_record.sh with the machine's python3 (stdlib only; the
engine runs on the release venv's python). It writes one JSON of timelines to OUT:

- cold:   a start with an empty engine cache dir: the phases (process start, the engine's
          own "Engine startup timings" line, /health 200, first greedy answer, first
          sampled answer) and how many files the start and each first request added
          to the cache dir;
- drain:  with a long streamed /generate in flight, SIGTERM to the engine's process
          group (what `systemctl stop` does under KillMode=mixed/control-group): every
          health code, /metrics' num_running_reqs, new requests sent during the drain
          and what they got, the stream's end, the exit time and status;
- warm:   the same command line again with the same cache dir;
- gateway: sglang-router in front of the warm engine: registration (POST /workers),
          removal during a stream (DELETE /workers/{id}), a request through the gateway
          with no worker, re-registration, then SIGTERM of the engine while the gateway
          still routes to it.
Nothing here is a k26ops code path; k26ops' lab stand-in and drain logic are checked
against what this records.
"""

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

T0 = time.monotonic()


def now():
    return round(time.monotonic() - T0, 3)


def log(msg):
    print(f"[{now():8.2f}] {msg}", flush=True)


def req(port, method, path, body=None, timeout=5.0):
    """(status or an error word, body text[:300], seconds)."""
    t = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        text = r.read().decode(errors="replace")
        c.close()
        return r.status, text[:300], round(time.monotonic() - t, 3)
    except ConnectionRefusedError:
        return "refused", "", round(time.monotonic() - t, 3)
    except (TimeoutError, OSError, http.client.HTTPException) as e:
        return type(e).__name__, str(e)[:200], round(time.monotonic() - t, 3)


def gen_body(temperature, max_new_tokens, stream=False, text="def main():\n    return"):
    return {
        "text": text,
        "stream": stream,
        "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    }


class Stream(threading.Thread):
    """A streamed /generate; records chunk times, the end and how it ended."""

    def __init__(self, port, max_new_tokens, path="/generate"):
        super().__init__(daemon=True)
        self.port, self.n, self.path = port, max_new_tokens, path
        self.chunks, self.first, self.last, self.end, self.status, self.done_marker = 0, None, None, None, None, False
        self.error, self.meta, self.started = None, None, now()

    def run(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            c.request(
                "POST",
                self.path,
                body=json.dumps(gen_body(0, self.n, True)).encode(),
                headers={"Content-Type": "application/json"},
            )
            r = c.getresponse()
            self.status = r.status
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done_marker = True
                    continue
                self.chunks += 1
                self.last = now()
                self.first = self.first or self.last
                try:
                    d = json.loads(payload)
                    self.meta = {k: d.get("meta_info", {}).get(k) for k in ("completion_tokens", "finish_reason")}
                except ValueError:
                    pass
        except Exception as e:  # recorded, not raised: the recording is the point
            self.error = f"{type(e).__name__}: {e}"[:200]
        self.end = now()

    def record(self):
        return {
            "started": self.started,
            "status": self.status,
            "chunks": self.chunks,
            "first_chunk": self.first,
            "last_chunk": self.last,
            "end": self.end,
            "done_marker": self.done_marker,
            "error": self.error,
            "final_meta": self.meta,
        }


def running_reqs(port):
    code, text, _ = req(port, "GET", "/metrics", timeout=2)
    if code != 200:
        return None
    full = req_full(port, "/metrics")
    m = re.findall(r"^sglang:num_running_reqs\{[^}]*\} ([0-9.e+-]+)$", full, re.M)
    return float(m[0]) if m else None


def req_full(port, path):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        c.request("GET", path)
        return c.getresponse().read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return ""


def cache_count(d):
    files = [p for p in Path(d).rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


STARTUP = re.compile(r"Engine startup timings \(s\): (.*)$")


def startup_line(logfile):
    for line in Path(logfile).read_text(errors="replace").splitlines():
        m = STARTUP.search(line)
        if m:
            return m.group(1)
    return None


def log_marks(logfile, t_start_wall):
    """Wall-clock marks of the engine's log lines we phase on, as seconds after start."""
    marks = {}
    pats = {
        "weights_loaded": "Load weight end",
        "uvicorn_running": "Uvicorn running",
        "fired_up": "fired up and ready to roll",
        "sigterm_logged": "SIGTERM",
        "draining_logged": "Drain",
    }
    for line in Path(logfile).read_text(errors="replace").splitlines():
        m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line)
        if not m:
            continue
        ts = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
        for k, p in pats.items():
            if p in line and k not in marks:
                marks[k] = round(ts - t_start_wall, 1)
    return marks


def start_engine(py, args, logfile, env):
    f = open(logfile, "w")
    p = subprocess.Popen(
        [py, "-m", "sglang.launch_server", *args], stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    return p


def wait_health(port, proc, timeout):
    seen, t = [], time.monotonic()
    while time.monotonic() - t < timeout:
        code, _, _ = req(port, "GET", "/health", timeout=5)
        if not seen or seen[-1][1] != code:
            seen.append((round(time.monotonic() - t, 2), code))
        if code == 200:
            return round(time.monotonic() - t, 2), seen
        if proc.poll() is not None:
            return None, seen + [(round(time.monotonic() - t, 2), f"exited {proc.returncode}")]
        time.sleep(0.5)
    return None, seen


def start_phase(name, a, env, sampled_after=True):
    before = cache_count(a.cache)
    logfile = f"{a.out}/engine-{name}.log"
    wall0, t = time.time(), time.monotonic()
    proc = start_engine(a.py, a.engine_args, logfile, env)
    log(f"{name}: engine pid {proc.pid} started")
    ready, codes = wait_health(a.port, proc, a.ready_timeout)
    rec = {"phase": name, "cache_before": before, "health_codes": codes, "ready_s": ready}
    log(f"{name}: ready {ready} s")
    if ready is None:
        rec["log_tail"] = Path(logfile).read_text(errors="replace")[-3000:]
        return rec, proc
    at_ready = cache_count(a.cache)
    code, text, secs = req(a.port, "POST", "/generate", gen_body(0, 32), timeout=600)
    rec["first_greedy"] = {"status": code, "seconds": secs, "meta": text[-200:]}
    after_greedy = cache_count(a.cache)
    log(f"{name}: first greedy {code} in {secs} s")
    if sampled_after:
        code, text, secs = req(a.port, "POST", "/generate", gen_body(0.7, 32), timeout=600)
        rec["first_sampled"] = {"status": code, "seconds": secs}
        log(f"{name}: first sampled {code} in {secs} s")
        code, text, secs = req(a.port, "POST", "/generate", gen_body(0.7, 32), timeout=600)
        rec["second_sampled"] = {"status": code, "seconds": secs}
    rec.update(
        cache_at_ready=at_ready,
        cache_after_greedy=after_greedy,
        cache_after_sampled=cache_count(a.cache),
        engine_startup_timings=startup_line(logfile),
        log_marks=log_marks(logfile, wall0),
        since_start_s=round(time.monotonic() - t, 2),
    )
    return rec, proc


def drain(a, proc, port, via=None, tag="drain"):
    """SIGTERM the engine's process group with a long stream in flight; poll until exit."""
    target = via or port
    s = Stream(target, a.stream_tokens)
    s.start()
    while s.chunks < 5 and s.end is None:
        time.sleep(0.05)
    time.sleep(2.0)
    rec = {
        "stream_port": target,
        "engine_port": port,
        "chunks_before_sigterm": s.chunks,
        "sigterm_to": "process group" if a.signal_group else "main process",
    }
    t_term = now()
    if a.signal_group:  # systemd's KillMode=control-group: every process of the engine gets SIGTERM
        os.killpg(proc.pid, signal.SIGTERM)
    else:  # KillMode=mixed (the unit k26ops renders): SIGTERM to the main process only
        os.kill(proc.pid, signal.SIGTERM)
    log(f"{tag}: SIGTERM sent ({s.chunks} chunks in)")
    polls, news, sent = [], [], set()
    while proc.poll() is None and now() - t_term < a.drain_watch:
        dt = round(now() - t_term, 2)
        row = {"t": dt}
        for path in ("/health", "/health_generate", "/ready"):
            row[path] = req(port, "GET", path, timeout=3)[0]
        row["num_running_reqs"] = running_reqs(port)
        if via:
            row["gateway_/readiness"] = req(via, "GET", "/readiness", timeout=3)[0]
        row["stream_chunks"] = s.chunks
        polls.append(row)
        for at in (1.0, 4.0):
            if dt >= at and at not in sent:
                sent.add(at)
                code, text, secs = req(target, "POST", "/generate", gen_body(0, 16), timeout=120)
                news.append({"sent_at": dt, "status": code, "seconds": secs, "body": text[:160]})
        time.sleep(0.3)
    exit_t = round(now() - t_term, 2)
    rc = proc.poll()
    if rc is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    s.join(timeout=30)
    rec.update(
        sigterm_at=t_term,
        exit_after_s=exit_t,
        returncode=rc,
        killed_by_us=rc is None,
        polls=polls,
        new_requests_during_drain=news,
        stream=s.record(),
    )
    log(f"{tag}: exit after {exit_t} s rc {rc}; stream {s.record()}")
    return rec


def gateway(a, env, proc):
    gport = a.port + 80
    glog = open(f"{a.out}/router.log", "w")
    helpf = f"{a.out}/router-help.txt"
    with open(helpf, "w") as hf:
        subprocess.run(
            [a.py, "-m", "sglang_router.launch_router", "--help"],
            stdout=hf,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=60,
        )
    g = subprocess.Popen(
        [a.py, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(gport)],
        stdout=glog,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    rec, t = {"port": gport}, time.monotonic()
    while time.monotonic() - t < 60 and req(gport, "GET", "/health", timeout=2)[0] != 200:
        time.sleep(0.3)
    rec["router_up_s"] = round(time.monotonic() - t, 2)
    rec["readiness_empty"] = req(gport, "GET", "/readiness")[:2]
    rec["generate_no_worker"] = req(gport, "POST", "/generate", gen_body(0, 8))[:2]
    url = f"http://127.0.0.1:{a.port}"
    t = time.monotonic()
    rec["post_workers"] = req(gport, "POST", "/workers", {"url": url})[:2]
    healthy = None
    while time.monotonic() - t < 120:
        code, text, _ = req(gport, "GET", "/workers")
        if code == 200 and '"is_healthy":true' in text.replace(" ", ""):
            healthy = round(time.monotonic() - t, 2)
            break
        time.sleep(0.3)
    rec["registered_healthy_s"] = healthy
    rec["workers_after_register"] = req(gport, "GET", "/workers")[:2]
    rec["readiness_one"] = req(gport, "GET", "/readiness")[:2]
    rec["get_loads"] = req(gport, "GET", "/get_loads")[:2]
    rec["through_gateway"] = req(gport, "POST", "/generate", gen_body(0, 8), timeout=60)[:2]
    # removal during a stream through the gateway
    s = Stream(gport, a.stream_tokens // 2)
    s.start()
    while s.chunks < 5 and s.end is None:
        time.sleep(0.05)
    workers = json.loads(req_full(gport, "/workers") or "{}").get("workers", [])
    wid = workers[0].get("id") or workers[0].get("worker_id") if workers else None
    t_del = now()
    rec["delete"] = {"worker_id": wid, "answer": req(gport, "DELETE", f"/workers/{wid}")[:2], "at_chunks": s.chunks}
    after = []
    for i in range(12):
        after.append(
            {
                "t": round(now() - t_del, 2),
                "workers": req(gport, "GET", "/workers")[1][:160],
                "readiness": req(gport, "GET", "/readiness")[0],
                "generate": req(gport, "POST", "/generate", gen_body(0, 8), timeout=30)[:2] if i in (2, 8) else None,
                "stream_chunks": s.chunks,
            }
        )
        time.sleep(0.5)
    s.join(timeout=300)
    rec["after_delete"], rec["stream_during_delete"] = after, s.record()
    # back in, then the plain mode: SIGTERM the engine while the gateway still routes to it
    t = time.monotonic()
    rec["post_again"] = req(gport, "POST", "/workers", {"url": url})[:2]
    while time.monotonic() - t < 120:
        code, text, _ = req(gport, "GET", "/workers")
        if '"is_healthy":true' in text.replace(" ", ""):
            break
        time.sleep(0.3)
    rec["re_registered_s"] = round(time.monotonic() - t, 2)
    rec["sigterm_behind_gateway"] = drain(a, proc, a.port, via=gport, tag="gateway-drain")
    rec["workers_after_engine_exit"] = req(gport, "GET", "/workers")[:2]
    time.sleep(3)
    rec["generate_after_engine_exit"] = req(gport, "POST", "/generate", gen_body(0, 8), timeout=30)[:2]
    os.killpg(g.pid, signal.SIGTERM)
    g.wait(timeout=30)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--py", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--ready-timeout", type=float, default=400)
    ap.add_argument("--stream-tokens", type=int, default=3800)
    ap.add_argument("--drain-watch", type=float, default=90)
    ap.add_argument("--skip", default="")
    ap.add_argument(
        "--signal-group",
        action="store_true",
        help="SIGTERM the whole process group (KillMode=control-group), not the main process",
    )
    ap.add_argument("engine_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    a.engine_args = [x for x in a.engine_args if x != "--"]
    env = dict(os.environ)
    res = {"engine_args": a.engine_args}
    outf = Path(a.out) / "service-record.json"

    def save():
        outf.write_text(json.dumps(res, indent=1) + "\n")

    res["cold"], proc = start_phase("cold", a, env)
    save()
    metrics = req_full(a.port, "/metrics")
    Path(a.out, "metrics-full.txt").write_text(metrics)
    if proc.poll() is None:
        res["drain"] = drain(a, proc, a.port)
        save()
    res["warm"], proc = start_phase("warm", a, env)
    save()
    if proc.poll() is None and "gateway" not in a.skip:
        try:
            res["gateway"] = gateway(a, env, proc)
        except Exception as e:
            res["gateway_error"] = f"{type(e).__name__}: {e}"
    save()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    log("done")


if __name__ == "__main__":
    main()
