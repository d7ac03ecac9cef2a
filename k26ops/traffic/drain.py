"""The one drain path: take a host's engine out of rotation before it stops, put it back
once the new engine answers (docs/how-to/gateway-and-drain.md).

Per host, from the inventory (`TrafficConfig.of`):
- `gateway` mode (`model_gateway` set): DELETE the host's worker from every gateway that
  routes to it, never leaving a gateway with fewer than `min_serving` healthy workers
  (waiting while another host of this run is out, refusing in one line otherwise); wait
  until the engine's in-flight requests are done (its /metrics `sglang:num_running_reqs`
  + `num_queue_reqs`, read on the host), bounded by `drain_timeout`; then the caller stops
  the engine (its unit's TimeoutStopSec is larger than `drain_timeout`: systemd never
  SIGKILLs a drain). Put back: POST /workers, wait until every gateway lists it healthy.
- `hook` mode (`drain_hook`): the command runs on the control node with K26OPS_DRAIN=out
  before the stop and K26OPS_DRAIN=in after health and smoke; the same in-flight wait.
- `plain` mode: nothing changes routing; the stop itself drains (SGLang waits for its
  in-flight requests on SIGTERM) within TimeoutStopSec.
- `none` (nothing configured): today's behaviour; `check` says so once.

An interrupt (Ctrl-C) during the drain puts the worker back before it is raised: the old
engine was never signalled and keeps serving. A host whose new engine fails is never put
back (the caller simply does not call `put_back`).

The library never prints: `progress` hears "draining, 3 requests in flight, 12 s".
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from k26ops import interrupt
from k26ops.engine.host import EngineHost, wait_ready
from k26ops.engine.host import agent as engine_agent
from k26ops.engine.multinode import serves_http
from k26ops.errors import Interrupted, StepFailed, UserError
from k26ops.hostvars import Var, declare
from k26ops.layout import DEFAULT_PORT
from k26ops.traffic.gateway import Gateway, GatewayError, check_url, normal_url
from k26ops.transport import agents

DEFAULT_DRAIN_TIMEOUT = 300.0
DEFAULT_MIN_SERVING = 1
STOP_MARGIN_S = 60  # TimeoutStopSec = drain_timeout + this: the stop's own SGLang drain after ours
MODES = ("gateway", "hook", "plain", "none")
HOOK_TIMEOUT_S = 120.0
SMOKE_TIMEOUT_S = 300.0  # a cold engine's first request may JIT-build kernels (k26ops.steps.engine)
PUT_BACK_TIMEOUT_S = 300.0  # the gateway's registration workflow checks the worker before it serves

declare(
    __name__,
    "traffic: gateways and the drain",
    Var(
        "model_gateway",
        "URL or list of URLs",
        None,
        "the SGLang Model Gateway(s) (sglang-router) that route to this host: its worker is taken out "
        "(DELETE /workers/ID) before the engine stops and put back (POST /workers) once it is healthy",
    ),
    Var(
        "model_gateway_api_key",
        "str (secret)",
        None,
        "the gateways' admin key (--control-plane-api-keys ...:admin:KEY; never printed)",
    ),
    Var("worker_url", "URL", None, "this engine as the gateways know it", "http://ADDRESS:ENGINE_PORT"),
    Var(
        "drain",
        "gateway|hook|plain|none",
        None,
        "how a stop is drained: gateway (model_gateway), hook (drain_hook), plain (SGLang's own drain "
        "on SIGTERM, within TimeoutStopSec), none (as before: no drain)",
        "gateway with model_gateway, hook with drain_hook, else none",
    ),
    Var(
        "drain_hook",
        "command",
        None,
        "run on the control node (no shell) with K26OPS_DRAIN=out before the stop and =in after "
        "health and smoke; K26OPS_HOST, K26OPS_WORKER_URL set (HAProxy, nginx, Envoy)",
    ),
    Var(
        "drain_timeout",
        "number (s)",
        DEFAULT_DRAIN_TIMEOUT,
        "longest wait for in-flight requests; the unit's TimeoutStopSec is larger",
        f"p99 end-to-end latency of the host's stored bench, else {DEFAULT_DRAIN_TIMEOUT:g}",
    ),
    Var(
        "min_serving",
        "int",
        DEFAULT_MIN_SERVING,
        "healthy workers every gateway keeps while a host is out of rotation (at least 1)",
    ),
)


BENCH_FIGURE = "e2e_p99_ms"  # k26ops.enginebench.run.METRICS: the requests' p99 end-to-end latency
_P99: dict = {}  # (repository, its tags' mtimes, host) -> (seconds, where) or None


def bench_p99_of(host: str) -> tuple[float, str] | None:
    """The default drain_timeout of `host`: the p99 end-to-end latency (s) of the newest bench a baseline
    stores for it (`snapshot --bench`), the largest of its cells, and where it comes from; None where
    there is none (or the baselines repository cannot be read: the drain then uses the default)."""
    # cycle: k26ops.baselines' package imports its rollback -> k26ops.steps.traffic -> this module
    from k26ops.baselines.repo import Baselines, default_dir

    path = default_dir()
    stamp = tuple(
        (path / ".git" / f).stat().st_mtime_ns if (path / ".git" / f).exists() else 0
        for f in ("refs/tags", "packed-refs")
    )
    key = (str(path), stamp, host)
    with _GUARD:
        if key in _P99:
            return _P99[key]
    found = None
    repo = Baselines(path)
    try:
        for tag in reversed(repo.tags() if repo.exists() else []):  # newest first
            if tag.error or host not in ((tag.index or {}).get("hosts") or {}):
                continue
            bench = repo.host_bench(tag.commit, host) or {}
            p99 = [
                c["figures"][BENCH_FIGURE]["median"]
                for c in bench.get("cells") or []
                if BENCH_FIGURE in (c.get("figures") or {})
            ]
            if p99:
                found = (round(max(p99) / 1000.0, 3), f"baseline {tag.name}")
                break
    except (UserError, OSError, ValueError):
        found = None
    with _GUARD:
        _P99[key] = found
    return found


def _number(hvars: dict, name: str, host: str, default: float, *, least: float, integer: bool = False):
    v = hvars.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not float(v).is_integer()):
        raise UserError(f"{host}: {name}: {v!r} is not {'an integer' if integer else 'a number'}")
    if not math.isfinite(v) or v < least:
        raise UserError(f"{host}: {name}: {v!r} is below {least:g}")
    return int(v) if integer else float(v)


@dataclass(frozen=True)
class TrafficConfig:
    """A host's traffic settings, checked (UserError: one line naming the host and variable)."""

    mode: str
    gateways: tuple[str, ...] = ()
    api_key: str | None = field(default=None, repr=False)
    hook: tuple[str, ...] = ()
    worker_url: str = ""
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    drain_timeout_from: str = "default"  # inventory | bench p99 of TAG | default
    min_serving: int = DEFAULT_MIN_SERVING
    configured: bool = False  # the inventory said anything about traffic

    @classmethod
    def of(cls, host, hvars: dict | None = None, bench_p99: tuple[float, str] | None | bool = True) -> "TrafficConfig":
        """From the host's vars; `bench_p99`: (seconds, where) of its stored bench, the default drain_timeout
        (True: looked up, k26ops.traffic.drain.bench_p99; None: there is none)."""
        hv = host.vars if hvars is None else hvars
        name = host.name
        raw = hv.get("model_gateway")
        urls = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else None
        if raw is not None and (urls is None or not all(isinstance(u, str) for u in urls)):
            raise UserError(f"{name}: model_gateway: a URL or a list of URLs, got {type(raw).__name__}")
        try:
            gws = tuple(dict.fromkeys(check_url(u) for u in urls or ()))
        except ValueError as exc:
            raise UserError(f"{name}: {exc}") from None
        hook_text = hv.get("drain_hook")
        if hook_text is not None and (not isinstance(hook_text, str) or not hook_text.strip()):
            raise UserError(f"{name}: drain_hook: a command line, got {hook_text!r}")
        try:
            hook = tuple(shlex.split(hook_text)) if hook_text else ()
        except ValueError as exc:
            raise UserError(f"{name}: drain_hook: {exc}") from None
        mode = hv.get("drain")
        if mode is None:
            mode = "gateway" if gws else "hook" if hook else "none"
        if mode not in MODES:
            raise UserError(f"{name}: drain: {mode!r} is not one of {', '.join(MODES)}")
        if mode == "gateway" and not gws:
            raise UserError(f"{name}: drain: gateway needs model_gateway (the gateway URL)")
        if mode == "hook" and not hook:
            raise UserError(f"{name}: drain: hook needs drain_hook (the command)")
        key = hv.get("model_gateway_api_key")
        if key is not None and not isinstance(key, str):
            raise UserError(f"{name}: model_gateway_api_key: expected text")
        wurl = hv.get("worker_url")
        if wurl is None:
            port = hv.get("engine_port") or DEFAULT_PORT
            wurl = f"http://{host.address}:{port}"
        try:
            wurl = check_url(wurl, "worker_url")
        except ValueError as exc:
            raise UserError(f"{name}: {exc}") from None
        if bench_p99 is True:
            bench_p99 = bench_p99_of(name) if mode != "none" and hv.get("drain_timeout") is None else None
        if hv.get("drain_timeout") is not None:
            dt, dt_from = _number(hv, "drain_timeout", name, DEFAULT_DRAIN_TIMEOUT, least=0), "inventory"
        elif bench_p99:
            dt, dt_from = float(bench_p99[0]), f"p99 end-to-end latency in {bench_p99[1]}"
        else:
            dt, dt_from = DEFAULT_DRAIN_TIMEOUT, "default"
        ms = _number(hv, "min_serving", name, DEFAULT_MIN_SERVING, least=1, integer=True)
        configured = any(hv.get(k) is not None for k in ("model_gateway", "drain", "drain_hook"))
        return cls(
            mode=mode,
            gateways=gws,
            api_key=key or None,
            hook=hook,
            worker_url=wurl,
            drain_timeout=dt,
            drain_timeout_from=dt_from,
            min_serving=ms,
            configured=configured,
        )

    @property
    def drains(self) -> bool:
        return self.mode != "none"

    def timeout_stop_sec(self) -> int | None:
        """The unit's TimeoutStopSec for this host: larger than drain_timeout (None: the unit's default)."""
        return int(math.ceil(self.drain_timeout)) + STOP_MARGIN_S if self.drains else None

    def summary(self) -> str:
        """One line for `check`: what a stop does to traffic here."""
        if self.mode == "none":
            return (
                "no gateway, drain hook or drain mode set: an engine restart drops its in-flight requests (as before)"
            )
        tail = f"drain_timeout {self.drain_timeout:g}s ({self.drain_timeout_from}), TimeoutStopSec {self.timeout_stop_sec()}"
        if self.mode == "gateway":
            return (
                f"out of rotation at {', '.join(Gateway(u).name for u in self.gateways)} before a stop, "
                f"min_serving {self.min_serving}; {tail}"
            )
        if self.mode == "hook":
            return f"drain_hook {self.hook[0]} before a stop and after health; {tail}"
        return f"plain: SGLang's own drain on SIGTERM; {tail}"

    def check(self) -> tuple[bool, str]:
        """`check`: (ok, one line): the summary, and for gateway mode what every gateway says of
        this host's worker now (read only); ok False when a gateway does not answer."""
        line, ok = self.summary(), True
        for gw in (Gateway(u, self.api_key) for u in self.gateways) if self.mode == "gateway" else ():
            try:
                w = gw.find(self.worker_url)
            except GatewayError as exc:
                return False, f"{line}; {exc}"
            line += f"; {gw.name}: {self.worker_url} " + (
                "not registered (a deploy registers it)" if w is None else "healthy" if w.healthy else "unhealthy"
            )
        return ok, line


