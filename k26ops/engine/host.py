"""The engine on one host: where k26ops keeps its files there, which unit runs
the engine and where it listens, its env file, its secrets, and the one wait
for it to become ready.

Why one module: these were worked out in several places (the engine steps,
status/logs, diagnose, the probe, baselines, reboot, preflight, facts), and
two of them ignored a custom `k26ops_root`. Everyone asks this module now.

`Layout` needs only a host's vars (it is what preflight, the fact gatherer,
the lock and the release build need); `EngineHost` adds the engine itself,
from a host context (vars, and the recipe the run's steps chose) and the
step's params.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from k26ops import interrupt
from k26ops.engine import launch, secret_policy, systemd, units
from k26ops.engine import profile as profile_mod
from k26ops.errors import UserError
from k26ops.hostvars import Var, declare
from k26ops.layout import (  # noqa: F401 (re-exported: the engine's names live in layout)
    DEFAULT_PORT,
    DEFAULT_ROOT,
    DEFAULT_UNIT,
    LAB_MODULE,
    NVLS_OFF,
    PASS_ENV,
    UNIT_DIR,
    Layout,
    check_unit_name,
)
from k26ops.transport import agents

# Lab fixture: the engine stand-in, shipped as one file with the real engine's recorded start
# phases filled in (tests/data/standin/start-phases.json; issue 43). Never outside the lab.
STANDIN = Path(__file__).resolve().parent.parent / "lab" / "fixtures" / "engine_standin.py"
STANDIN_PHASES = Path(__file__).resolve().parent.parent.parent / "tests" / "data" / "standin" / "start-phases.json"
_PHASES_LINE = "\nRECORDED_PHASES = None\n"


def lab_standin_text() -> str:
    """The stand-in's source as the lab installs it: RECORDED_PHASES set to the recording."""
    try:
        phases = json.dumps(json.loads(STANDIN_PHASES.read_text()), sort_keys=True)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"lab: the engine stand-in's recorded start phases {STANDIN_PHASES} are unreadable "
            f"({exc}); the lab runs from a k26ops checkout"
        ) from None
    text = STANDIN.read_text()
    if text.count(_PHASES_LINE) != 1:
        raise UserError(f"lab: {STANDIN} has no `RECORDED_PHASES = None` line to fill")
    return text.replace(_PHASES_LINE, f"\nRECORDED_PHASES = {phases!r}\n")


declare(
    __name__,
    "the engine's unit and environment",
    Var("engine_unit", "str", DEFAULT_UNIT, "the engine's systemd unit name (NAME.service)"),
    Var("engine_env_file", "path", units.ENV_FILE, "the engine's environment file (mode 0600)"),
    Var("engine_env", "mapping", {}, "extra variables for the engine's env file (e.g. CUDA_VISIBLE_DEVICES)"),
    Var("hf_token", "str (secret)", None, "HF_TOKEN for the engine (never printed)", "$HF_TOKEN here"),
    Var("HF_TOKEN", "str (secret)", None, "same as hf_token", "$HF_TOKEN here"),
    Var("cuda_home", "path", None, "CUDA_HOME for the engine", "the toolchain step's"),
    Var(
        "nvlink_multicast",
        "bool",
        True,
        "false: NVLink multicast (NVLS) off in the engine's environment: "
        + ", ".join(f"{k}={v}" for k, v in NVLS_OFF.items())
        + " (engine_env still wins)",
        "true (NCCL's own default)",
    ),
    Var("lab", "bool", False, "lab fixture: the engine is the stand-in (`k26ops lab up` sets it)"),
)


