"""Warm starts: the release's engine cache as the unit and the rehearsal use it, and
a start's time to first good token (TTFGT).

- `cache_for`: the cache dir of a release on this host's GPUs for an engine command
  line, and the variables that point the release's engine at it
  (k26ops.facts.engine_cache has the table and the layout).
- `timeline`: stop -> process started -> weights loaded -> graphs captured -> ready
  -> first greedy answer -> first sampled answer, on the host's clock. Each milestone
  says where it came from: `log` (the engine's own timestamped lines: "Load weight
  end", "Capture ... CUDA graph end", "fired up"; one-second resolution), `systemd`
  (the unit's start), `k26ops` (the agent's clock: the stop, the answers, and ready
  where the log has no "fired up"). Durations come from the engine's start-up
  metrics where it serves them (`startup_cuda_graph_time_seconds{phase}`,
  `weight_load_duration_seconds`, `startup_time_seconds`), else from its log.
- `compiled`: what a start added to the cache dir, per phase; a warm start adds no
  kernel, a cold one is named: "cold start: N new kernels compiled (first sampled
  answer: N)".
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field

from k26ops.engine import systemd
from k26ops.engine.profile import effective_recipe, lock_for
from k26ops.errors import UserError
from k26ops.facts import engine_cache
from k26ops.layout import Layout
from k26ops.rehearsal.plan import capture_times
from k26ops.runstate import HostState
from k26ops.steps.release import ReleaseDecision, engine_version

# What the agents send back of a start (one home: the agents get these with the request)
LOG_LINES = ("Load weight end", "CUDA graph end", "cuda graph end", "fired up")
METRIC_NAMES = ("startup_time_seconds", "weight_load_duration_seconds", "startup_cuda_graph_time_seconds")
MILESTONES = (
    "stop",
    "process started",
    "weights loaded",
    "graphs captured",
    "ready",
    "first greedy answer",
    "first sampled answer",
)
STARTUP_REQUEST = {"lines": list(LOG_LINES), "metrics": list(METRIC_NAMES)}

_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)([.,]\d+)?[\] ]")
_WEIGHTS = re.compile(r"Load weight end\. elapsed=([0-9.]+) ?s(?:, type=(\w+))?")
_CAPTURE_END = re.compile(r"(?:CUDA|cuda) graph end")


@dataclass
class Cache:
    """One start's engine cache: the dir, its top (k26ops_root/engine-cache), the variables
    set for it and those the inventory's engine_env set itself (kept)."""

    dir: str
    top: str
    variables: dict
    kept: list = field(default_factory=list)

    def request(self, owner: str | None = None) -> dict:
        """What an agent needs to make or measure it."""
        return {
            "dir": self.dir,
            "top": self.top,
            "suffixes": list(engine_cache.KERNEL_SUFFIXES),
            **({"owner": owner} if owner else {}),
        }

    def to_json(self) -> dict:
        return {"dir": self.dir, "variables": sorted(self.variables), "kept_from_engine_env": self.kept}


def cache_for(
    hvars: dict, engine_version: str | None, release_id: str, argv: list[str], gpus: list[dict] | None, env: dict
) -> tuple[Cache, dict]:
    """(the cache of `release_id` for this command line on these GPUs, `env` with its variables)."""
    layout = Layout.of(hvars)
    d = engine_cache.cache_dir(layout.root, release_id, argv, gpus)
    wanted = engine_cache.variables(engine_version, d)
    env, kept = engine_cache.apply(env, wanted)
    return Cache(d, f"{layout.root}/{engine_cache.SUBDIR}", wanted, kept), env


def cache_in_env(hvars: dict, env_text: str | None) -> Cache | None:
    """The release cache an env file points the engine at (a baseline's, restored by a
    rollback), or None: the first cache variable whose value is a dir under engine-cache."""
    top = f"{Layout.of(hvars).root}/{engine_cache.SUBDIR}/"
    env = {k: v for k, v, _s, _e in systemd.parse_env(env_text or "")}
    for _since, table in engine_cache.CACHE_VARS:
        for var, sub in table.items():
            value = env.get(var) or ""
            d = value[: -len(sub) - 1] if sub and value.endswith("/" + sub) else value if not sub else ""
            if d.startswith(top) and d.count("/") == top.count("/") + 1:
                want = {k: f"{d}/{s}" if s else d for k, s in table.items()}
                return Cache(d, top.rstrip("/"), want, sorted(k for k in want if env.get(k) != want[k]))
    return None


