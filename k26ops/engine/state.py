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


# systemd.exec(5) "Process Exit Codes": what systemd itself exits the service's process with when it
# could not set it up (before the engine ran a line). Named where a start failure is reported.
SYSTEMD_EXIT = {
    200: "CHDIR",
    201: "NICE",
    202: "FDS",
    203: "EXEC",
    204: "MEMORY",
    205: "LIMITS",
    206: "OOM_ADJUST",
    207: "SIGNAL_MASK",
    208: "STDIN",
    209: "STDOUT",
    210: "CHROOT",
    211: "IOPRIO",
    212: "TIMERSLACK",
    213: "SECUREBITS",
    214: "SETSCHEDULER",
    215: "CPUAFFINITY",
    216: "GROUP",
    217: "USER",
    218: "CAPABILITIES",
    219: "CGROUP",
    220: "SETSID",
    221: "CONFIRM",
    222: "STDERR",
    224: "PAM",
    225: "NETWORK",
    226: "NAMESPACE",
    227: "NO_NEW_PRIVILEGES",
    228: "SECCOMP",
    229: "SELINUX_CONTEXT",
    230: "PERSONALITY",
    231: "APPARMOR_PROFILE",
    232: "ADDRESS_FAMILIES",
    233: "RUNTIME_DIRECTORY",
    235: "CHOWN",
    236: "SMACK_PROCESS_LABEL",
    237: "KEYRING",
    238: "STATE_DIRECTORY",
    239: "CACHE_DIRECTORY",
    240: "LOGS_DIRECTORY",
    241: "CONFIGURATION_DIRECTORY",
    242: "NUMA_POLICY",
    243: "CREDENTIALS",
    245: "BPF",
}
SYSTEMD_EXIT_WHY = {
    203: "the ExecStart program could not be run (missing or not executable for the unit's User)",
    217: "the unit's User= does not exist on the host",
    216: "the unit's Group= does not exist",
    200: "the unit's WorkingDirectory= is missing or not reachable for its User",
}


def exit_status_text(status) -> str:
    """`217/USER (the unit's User= does not exist on the host)`, `1`: systemd's own exit codes named."""
    try:
        n = int(status)
    except (TypeError, ValueError):
        return str(status)
    if n not in SYSTEMD_EXIT:
        return str(n)
    why = SYSTEMD_EXIT_WHY.get(n)
    return f"{n}/{SYSTEMD_EXIT[n]}" + (f" ({why})" if why else " (systemd could not set up the process)")


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
        if result == "signal" and str(status) == "9":
            # SGLang's own end after a drain: kill_process_tree SIGKILLs the tree, itself included
            # (tests/data/drain). A crash ends so too, but then Restart=on-failure starts it again:
            # only a stop leaves it failed so (the start limit is told apart above)
            return EngineState(
                "stopped",
                should,
                "stopped (the engine ended by its own SIGKILL after its drain, "
                "as SGLang does; systemd says result signal)" + ("" if should else ", not enabled"),
            )
        return EngineState(
            "failed",
            should,
            f"result {result or 'unknown'}"
            + (f", exit status {exit_status_text(status)}" if status else "")
            + "; `k26ops diagnose service` names the crash",
        )
    if sub == "auto-restart" or (active == "activating" and restarts > 0):
        return EngineState(
            "crash-looping",
            should,
            f"{restarts} restart(s), last result {result or 'unknown'}; `k26ops diagnose service` names the crash",
        )
    if active == "active":
        if health == 200:
            return EngineState("serving", should, "")
        if uptime_s is not None and uptime_s > STARTING_S:
            return EngineState(
                "unhealthy",
                should,
                f"up {uptime_s / 60:.0f} min, /health " + (f"HTTP {health}" if health else "does not answer"),
            )
        return EngineState("starting", should, "/health " + (f"HTTP {health}" if health else "does not answer yet"))
    if active in ("activating", "reloading"):
        return EngineState("starting", should, f"unit {active}")
    if active == "deactivating":
        return EngineState("stopping", should, "unit deactivating")
    return EngineState("stopped", should, "unit inactive" + ("" if should else ", not enabled"))