def poll_target(profile: dict) -> tuple[str, int]:
    """Where the engine answers, from the host itself: a wildcard bind is asked on loopback."""
    host = str(profile.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return host, int(profile.get("port") or DEFAULT_PORT)


def mapping(value, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"inventory var {what} must be a mapping, got {type(value).__name__}")
    return dict(value)


class EngineHost:
    """The engine as a deploy runs it on one host. `ctx` is a HostContext (vars,
    the run's state); `params` are the step's (unit, env_file, pass_env)."""

    def __init__(self, ctx, params: dict | None = None):
        self.ctx = ctx
        self.vars = ctx.vars
        self.params = dict(params or {})
        self.layout = Layout.of(ctx.vars)

    @property
    def unit(self) -> str:
        return check_unit_name(str(self.params.get("unit") or self.vars.get("engine_unit") or DEFAULT_UNIT))

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    @property
    def env_path(self) -> str:
        return str(self.params.get("env_file") or self.vars.get("engine_env_file") or units.ENV_FILE)

    @property
    def secrets_path(self) -> str:
        """The engine's secret flags (--api-key ...), root-only, beside the env file."""
        return launch.secrets_file_beside(self.env_path)

    @property
    def is_lab(self) -> bool:
        return self.vars.get("lab") is True

    @property
    def lab_module_path(self) -> str:
        return f"{self.layout.lab_module_dir}/{LAB_MODULE}.py"

    def profile(self) -> dict:
        """The release step's profile (recipe profile, then inventory `engine_profile`,
        model_path, draft_model_path, served_model_name, engine_port, launch_module,
        extra_flags), so the unit runs exactly the flags it validated; plus the
        release dir under this host's releases root."""
        profile = dict(profile_mod.engine_profile(self.ctx))
        if self.is_lab:
            profile.setdefault("launch_module", LAB_MODULE)
        profile["release_dir"] = self.layout.current
        profile["secrets_file"] = self.secrets_path
        return profile

    def api_key(self) -> str | None:
        """The engine's --api-key (an extra flag kept in the root-only secrets
        file), which every request but /health* must carry; None when it has none."""
        return launch.engine_flag_secrets(self.profile()).get("--api-key") or None

    def target(self) -> tuple[str, int]:
        """(address, port) to poll the engine at, from the host itself."""
        return poll_target(self.profile())

    def env(self) -> dict:
        """The env file's variables: inventory `engine_env`, HF_TOKEN from the
        inventory (hf_token/HF_TOKEN) or this control node's environment, CUDA_HOME
        from the inventory's `cuda_home`, NVLS off with `nvlink_multicast: false`, and
        PYTHONPATH for the lab stand-in."""
        hv = self.vars
        env = {str(k): v for k, v in mapping(hv.get("engine_env"), "engine_env").items()}
        for var in ("hf_token", "HF_TOKEN"):
            if hv.get(var) not in (None, "") and "HF_TOKEN" not in env:
                env["HF_TOKEN"] = hv[var]
        for name in self.params.get("pass_env", PASS_ENV):
            if name not in env and os.environ.get(name):
                env[name] = os.environ[name]
        cuda = hv.get("cuda_home")
        if cuda and "CUDA_HOME" not in env:
            env["CUDA_HOME"] = cuda
        if hv.get("nvlink_multicast") is False:  # hosts whose fabric must not use NVLS (multicast objects)
            for key, value in NVLS_OFF.items():
                env.setdefault(key, value)
        if self.is_lab:
            env["PYTHONPATH"] = self.layout.lab_module_dir
        return env

    def secrets(
        self, env: dict | None = None, old_env_text: str | None = None, old_secret_config: str | None = None
    ) -> list[str]:
        """Every value to redact, longest first: the env's secrets (default: `env()`),
        those in the host's current env file and secrets file, secret-named vars at
        any depth, secret flags' values, !vault values, and the passed-through environment."""
        out = secret_policy.secrets_of(self.env() if env is None else env)
        if old_env_text:
            out += [v for k, v, _s, _e in systemd.parse_env(old_env_text) if secret_policy.is_secret_key(k) and v]
        out += launch.secret_config_values(old_secret_config)
        out += secret_policy.secret_values(self.vars)
        for name in PASS_ENV:
            if os.environ.get(name):
                out.append(os.environ[name])
        return sorted(set(out), key=len, reverse=True)


def agent(session, op: str, timeout: float = 120.0, **req) -> dict:
    """Run one operation of the engine agent (agents/engine.py) on the host: one remote command."""
    return agents.run(session, "engine", op, timeout, what="host agent", **req)


def foreign_listener(port: int, unit: str, holder: dict, secrets: list[str] | None = None) -> str:
    """One line naming what holds the engine's port instead of `unit`'s process tree (the agent's
    `foreign` answer): pid, user, command; nothing was sent to it, the api key least of all."""
    what = (
        (
            f"pid {holder.get('pid')} (user {holder.get('user')}: "
            f"{secret_policy.redact(str(holder.get('command') or '?'), secrets or [])})"
        )
        if holder.get("pid")
        else (str(holder.get("command") or "an unknown process"))
    )
    return f"port {port} is held by {what}, not by {unit}'s engine; no request was sent to it"


@dataclass
class Ready:
    """Where a ready-wait stands: `state` is healthy, crashed (then `poll` is the
    agent's crash report), foreign (another process holds the port: `poll["holder"]`),
    timeout, interrupted, or waiting (passed to on_wait)."""

    state: str
    elapsed: float
    poll: dict  # the agent's last answer ({} before the first)
    base: dict | None  # MainPID, NRestarts, InvocationID of the run being waited for
    last_line: str = ""  # the last meaningful journal line seen, redacted


def wait_ready(
    session,
    unit: str,
    host: str,
    port: int,
    *,
    base: dict | None,
    timeout: float,
    secrets: list[str],
    window: float = 2.0,
    journal_lines: int | None = None,
    on_wait: Callable[[Ready], None] = lambda r: None,
    interruptible: bool = False,
    poll: Callable[[float, dict], dict] | None = None,
    request: dict | None = None,
) -> Ready:
    """Wait for the engine to answer /health and /health_generate, polling from
    the host in long-poll windows (one remote command each). A crash (unit
    failed, process exited or restarted since `base`) ends the wait at once;
    `on_wait` hears each window that ended without an answer; interruptible:
    Ctrl-C/SIGTERM/SIGHUP end it between windows. `poll(window, request)`
    replaces the engine agent's `poll` (a rehearsal's engine is no unit):
    the same answers (state healthy / crashed / loading, last_line). `request`: more of
    each poll's request (the engine cache to measure once healthy)."""
    t0 = time.monotonic()
    p: dict = {}
    last = ""
    while True:
        el = time.monotonic() - t0
        if interruptible and interrupt.requested.is_set():
            return Ready("interrupted", el, p, base, last)
        w = max(0.5, min(window, timeout - el))
        req = dict(request or {}, **({"journal_lines": journal_lines} if journal_lines is not None else {}))
        if poll is not None:
            p = poll(w, req)
        else:
            p = agent(session, "poll", timeout=w + 90, unit=unit, port=port, host=host, base=base, window=w, **req)
        base = p.get("base") or base
        el = time.monotonic() - t0
        if p["state"] in ("healthy", "crashed", "foreign"):
            return Ready(p["state"], el, p, base, last)
        if p.get("last_line"):
            last = secret_policy.redact(p["last_line"], secrets)
        on_wait(Ready("waiting", el, p, base, last))
        if el >= timeout:
            return Ready("timeout", el, p, base, last)