def engine_version_for(ctx) -> str | None:
    """The sglang version of the release this run deploys (its prepared recipe and lock), else
    of the host's recipe; None when neither can say (the oldest table row then applies)."""
    prep = ReleaseDecision.of(ctx).prepared
    try:
        if prep is not None:
            return engine_version(prep.recipe, prep.lock)
        r = effective_recipe(ctx)
        return engine_version(r, lock_for(r))
    except (UserError, OSError):
        return None


def gpus_of(facts: dict | None) -> list[dict] | None:
    g = (facts or {}).get("gpus")
    return g.get("gpus") if isinstance(g, dict) else None


@dataclass
class WarmStart(HostState):
    """A restart this run made, as the service, health and smoke steps saw it."""

    cache: Cache | None = None
    stop_at: float | None = None  # host clock
    before: dict | None = None  # the cache dir before the start
    ready_at: float | None = None
    ready_cache: dict | None = None


# ---------------------------------------------------------------- the engine's own account


def _when(line: str, tz_offset: float) -> float | None:
    """The engine's timestamp on a log line (`[2026-12-01 23:57:32 TP0]`, host local time) as unix time."""
    m = _STAMP.search(line)
    if not m:
        return None
    try:
        t = time.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    frac = float("0." + m.group(2)[1:]) if m.group(2) else 0.0
    return calendar.timegm(t) - tz_offset + frac


def log_marks(log: str, tz_offset: float = 0) -> dict:
    """{milestone: unix time} from the engine's log: weights loaded (its last "Load weight
    end": the drafter's after the target's), graphs captured (the last capture end), ready
    (the first "fired up")."""
    marks: dict = {}
    for line in log.splitlines():
        at = _when(line, tz_offset)
        if at is None:
            continue
        if "Load weight end" in line:
            marks["weights loaded"] = at
        elif _CAPTURE_END.search(line):
            marks["graphs captured"] = at
        elif "fired up" in line and "ready" not in marks:
            marks["ready"] = at
    return marks


def parse_metrics(text: str, keep=METRIC_NAMES) -> dict:
    """Prometheus text lines whose name holds one of `keep`: {"name{labels}": value}."""
    out = {}
    for line in (text or "").splitlines():
        if line.startswith("#") or not any(k in line for k in keep):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            continue
    return out


def _metric(metrics: dict, name: str) -> float | None:
    """A gauge's value, or a histogram's sum (`<name>_sum`)."""
    for key, value in metrics.items():
        base = key.split("{", 1)[0]
        if base.endswith(name) or base.endswith(name + "_sum"):
            return value
    return None


def weights_seconds(log: str, metrics: dict) -> tuple[float | None, str | None]:
    """(seconds, source): the engine's weight_load_duration_seconds, else its "Load weight
    end. elapsed=" lines (each model's longest rank, target and drafter added)."""
    m = _metric(metrics, "weight_load_duration_seconds")
    if m is not None:
        return round(m, 2), "metrics"
    per: dict = {}
    for hit in _WEIGHTS.finditer(log):
        per[hit.group(2) or ""] = max(per.get(hit.group(2) or "", 0.0), float(hit.group(1)))
    return (round(sum(per.values()), 2), "log") if per else (None, None)


def capture_seconds(log: str, metrics: dict) -> tuple[float | None, str | None]:
    """(seconds, source): startup_cuda_graph_time_seconds over its phases, else the log's captures."""
    c = capture_times(log, metrics)
    if c.get("metrics_s"):
        return round(sum(c["metrics_s"].values()), 2), "metrics"
    return (c["total_s"], "log") if c["total_s"] is not None else (None, None)