# ---------------------------------------------------------------- the run's view of every gateway

_LOCKS: dict[str, threading.Lock] = {}
_OUT: dict[str, set[str]] = {}  # gateway url -> hosts of this run now out of rotation there
_GUARD = threading.Lock()


def _lock(url: str) -> threading.Lock:
    with _GUARD:
        return _LOCKS.setdefault(url, threading.Lock())


def _mark(url: str, host: str, out: bool) -> None:
    with _GUARD:
        s = _OUT.setdefault(url, set())
        (s.add if out else s.discard)(host)


def _others_out(url: str, host: str) -> list[str]:
    with _GUARD:
        return sorted(_OUT.get(url, set()) - {host})


@dataclass
class Drain:
    """One host's drain. `record` is its report: mode, drain_s, requests (in flight when the
    drain began), left (still in flight when it ended), out_of_rotation_s, stop_to_serving_s,
    put_back, zero_healthy_seen."""

    cfg: TrafficConfig
    host: str
    session: object  # the host's Session: the in-flight reads run on the host
    engine_host: str = "127.0.0.1"
    engine_port: int = DEFAULT_PORT
    engine_api_key: str | None = field(default=None, repr=False)  # the engine's --api-key, for POST /workers
    progress: Callable[[str], None] = lambda m: None
    secrets: list = field(default_factory=list, repr=False)  # redacted from the engine's log lines
    window: float = 2.0
    wait_for_others_s: float = 3600.0  # longest wait for another host of this run to come back
    record: dict = field(default_factory=dict)
    _removed: list = field(default_factory=list)  # [(Gateway, worker id)]
    _out_at: float | None = None
    _stop_at: float | None = None
    out: bool = False

    def __post_init__(self):
        self.record = {
            "mode": self.cfg.mode,
            "drain_timeout_s": self.cfg.drain_timeout,
            "drain_s": None,
            "requests": None,
            "left": None,
            "out_of_rotation_s": None,
            "stop_to_serving_s": None,
            "put_back": False,
            "zero_healthy_seen": False,
        }

    def gateways(self) -> list[Gateway]:
        return [Gateway(u, self.cfg.api_key) for u in self.cfg.gateways]

    # ---------------------------------------------------------------- out
    def take_out(self) -> None:
        """Out of rotation and drained; the caller stops the engine next. StepFailed (one line) when
        a gateway would be left with fewer than min_serving healthy workers; Interrupted after putting
        the worker back when Ctrl-C came during the drain."""
        try:
            if self.cfg.mode == "gateway":
                for gw in self.gateways():
                    self._remove_from(gw)
            elif self.cfg.mode == "hook":
                self._hook("out")
            self.out = self.cfg.mode in ("gateway", "hook")
            self._out_at = time.monotonic()
            if self.cfg.mode in ("gateway", "hook"):
                self._wait_inflight()
            else:
                self.record["requests"] = self._inflight(0.0).get("running_total")
        except (Interrupted, KeyboardInterrupt):
            back = self._undo_out()
            raise Interrupted(
                f"interrupted (Ctrl-C, SIGTERM or SIGHUP) during the drain; {back}; "
                "the engine was not stopped and keeps serving"
            ) from None
        except (StepFailed, GatewayError) as exc:
            back = self._undo_out()
            raise StepFailed(f"drain: {exc}" + (f"; {back}" if back else "") + "; the engine was not stopped") from None
        self._stop_at = time.monotonic()

    def _remove_from(self, gw: Gateway) -> None:
        need = max(1, self.cfg.min_serving)  # never zero workers (sglang PR #38524's race)
        t0 = time.monotonic()
        while True:
            with _lock(gw.url):
                workers = gw.workers()
                me = next((w for w in workers if w.url == normal_url(self.cfg.worker_url)), None)
                healthy = [w for w in workers if w.healthy and w is not me]
                if not [w for w in workers if w.healthy]:
                    self.record["zero_healthy_seen"] = True
                if me is None:
                    self.record.setdefault("not_registered", []).append(gw.name)
                    return
                if len(healthy) >= need:
                    gw.remove(me.id)
                    self._removed.append((gw, me.id))
                    _mark(gw.url, self.host, True)
                    if not gw.wait_gone(me.id, interruptible=True):
                        if interrupt.requested.is_set():
                            raise Interrupted("interrupted")
                        raise StepFailed(f"gateway {gw.name} still lists worker {me.id} 30s after DELETE")
                    return
                others = _others_out(gw.url, self.host)
            el = time.monotonic() - t0
            if not others or el > self.wait_for_others_s:
                raise StepFailed(
                    f"not taken out of rotation: gateway {gw.name} would keep {len(healthy)} healthy "
                    f"worker(s), fewer than min_serving {need}"
                    + (f" ({', '.join(others)} still out)" if others else "")
                )
            self.progress(
                f"waiting: gateway {gw.name} has {len(healthy)} other healthy worker(s), min_serving "
                f"{need}; {', '.join(others)} out of rotation, {el:.0f} s"
            )
            if interrupt.requested.is_set():
                raise Interrupted("interrupted")
            time.sleep(1.0)

    def _inflight(self, window: float) -> dict:
        res = agents.run(
            self.session,
            "engine",
            "inflight",
            window + 30,
            what="host agent",
            port=self.engine_port,
            host=self.engine_host,
            window=window,
        )
        if res.get("metrics"):
            res["running_total"] = int(res["running"]) + int(res.get("queued") or 0)
        return res

    def _wait_inflight(self) -> None:
        t0 = time.monotonic()
        first = None
        while True:
            el = time.monotonic() - t0
            res = self._inflight(0.0 if first is None else max(0.0, min(self.window, self.cfg.drain_timeout - el)))
            el = time.monotonic() - t0
            if not res.get("metrics"):  # no --enable-metrics: the stop's own SGLang drain waits for them
                self.record.update(drain_s=round(el, 2), metrics=False)
                self.progress(
                    f"drained: the engine's /metrics does not count requests (HTTP {res.get('status')}); "
                    "its own drain on SIGTERM waits for them"
                )
                return
            n = res["running_total"]
            if first is None:
                first = n
                self.record["requests"] = n
            if n == 0 or el >= self.cfg.drain_timeout:
                self.record.update(drain_s=round(el, 2), left=n)
                self.progress(
                    f"drained in {el:.0f} s ({first} request(s) waited for"
                    + (f", {n} still in flight: the stop's own drain waits for them)" if n else ")")
                )
                return
            self.progress(f"draining, {n} request{'s' if n != 1 else ''} in flight, {el:.0f} s")
            if interrupt.requested.is_set():
                raise Interrupted("interrupted")

    def _undo_out(self) -> str:
        """Put back what take_out removed (the engine was not stopped)."""
        if self.cfg.mode == "hook" and self.out:
            self._hook("in")
            self.out = False
            return "drain_hook in: put back in rotation"
        if not self._removed:
            return "nothing was taken out of rotation"
        names = self._add_back(self._removed, check_health=True)
        self.out = False
        return f"put back in rotation at {names}"

    # ---------------------------------------------------------------- back
    def put_back(self) -> None:
        """After health and smoke: into rotation again, and healthy at every gateway (StepFailed otherwise)."""
        if self.cfg.mode == "gateway":
            targets = [(gw, None) for gw in self.gateways()]
            self._add_back(targets, check_health=True)
        elif self.cfg.mode == "hook" and self.out:
            self._hook("in")
        self.out = False
        now = time.monotonic()
        if self._out_at is not None:
            self.record["out_of_rotation_s"] = round(now - self._out_at, 2)
        if self._stop_at is not None:
            self.record["stop_to_serving_s"] = round(now - self._stop_at, 2)
        self.record["put_back"] = self.cfg.mode in ("gateway", "hook")

    def serving_again(self) -> None:
        """Plain mode: health and smoke passed; the stop-to-serving time ends here."""
        if self._stop_at is not None and self.record.get("stop_to_serving_s") is None:
            self.record["stop_to_serving_s"] = round(time.monotonic() - self._stop_at, 2)

    def _add_back(self, targets, check_health: bool) -> str:
        url = self.cfg.worker_url
        for gw, _wid in targets:
            try:
                w = gw.find(url)
                if w is None:
                    gw.add(url, self.engine_api_key)
                if check_health:
                    self.progress(f"back into rotation at {gw.name}")
                    got = gw.wait_healthy(url, PUT_BACK_TIMEOUT_S, interruptible=False)
                    if got is None:
                        raise StepFailed(
                            f"gateway {gw.name} did not list {url} as healthy within "
                            f"{PUT_BACK_TIMEOUT_S:.0f}s after POST /workers"
                        )
            finally:
                _mark(gw.url, self.host, False)
        return ", ".join(gw.name for gw, _ in targets)

    # ---------------------------------------------------------------- hook
    def _hook(self, phase: str) -> None:
        env = dict(os.environ, K26OPS_DRAIN=phase, K26OPS_HOST=self.host, K26OPS_WORKER_URL=self.cfg.worker_url)
        try:
            p = subprocess.run(
                list(self.cfg.hook),
                env=env,
                capture_output=True,
                text=True,
                timeout=HOOK_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepFailed(f"drain_hook ({phase}) {self.cfg.hook[0]}: {type(exc).__name__}: {exc}") from None
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [""])[-1][:200]
            raise StepFailed(f"drain_hook ({phase}) {self.cfg.hook[0]} exited {p.returncode}: {last}")


