"""Host agent of the engine bench (k26ops/enginebench/): run through
agents.run like every agent (stdlib only).

op "probe": can the release's venv run SGLang's serving benchmark
  (`python -m sglang.benchmark.serving`, before 0.5.23 `sglang.bench_serving`)?
op "bench_serving": run it for one (concurrency, temperature) cell, read its JSONL.
op "metrics": the engine's /metrics as served (status and text; `k26ops monitoring --verify`).
op "loadgen": k26ops' own closed-loop load generator for the same cell, for
releases that cannot run bench_serving (the lab's has no torch). It measures
with bench_serving's definitions (backend `sglang`, streaming /generate):
  TTFT      arrival of the first chunk with text, from the request's start
  ITL       per chunk: gap since the previous chunk / new tokens, counted once per token
  tok/s     sum(completion_tokens) / wall time of the whole run (warmup excluded)
  req/s     completed requests / the same wall time
  p50/p99   median and 99th percentile with linear interpolation (numpy's default)
  accept    mean meta_info.spec_accept_length over requests, else /server_info's
            internal_states[0].avg_spec_accept_length
  accept_histogram  meta_info.spec_accept_histogram summed over requests: [n] = verify
            steps that accepted exactly n draft tokens (tokenizer_manager.py); None without it
Accept figures of op "bench_serving" are per cell: bench_serving's own `accept_length`
is /server_info internal_states[0].avg_spec_accept_length, counted since the engine
started (sglang 0.5.23 managers/scheduler_components/internal_state.py
_average_accept_length: spec_total_num_accept_tokens / spec_total_num_forward_ct,
"# lifetime" in metrics_reporter.py), so it mixes every earlier cell in. The cell's
own figure is the difference of the engine's cumulative Prometheus counters
(/metrics, served with --enable-metrics; observability/metrics_collector.py
observe_one_finished_request: sglang:generation_tokens_total and
sglang:spec_verify_calls_total, both counted as each request finishes) read right
before and right after the cell: accepted tokens per verify step, the same ratio as
per-request meta_info.spec_accept_length (tokenizer_manager.py: completion_tokens /
spec_verify_ct). Without /metrics the lifetime figure is kept and `accept_source`
says it is one.
"""

import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

WORDS = (
    "the of and to in is was for on are as with his they at be this from have or by one had not but what "
    "all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first"
).split()


def percentile(values, q):
    """numpy.percentile(values, q) with its default linear interpolation."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def metrics(outputs, duration_s, server_accept=None):
    """bench_serving's figures from per-request outputs (dicts: ok, ttft, itl, latency, output_len, accept)."""
    ok = [o for o in outputs if o["ok"]]
    ttfts = [o["ttft"] for o in ok]
    itls = [x for o in ok for x in o["itl"]]
    accepts = [o["accept"] for o in ok if o.get("accept") is not None]
    accept = sum(accepts) / len(accepts) if accepts else server_accept
    out_tokens = sum(o["output_len"] for o in ok)
    hist = []
    for o in ok:  # verify steps by draft tokens accepted, summed over the requests
        for i, n in enumerate(o.get("accept_histogram") or []):
            hist += [0] * (i + 1 - len(hist))
            hist[i] += n
    dur = max(duration_s, 1e-9)
    return {
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "duration_s": duration_s,
        "total_output_tokens": out_tokens,
        "output_throughput": out_tokens / dur,
        "request_throughput": len(ok) / dur,
        "median_ttft_ms": percentile(ttfts, 50) * 1000,
        "p99_ttft_ms": percentile(ttfts, 99) * 1000,
        "median_itl_ms": percentile(itls, 50) * 1000,
        "p99_itl_ms": percentile(itls, 99) * 1000,
        "p99_e2e_latency_ms": percentile([o["latency"] for o in ok], 99) * 1000,
        "accept_length": accept,
        "accept_source": "meta_info.spec_accept_length" if accepts else ("/server_info" if accept else None),
        "accept_histogram": hist or None,
    }


