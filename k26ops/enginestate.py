"""What a host's engine is, from its unit's systemd state and /health: serving,
starting, stopped, failed, crash-looping, not installed. Pure.

Why: `status` printed the unit's ActiveState and exited 0 for a stopped or failed
engine (after systemd's start limit both units were `failed`, status said `2 ok`).
An enabled unit is one a deploy left to serve: when it does not, status says what it
is instead and exits non-zero. A disabled or absent unit is not expected to serve.
"""

from __future__ import annotations

from dataclasses import dataclass

START_LIMIT = "start-limit-hit"
# How long an active engine that does not answer yet counts as starting (a TP8 load
# takes minutes); after it, `unhealthy`. The deploy's health wait default.
STARTING_S = 1800.0


@dataclass
class EngineState:
    state: str  # serving | starting | unhealthy | crash-looping | failed | stopped | stopping | not-installed
    should_serve: bool  # the unit is enabled: a deploy left it to serve
    detail: str  # one phrase: why it is in that state, and what to do when it should serve

    @property
    def ok(self) -> bool:
        return self.state == "serving" or not self.should_serve

    def label(self) -> str:
        return self.state + (f" ({self.detail})" if self.detail and self.state != "serving" else "")


def start_limit_hit(show: dict) -> bool:
    """systemd gave up restarting the unit: its start limit was hit. Newer systemd says so in
    Result; 252 (Debian 12, measured on a lab host) keeps the last failure's Result (exit-code)
    and only logs "Start request repeated too quickly", which the host agents read into
    StartLimitHit (the restart count cannot tell: manual starts count toward the limit too)."""
    return show.get("Result") == START_LIMIT or show.get("StartLimitHit") is True


def run_identity(show: dict) -> dict:
    """The engine run a wait or a smoke watches (MainPID, NRestarts, InvocationID, from the
    unit's systemctl show): a different one later means this run died or was restarted. The
    host agent (k26ops/agents/engine.py) reads the same three on its side."""
    return {k: show.get(k) for k in ("MainPID", "NRestarts", "InvocationID")}


def reset_hint(unit: str) -> str:
    return f"`systemctl reset-failed {unit}` is needed before it can start again (a `k26ops deploy` does it)"


def engine_state(show: dict, health: int | None, uptime_s: float | None, unit: str) -> EngineState:
    """`show`: the unit's systemctl show properties (ActiveState, SubState, Result,
    UnitFileState, LoadState, NRestarts, ExecMainStatus; StartLimitHit from the agents); `health`: /health's HTTP status
    (0 no answer, None not asked); `uptime_s`: since the main process started."""
    active, sub = show.get("ActiveState") or "", show.get("SubState") or ""
    result = show.get("Result") or ""
    should = str(show.get("UnitFileState") or "").startswith("enabled")
    restarts = int(show.get("NRestarts") or 0)
    if show.get("LoadState") == "not-found":
        return EngineState("not-installed", False, f"no {unit} on this host")
    if active == "failed":
        if start_limit_hit(show):
            return EngineState("failed", should, f"start-limit-hit after {restarts} restart(s): {reset_hint(unit)}")
        status = show.get("ExecMainStatus")
        return EngineState("failed", should, f"result {result or 'unknown'}" + (f", exit status {status}" if status else "")
                           + "; `k26ops diagnose service` names the crash")
    if sub == "auto-restart" or (active == "activating" and restarts > 0):
        return EngineState("crash-looping", should, f"{restarts} restart(s), last result {result or 'unknown'}; "
                           "`k26ops diagnose service` names the crash")
    if active == "active":
        if health == 200:
            return EngineState("serving", should, "")
        if uptime_s is not None and uptime_s > STARTING_S:
            return EngineState("unhealthy", should, f"up {uptime_s / 60:.0f} min, /health "
                               + (f"HTTP {health}" if health else "does not answer"))
        return EngineState("starting", should, "/health " + (f"HTTP {health}" if health else "does not answer yet"))
    if active in ("activating", "reloading"):
        return EngineState("starting", should, f"unit {active}")
    if active == "deactivating":
        return EngineState("stopping", should, "unit deactivating")
    return EngineState("stopped", should, "unit inactive" + ("" if should else ", not enabled"))
