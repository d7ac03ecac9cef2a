"""A deploy the service never notices: `k26ops deploy --batch 1` of a new release over
3 lab hosts behind a real SGLang Model Gateway (`sglang-router` 0.3.2 from PyPI, run on
this control node, loopback only), under steady client traffic through the gateway.

    python bench/zero_downtime.py                  # the gateway drain (model_gateway in the inventory)
    python bench/zero_downtime.py --no-drain       # today's restart: the inventory names no gateway
    python bench/zero_downtime.py --both           # both, side by side, one lab

The client sends >= 20 requests/s through the gateway: most are short /generate, one in
ten is streamed and lasts >= 20 s (the stand-ins decode at a paced 10 tokens/s). Every
request is counted: ok only if it answered 200 with every token asked for (a stream
ends with [DONE] after its last token). A watcher polls the gateway's GET /workers every
0.25 s and counts windows with zero healthy workers. The engines' stand-ins drain on
SIGTERM like SGLang 0.5.23 (k26ops/lab/fixtures/engine_standin.py) and load for
K26BENCH_LOAD_S (default 10) seconds after a restart.

The last line is one JSON object: requests, failed, hosts, gateway, zero_worker_windows,
drain_s, out_of_rotation_s, stop_to_serving_s, deploy_exit (and more); with --both, one per mode
(the last line holds both under "runs").
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import common
import yaml

sys.path.insert(0, str(common.REPO / "tests"))
from labtools.labs import sglang_router  # noqa: E402  (the real router on loopback, as the tests run it)
from labtools.recipes import recipe_with_extra_patch  # noqa: E402

RATE = float(os.environ.get("K26BENCH_RATE", "22"))  # requests per second, all kinds
LONG_EVERY = 10  # one request in ten is a long stream
DECODE_TOKS = 10.0  # the stand-ins' paced decode speed (tokens/s per request)
LONG_TOKENS = 210  # 21 s at 10 tokens/s
SHORT_TOKENS = 4
LOAD_S = float(os.environ.get("K26BENCH_LOAD_S", "10"))
TAIL_S = 5.0  # traffic goes on this long after the deploy ends


def get(port: int, path: str, key: str | None = None, timeout: float = 5.0) -> tuple[int, object]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        r = c.getresponse()
        body = r.read().decode(errors="replace")
    finally:
        c.close()
    try:
        return r.status, json.loads(body)
    except ValueError:
        return r.status, body


class Watcher(threading.Thread):
    """GET /workers every 0.25 s: windows (and seconds) with zero healthy workers."""

    def __init__(self, router: SimpleNamespace):
        super().__init__(daemon=True)
        self.router, self.stop_ev = router, threading.Event()
        self.windows, self.zero_s, self.samples, self.min_healthy = 0, 0.0, 0, None

    def run(self):
        zero_since = None
        while not self.stop_ev.is_set():
            try:
                _s, d = get(self.router.port, "/workers", self.router.key, timeout=2)
                n = sum(1 for w in d.get("workers", []) if w.get("is_healthy"))
            except (OSError, AttributeError):
                n = 0
            now = time.monotonic()
            self.samples += 1
            self.min_healthy = n if self.min_healthy is None else min(self.min_healthy, n)
            if n == 0 and zero_since is None:
                zero_since = now
                self.windows += 1
            elif n > 0 and zero_since is not None:
                self.zero_s += now - zero_since
                zero_since = None
            time.sleep(0.25)
        if zero_since is not None:
            self.zero_s += time.monotonic() - zero_since


class Traffic:
    """Steady open-loop traffic through the gateway; every request counted."""

    def __init__(self, router: SimpleNamespace, rate: float):
        self.router, self.rate = router, rate
        self.lock = threading.Lock()
        self.ok = self.failed = self.long_ok = self.long_failed = 0
        self.errors: dict[str, int] = {}
        self.stop_ev = threading.Event()
        self.threads: list[threading.Thread] = []
        self.rng = random.Random(41)

    def one(self, stream: bool, n: int) -> None:
        why = None
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.router.port, timeout=120)
            body = {
                "text": f"request {self.rng.random():.6f}",
                "stream": stream,
                "sampling_params": {"max_new_tokens": n},
            }
            c.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                why = f"HTTP {r.status}"
                r.read()
            elif stream:
                last, done = None, False
                for line in r:
                    line = line.strip()
                    if line == b"data: [DONE]":
                        done = True
                        break
                    if line.startswith(b"data: "):
                        last = json.loads(line[6:])
                got = ((last or {}).get("meta_info") or {}).get("completion_tokens")
                if not done or got != n:
                    why = f"stream cut ({got} of {n} tokens, [DONE] {'seen' if done else 'missing'})"
            else:
                d = json.loads(r.read())
                if (d.get("meta_info") or {}).get("completion_tokens") != n:
                    why = "short answer"
            c.close()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            why = type(exc).__name__
        with self.lock:
            if why is None:
                self.ok += 1
                self.long_ok += stream
            else:
                self.failed += 1
                self.long_failed += stream
                self.errors[why] = self.errors.get(why, 0) + 1

    def run(self) -> None:
        i, t0 = 0, time.monotonic()
        while not self.stop_ev.is_set():
            stream = i % LONG_EVERY == 0
            t = threading.Thread(target=self.one, args=(stream, LONG_TOKENS if stream else SHORT_TOKENS), daemon=True)
            t.start()
            self.threads.append(t)
            i += 1
            time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))

    def start(self) -> None:
        self.runner = threading.Thread(target=self.run, daemon=True)
        self.runner.start()

    def stop(self) -> None:
        self.stop_ev.set()
        self.runner.join()
        for t in self.threads:
            t.join(150)

    @property
    def requests(self) -> int:
        return self.ok + self.failed


def inventory(b: common.BenchLab, name: str, router: SimpleNamespace | None, recipe: str | None) -> Path:
    inv = yaml.safe_load(b.inventory.read_text())
    v = inv.setdefault("vars", {})
    v["engine_env"] = {"K26OPS_STANDIN_DECODE_TOKS": str(DECODE_TOKS), "K26OPS_STANDIN_LOAD_SECONDS": str(LOAD_S)}
    v["extra_flags"] = ["--enable-metrics"]
    if recipe:
        v["recipe"] = recipe
    if router:
        v["model_gateway"] = router.url
        v["model_gateway_api_key"] = router.key
        v["drain_timeout"] = 60
    path = b.dir / f"{name}.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def register_all(b: common.BenchLab, router: SimpleNamespace) -> None:
    """Every engine registered with the gateway (POST /workers) and healthy there."""
    from k26ops.traffic.gateway import Gateway

    gw = Gateway(router.url, router.key)
    for h in b.hosts:
        url = f"http://127.0.0.1:{h.engine_port}"
        if gw.find(url) is None:
            gw.add(url)
        if gw.wait_healthy(url, 60) is None:
            raise RuntimeError(f"{url} not healthy at the gateway")


def run_mode(b: common.BenchLab, mode: str, recipe_new: str, recipe_old: str | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"zd-{mode}-", dir=b.dir))
    # round_robin: every host gets traffic (cache_aware sends one prompt to one worker)
    with sglang_router(work, "--policy", "round_robin") as started:
        router = SimpleNamespace(**started)  # url, port, key, log
        drain = mode == "drain"
        env = {"K26OPS_INVENTORY": str(b.inventory), "K26OPS_LAB_DIR": str(b.dir)}
        # converge on the old release with the same settings (no traffic yet), then register every engine
        base = inventory(b, f"{mode}-base", router if drain else None, recipe_old)
        rc, data, _w = common.deploy_json(base, env=env)
        if rc != 0:
            raise RuntimeError(f"converging deploy failed: {json.dumps(data)[:1500]}")
        register_all(b, router)
        new = inventory(b, f"{mode}-new", router if drain else None, recipe_new)
        watcher, traffic = Watcher(router), Traffic(router, RATE)
        watcher.start()
        traffic.start()
        time.sleep(25.0)  # long streams in flight on every host before the rollout starts
        proc, wall = common.k26ops("--json", "-i", str(new), "deploy", "--batch", "1", env=env, timeout=1800)
        time.sleep(TAIL_S)
        traffic.stop()
        watcher.stop_ev.set()
        watcher.join()
        try:
            out = json.loads(proc.stdout)
        except ValueError:
            out = {"hosts": {}}
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        hosts = out.get("hosts") or {}
        tr = {h: (r.get("traffic") or {}) for h, r in hosts.items()}
        return {
            "mode": "gateway drain" if drain else "no gateway (today's restart)",
            "requests": traffic.requests,
            "failed": traffic.failed,
            "long_streams": {"ok": traffic.long_ok, "failed": traffic.long_failed},
            "errors": traffic.errors,
            "rate_per_s": round(traffic.requests / max(1e-9, wall + 25 + TAIL_S), 1),
            "hosts": len(b.hosts),
            "gateway": {
                "name": "sglang-router",
                "version": importlib.metadata.version("sglang-router"),
                "url": router.url,
            },
            "zero_worker_windows": watcher.windows,
            "zero_worker_s": round(watcher.zero_s, 2),
            "min_healthy_workers": watcher.min_healthy,
            "drain_s": {h: t.get("drain_s") for h, t in tr.items()},
            "drain_requests": {h: t.get("requests") for h, t in tr.items()},
            "out_of_rotation_s": {h: t.get("out_of_rotation_s") for h, t in tr.items()},
            "stop_to_serving_s": {h: t.get("stop_to_serving_s") for h, t in tr.items()},
            "k26ops_zero_worker_windows": (out.get("traffic") or {}).get("zero_worker_windows"),
            "deploy_wall_s": round(wall, 1),
            "deploy_exit": proc.returncode,
            "deploy_error": None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [""])[-1][:300],
        }


def recipes(d: Path) -> tuple[str, str]:
    """(the lab recipe, a copy of it with one harmless patch more: a second release of the same
    engine), made as the tests make it (labtools.recipes: the lock, rehearsal configs and model
    manifest copied beside it)."""
    return "lab", str(recipe_with_extra_patch(d / "release2", "bench-second-release"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-drain", action="store_true", help="today's restart: no gateway in the inventory")
    ap.add_argument("--both", action="store_true", help="the drain and today's restart, one after the other")
    a = ap.parse_args()
    modes = ["drain", "none"] if a.both else ["none" if a.no_drain else "drain"]
    b = common.BenchLab(3, "zerodt")
    try:
        b.hosts = b.lab.up(3, b.base_port, log=lambda m: None, deployed=True)
        old, new = recipes(b.dir)
        runs = []
        for i, mode in enumerate(modes):
            # alternate the releases so that each run's deploy is a new release
            r = run_mode(b, mode, new if i % 2 == 0 else old, old if i % 2 == 0 else new)
            runs.append(r)
            print(json.dumps(r))
    finally:
        b.down()
    common.write_result("zero_downtime", {"runs": runs})
    print(json.dumps(runs[0] if len(runs) == 1 else {**runs[0], "runs": runs}))
    return 0 if all(r["deploy_exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
