#!/usr/bin/env python3
"""One start of the unit's own engine, measured: time to first good token and what it
compiled into the release's engine cache (device tool; bench/device/h200_warmstart.sh).

    python3 bench/device/warmstart.py INVENTORY LABEL [--wipe] > LABEL.json

The host is the inventory's one `connection: local` host (no systemd on the device).
What starts is what the unit would run: the command line `launch.engine_launch` renders
from the host's profile, with the environment the unit's env file gets (EngineHost.env
plus the release's engine cache variables, steps.warmstart.cache_for: the same dir
`k26ops rehearse` fills), plus `--load-format dummy` for both models (the device's
model dirs hold configs and a tokenizer, no weights; compiled kernels do not depend on
weight values). Then as the deploy does after a restart: /health and /health_generate,
then the smoke step's greedy and sampled requests through the engine agent's `smoke`
op, measuring the cache dir at each step (`--wipe`: empty it first, a cold start).

Prints one JSON document with gpu, engine, ready_s, capture_s, first_greedy_s,
first_sampled_s, compiled_new (the issue's record), the whole TTFGT timeline, the
cache growth per phase, and the engine log's milestone lines. The engine is always
stopped (its process group) before the script ends.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from k26ops import facts
from k26ops.engine import launch
from k26ops.engine.host import EngineHost
from k26ops.inventory import load
from k26ops.steps import HostContext, warmstart
from k26ops.steps.engine import SmokeStep
from k26ops.transport import agents
from k26ops.transport.ssh import connect


def healthy(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def main() -> int:
    inv, label = sys.argv[1], sys.argv[2]
    host = next(iter(load(inv).hosts.values()))
    session = connect(host)
    ctx = HostContext(session=session, host=host, vars=dict(host.vars), facts=facts.gather(session, ["gpus"]))
    eh = EngineHost(ctx)
    profile = eh.profile()
    argv, secret = launch.engine_launch(profile)
    if secret is not None:
        sys.exit("warmstart.py: the profile has secret engine flags; this script writes no --config file for them")
    argv += ["--load-format", "dummy", "--speculative-draft-load-format", "dummy"]
    release_id = os.path.basename(os.path.realpath(eh.layout.current))
    version = warmstart.engine_version_for(ctx)
    cache, env = warmstart.cache_for(ctx.vars, version, release_id, argv, warmstart.gpus_of(ctx.facts), eh.env())
    if "--wipe" in sys.argv[3:]:
        shutil.rmtree(cache.dir, ignore_errors=True)
    req = cache.request()
    before = agents.run(session, "engine", "cache", cache=req, make=True)["cache"]
    host_, port = eh.target()
    log_path = f"/tmp/warmstart-{label}.log"
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    full.update({k: str(v) for k, v in env.items()})
    out: dict = {
        "label": label,
        "gpu": (warmstart.gpus_of(ctx.facts) or [{}])[0].get("name"),
        "engine": f"sglang {version}",
        "release": release_id,
        "argv": " ".join(argv),
        "cache_dir": cache.dir,
        "cache_variables": {k: env[k] for k in cache.variables},
        "kept_from_engine_env": cache.kept,
        "cache_before": before,
    }
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, env=full, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    started_at = time.time()
    try:
        ready_at = None
        deadline = started_at + float(os.environ.get("READY_TIMEOUT", "900"))
        while time.time() < deadline and proc.poll() is None:
            if healthy(port, "/health") and healthy(port, "/health_generate"):
                ready_at = time.time()
                break
            time.sleep(0.25)
        if ready_at is None:
            out["error"] = f"not ready (exit {proc.poll()})"
            print(json.dumps(out, indent=1))
            return 1
        ready_cache = agents.run(session, "engine", "cache", cache=req)["cache"]
        body, timeout = SmokeStep({}).request()
        r = agents.run(
            session,
            "engine",
            "smoke",
            timeout=timeout + 60,
            port=port,
            host="127.0.0.1",
            unit=None,
            base=None,
            api_key=launch.engine_flag_secrets(profile).get("--api-key"),
            cache=req,
            startup=warmstart.STARTUP_REQUEST,
            **body,
        )
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        lines = "\n".join(l for l in text.splitlines() if any(k in l for k in warmstart.LOG_LINES))
        at = {x["name"]: x.get("at") for x in r["results"]}
        t = warmstart.timeline(
            stop_at=None,
            started_at=started_at,
            ready_at=ready_at,
            greedy_at=at.get("greedy"),
            sampled_at=at.get("sampled"),
            log=lines,
            tz_offset=r["startup"]["tz_offset"],
            metrics=warmstart.parse_metrics(r["startup"]["metrics"]),
            started_source="k26ops",
        )
        cached = {x["name"]: x.get("cache") for x in r["results"]}
        c = warmstart.compiled(
            before,
            [
                ("start", ready_cache),
                ("first greedy answer", cached.get("greedy")),
                ("first sampled answer", cached.get("sampled")),
            ],
        )
        out.update(
            ready_s=t["ready_s"],
            capture_s=t["capture_s"],
            first_greedy_s=t["first_greedy_s"],
            first_sampled_s=t["first_sampled_s"],
            compiled_new=c["compiled_new"],
            ttfgt=t,
            warm_start=c,
            smoke={x["name"]: {"status": x["status"], "latency_s": x["latency_s"]} for x in r["results"]},
            failed=r.get("failed"),
            metrics=r["startup"]["metrics"],
            log_lines=lines.splitlines()[-40:],
            cache_after=cached.get("sampled") or cached.get("greedy"),
        )
        print(json.dumps(out, indent=1))
        return 0 if not r.get("failed") else 1
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main())