def timeline(
    *,
    stop_at: float | None,
    started_at: float | None,
    ready_at: float | None,
    greedy_at: float | None,
    sampled_at: float | None,
    log: str = "",
    tz_offset: float = 0,
    metrics: dict | None = None,
    started_source: str = "systemd",
) -> dict:
    """A start's time to first good token, on the host's clock (see the module doc)."""
    metrics = metrics or {}
    marks = log_marks(log, tz_offset)
    ready, ready_src = (marks["ready"], "log") if marks.get("ready") else (ready_at, "k26ops")
    points = [
        ("stop", stop_at, "k26ops"),
        ("process started", started_at, started_source),
        ("weights loaded", marks.get("weights loaded"), "log"),
        ("graphs captured", marks.get("graphs captured"), "log"),
        ("ready", ready, ready_src),
        ("first greedy answer", greedy_at, "k26ops"),
        ("first sampled answer", sampled_at, "k26ops"),
    ]
    t0 = stop_at if stop_at is not None else started_at
    out: dict = {"milestones": [], "clock": "host"}
    at_s: dict = {}
    for name, at, src in points:
        if at is None or t0 is None:
            continue
        # log stamps have one-second resolution: a milestone never comes before the one it follows
        at_s[name] = max([round(at - t0, 2)] + list(at_s.values()))
        out["milestones"].append({"name": name, "at_s": at_s[name], "source": src})

    def since(a, b):
        return round(at_s[a] - at_s[b], 2) if a in at_s and b in at_s else None

    out.update(
        stop_s=since("process started", "stop"),
        ready_s=since("ready", "process started"),
        first_greedy_s=since("first greedy answer", "ready"),
        first_sampled_s=since("first sampled answer", "ready"),
        total_s=out["milestones"][-1]["at_s"] if out["milestones"] else None,
    )
    out["weights_s"], out["weights_source"] = weights_seconds(log, metrics)
    out["capture_s"], out["capture_source"] = capture_seconds(log, metrics)
    startup = _metric(metrics, "startup_time_seconds")
    out["startup_s"] = round(startup, 2) if startup is not None else None
    return out


def compiled(before: dict | None, phases: list[tuple[str, dict | None]]) -> dict:
    """What a start added to its cache dir: {"compiled_new": kernels, "by_phase": {phase: kernels},
    "files_new", "bytes_new", "verdict"}. `phases`: (phase, the cache after it) in order;
    a phase whose measure is missing is skipped."""
    prev = before or {"files": 0, "kernels": 0, "bytes": 0}
    by, files, size = {}, 0, 0
    for name, after in phases:
        if after is None:
            continue
        g = engine_cache.grew(prev, after)
        by[name] = g["kernels"]
        files, size = files + g["files"], size + g["bytes"]
        prev = after
    n = sum(by.values())
    verdict = (
        "warm start: no new kernel compiled"
        if n == 0
        else f"cold start: {n} new kernel{'s' if n != 1 else ''} compiled ("
        + ", ".join(f"{k}: {v}" for k, v in by.items() if v)
        + ")"
    )
    return {"compiled_new": n, "by_phase": by, "files_new": files, "bytes_new": size, "verdict": verdict}


def summary(t: dict) -> str:
    """`ready 51.2 s, first sampled +0.4 s, total 60.1 s (capture 1.7 s)` for a progress line."""
    parts = []
    if t.get("ready_s") is not None:
        parts.append(f"ready {t['ready_s']:.1f} s after start")
    if t.get("first_sampled_s") is not None:
        parts.append(f"first sampled answer +{t['first_sampled_s']:.1f} s")
    elif t.get("first_greedy_s") is not None:
        parts.append(f"first greedy answer +{t['first_greedy_s']:.1f} s")
    if t.get("total_s") is not None:
        parts.append(f"{t['total_s']:.1f} s from {'stop' if t.get('stop_s') is not None else 'start'}")
    if t.get("capture_s") is not None:
        parts.append(f"capture {t['capture_s']:.1f} s")
    return "time to first good token: " + ", ".join(parts) if parts else "time to first good token: not measured"