def prompt(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


# The engine's --api-key, when it has one (the request's "api_key"; never in an answer).
API_KEY = []


def auth():
    return {"Authorization": "Bearer " + API_KEY[0]} if API_KEY and API_KEY[0] else {}


def one_request(host, port, text, output_len, temperature, timeout):
    """One streaming /generate; timings as bench_serving's async_request_sglang_generate takes them.
    `text` may be a list of token ids (an engine started with --skip-tokenizer-init)."""
    body = json.dumps(
        {
            ("input_ids" if isinstance(text, list) else "text"): text,
            "stream": True,
            "sampling_params": {"temperature": temperature, "max_new_tokens": output_len, "ignore_eos": True},
        }
    ).encode()
    out = {"ok": False, "ttft": 0.0, "itl": [], "latency": 0.0, "output_len": 0, "accept": None, "error": ""}
    st = time.perf_counter()
    last_t, last_len = st, 0
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/generate", body=body, headers=dict(auth(), **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = "HTTP %d %s" % (resp.status, resp.read()[:200].decode(errors="replace"))
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            chunk = line.decode("utf-8", errors="replace")
            if chunk.startswith("data:"):
                chunk = chunk[5:].strip()
            now = time.perf_counter()
            out["latency"] = now - st
            if chunk == "[DONE]":
                break
            data = json.loads(chunk)
            if not data.get("text") and not data.get("output_ids"):
                continue
            meta = data.get("meta_info") or {}
            n = int(meta.get("completion_tokens") or 0)
            if meta.get("spec_accept_length") is not None:
                out["accept"] = float(meta["spec_accept_length"])
            if isinstance(meta.get("spec_accept_histogram"), list):  # the request's so far: the last one counts
                out["accept_histogram"] = [int(x) for x in meta["spec_accept_histogram"]]
            if out["ttft"] == 0.0:
                out["ttft"] = now - st
            else:
                new = n - last_len
                if new <= 0:
                    continue
                out["itl"].extend([(now - last_t) / new] * new)
            last_t, last_len = now, n
        out["output_len"] = last_len
        out["ok"] = last_len > 0
        if not out["ok"]:
            out["error"] = "no tokens streamed"
    except Exception as e:
        out["error"] = "%s: %s" % (e.__class__.__name__, e)
    finally:
        conn.close()
    return out


def server_accept(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        for path in ("/server_info", "/get_server_info"):
            conn.request("GET", path, headers=auth())
            resp = conn.getresponse()
            data = resp.read()
            if resp.status == 200:
                info = json.loads(data)
                if "decode" in info:
                    info = info["decode"][0]
                return (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")
    except Exception:
        return None
    finally:
        conn.close()
    return None


SPEC_COUNTERS = ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total")
LIFETIME = "/server_info lifetime (since engine start, not per cell)"
PER_CELL = "/metrics delta (sglang:generation_tokens_total / sglang:spec_verify_calls_total)"


def parse_counters(text):
    """{name: value summed over label sets} for SPEC_COUNTERS from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in SPEC_COUNTERS:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


def spec_counters(host, port):
    """The engine's cumulative (generation tokens, verify calls) from /metrics; None without them."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=auth())
        resp = conn.getresponse()
        data = resp.read().decode("utf-8", errors="replace")
        if resp.status != 200:
            return None
        c = parse_counters(data)
        return (c[SPEC_COUNTERS[0]], c.get(SPEC_COUNTERS[1], 0.0)) if SPEC_COUNTERS[0] in c else None
    except Exception:
        return None
    finally:
        conn.close()


def cell_accept(before, after):
    """Accepted tokens per verify step over one cell, from counters read around it; else None."""
    if not before or not after or after[1] - before[1] <= 0:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def op_loadgen(r):
    host, port, c, n = r["host"], r["port"], r["concurrency"], r["num_prompts"]
    rng = random.Random(r["seed"])
    if r.get("token_ids"):  # no tokenizer: random ids below the vocabulary, input_len of them
        hi = max(2, min(int(r["token_ids"].get("vocab") or 1000), 32000))
        prompts = [[rng.randrange(1, hi) for _ in range(max(1, r["input_len"]))] for _ in range(n)]
    else:
        prompts = [prompt(rng, r["input_len"]) for _ in range(n)]
    timeout = r.get("timeout_s", 600)
    warm = one_request(host, port, prompts[0], min(r["output_len"], 32), r["temperature"], timeout)
    if not warm["ok"]:
        return {"ok": False, "error": "warmup request failed: " + warm["error"]}
    outputs = [None] * n
    lock = threading.Lock()
    todo = list(range(n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            outputs[i] = one_request(host, port, prompts[i], r["output_len"], r["temperature"], timeout)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(c, n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dur = time.perf_counter() - t0
    m = metrics(outputs, dur, server_accept(host, port))
    errors = sorted({o["error"] for o in outputs if not o["ok"]})
    return {"ok": m["completed"] > 0, "metrics": m, "errors": errors[:3]}


def op_probe(r):
    """The release's own benchmark: sglang.benchmark.serving (0.5.23 and later;
    sglang.bench_serving is its deprecated alias there), else sglang.bench_serving."""
    py = r["python"]
    if not os.path.exists(py):
        return {"available": False, "why": "no release venv python at " + py}
    why = ""
    for module in ("sglang.benchmark.serving", "sglang.bench_serving"):
        try:
            p = subprocess.run(
                [py, "-W", "ignore", "-c", "import " + module],
                capture_output=True,
                text=True,
                timeout=r.get("timeout_s", 300),
            )
        except subprocess.TimeoutExpired:
            return {"available": False, "why": "importing %s timed out" % module}
        if p.returncode == 0:
            return {"available": True, "module": module, "why": module + " imports in " + py}
        lines = [l for l in (p.stderr or p.stdout).splitlines() if l.strip()]
        why = why or (lines[-1].strip()[:200] if lines else "exit %d" % p.returncode)
    return {"available": False, "why": "sglang.bench_serving does not import in the release venv: " + why}


def op_metrics(r):
    """GET /metrics with the engine's key; the text as served, parsed on the control node."""
    conn = http.client.HTTPConnection(r["host"], r["port"], timeout=r.get("timeout_s", 10))
    try:
        conn.request("GET", "/metrics", headers=auth())
        resp = conn.getresponse()
        return {"status": resp.status, "text": resp.read(8 << 20).decode("utf-8", errors="replace")}
    except Exception as e:
        return {"status": None, "text": "", "error": "%s: %s" % (type(e).__name__, e)}
    finally:
        conn.close()


def op_bench_serving(r):
    with tempfile.TemporaryDirectory(prefix="k26ops-bench-") as d:
        out = os.path.join(d, "result.jsonl")
        extra = {
            "sampling_params": {"temperature": r["temperature"], "max_new_tokens": r["output_len"], "ignore_eos": True}
        }
        argv = [
            r["python"],
            "-m",
            r.get("module") or "sglang.bench_serving",
            "--backend",
            "sglang",
            "--host",
            r["host"],
            "--port",
            str(r["port"]),
            "--model",
            r["model"],
            "--tokenizer",
            r["tokenizer"],
            "--dataset-name",
            "random-ids",
            "--random-input-len",
            str(r["input_len"]),
            "--random-output-len",
            str(r["output_len"]),
            "--random-range-ratio",
            "1",
            "--num-prompts",
            str(r["num_prompts"]),
            "--max-concurrency",
            str(r["concurrency"]),
            "--seed",
            str(r["seed"]),
            "--extra-request-body",
            json.dumps(extra),
            "--output-file",
            out,
            "--disable-tqdm",
        ]
        env = (
            dict(os.environ, OPENAI_API_KEY=API_KEY[0]) if API_KEY and API_KEY[0] else None
        )  # what SGLang's bench reads
        before = spec_counters(r["host"], r["port"])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=r.get("timeout_s", 3600), cwd=d, env=env)
        after = spec_counters(r["host"], r["port"])
        rows = []
        if os.path.exists(out):
            with open(out) as fh:
                rows = [json.loads(l) for l in fh if l.strip()]
        if p.returncode != 0 or not rows:
            lines = [l for l in (p.stderr + p.stdout).splitlines() if l.strip()]
            return {
                "ok": False,
                "error": "sglang.bench_serving exited %d: %s" % (p.returncode, lines[-1][:300] if lines else ""),
            }
        res = rows[-1]
        keys = (
            "completed",
            "duration",
            "total_output_tokens",
            "output_throughput",
            "request_throughput",
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_itl_ms",
            "p99_itl_ms",
            "p99_e2e_latency_ms",
            "accept_length",
        )
        m = {k: res.get(k) for k in keys}
        m["duration_s"] = m.pop("duration")
        m["accept_lifetime"] = m.get("accept_length")
        cell = cell_accept(before, after)
        if cell is not None:
            m["accept_length"], m["accept_source"] = cell, PER_CELL
        else:
            m["accept_source"] = LIFETIME if m.get("accept_length") is not None else None
        return {"ok": True, "metrics": m, "errors": []}


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    API_KEY.append(req.pop("api_key", None))
    res = globals()["op_" + req.pop("op")](req)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