def for_session(session, progress: Callable[[str], None] = lambda m: None, hvars: dict | None = None) -> Drain | None:
    """The host's drain for a stop made outside a deploy's service step (reboot, provision's
    reboot, diagnose cuda-graph, rehearse --stop-serving); None where the host does not drain."""
    host = session.host
    hv = dict(host.vars if hvars is None else hvars)
    cfg = TrafficConfig.of(host, hv)
    if not cfg.drains or not serves_http(hv):
        return None
    eh = EngineHost(SimpleNamespace(vars=hv, state={}, session=session, host=host))
    addr, port = eh.target()
    return Drain(
        cfg,
        host.name,
        session,
        engine_host=addr,
        engine_port=port,
        engine_api_key=eh.api_key(),
        progress=progress,
        secrets=eh.secrets(),
    )


def smoke_before_put_back(d: Drain, session, unit: str | None) -> None:
    """One greedy /generate on the worker itself (the deploy's smoke request, k26ops.steps.engine) before
    it goes back into rotation; StepFailed (left out of rotation) when it does not answer with text."""
    r = engine_agent(
        session,
        "smoke",
        timeout=SMOKE_TIMEOUT_S + 30,
        port=d.engine_port,
        host=d.engine_host,
        unit=unit,
        api_key=d.engine_api_key,
        prompt="Say hello in one short sentence.",
        max_new_tokens=8,
        timeout_s=SMOKE_TIMEOUT_S,
    )
    d.progress("smoke before putting it back: " + ("failed" if r.get("failed") else "answered"))
    if r.get("failed"):
        last = (r.get("results") or [{}])[-1]
        why = f"HTTP {last.get('status')}" if last.get("status") else "no answer"
        raise StepFailed(f"the engine answers /health but not its smoke request ({why}): left out of rotation")


def back_when_healthy(d: Drain, session, unit: str, timeout: float) -> None:
    """After a stop made outside a deploy: wait until the engine answers /health and /health_generate
    on the host (`session`: a new one after a reboot) and a smoke request, then put it back; StepFailed
    (left out of rotation) when it does not."""
    d.session = session
    w = wait_ready(
        session,
        unit,
        d.engine_host,
        d.engine_port,
        base=None,
        timeout=timeout,
        secrets=d.secrets,
        on_wait=lambda r: d.progress(
            f"waiting for the engine before putting it back: {r.poll['state']} {r.elapsed:.0f}s"
        ),
    )
    if w.state != "healthy":
        raise StepFailed(f"the engine is {w.state} after {w.elapsed:.0f}s: left out of rotation")
    smoke_before_put_back(d, session, unit)
    if d.cfg.mode in ("gateway", "hook"):
        d.put_back()
    else:
        d.serving_again()
