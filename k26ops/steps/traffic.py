"""Step `traffic`, and the service step's call before it stops the engine: the drain
(k26ops.traffic.drain) wired into a playbook.

- `before_stop(ctx, svc, restart=)` runs in the service step's apply, before any signal:
  out of rotation, in-flight requests waited for (Ctrl-C there puts the worker back and
  the old engine keeps serving).
- `traffic`, the playbook's last step (after health and smoke, and a rollback's verify),
  puts the host back and waits until every gateway lists it healthy; a host whose engine
  failed never gets here (health and smoke fail the host), so it is never put back.
  Where this run did not restart the engine, the step still converges: a healthy engine that
  a gateway does not list (a new model_gateway, a host a failed run left out) is registered
  (`--check` shows it as a change).
- `unit_settings(ctx, settings)`: the unit's TimeoutStopSec, larger than drain_timeout;
  `unit_text_stop_timeout(ctx, text)` the same for a unit k26ops did not render now (a rollback's tag).
The host's report gets `traffic` (the drain's record: seconds, requests, out of rotation).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from k26ops.engine.host import EngineHost
from k26ops.engine.multinode import serves_http
from k26ops.runstate import HostState
from k26ops.steps import Change, HostContext, Step, StepFailed
from k26ops.traffic.drain import Drain, TrafficConfig
from k26ops.traffic.gateway import Gateway, GatewayError


@dataclass
class Rotation(HostState):
    """The host's drain in this run (None: no stop, or no traffic configured)."""

    drain: Drain | None = None


def config(ctx: HostContext) -> TrafficConfig:
    return TrafficConfig.of(ctx.host, ctx.vars)


def unit_settings(ctx: HostContext, settings: dict) -> dict:
    """The unit's settings with TimeoutStopSec larger than drain_timeout (where the host drains)."""
    cfg = config(ctx)
    want = cfg.timeout_stop_sec()
    if want is None:
        return settings
    have = settings.get("timeout_stop_sec")
    if have is not None:
        if not isinstance(have, (int, float)) or have <= cfg.drain_timeout:
            raise StepFailed(
                f"unit_settings timeout_stop_sec {have!r} is not larger than drain_timeout "
                f"{cfg.drain_timeout:g}: systemd would SIGKILL a drain; nothing was changed"
            )
        return settings
    return {**settings, "timeout_stop_sec": want}


_SPAN = re.compile(r"(?:(\d+)\s*(?:min|m))?\s*(?:(\d+)\s*s?)?")


def _stop_seconds(value: str) -> float | None:
    """TimeoutStopSec's value in seconds (`120`, `120s`, `2min`, `1min 30s`, `infinity`); None: unreadable."""
    v = value.strip()
    if v == "infinity":
        return math.inf
    m = _SPAN.fullmatch(v)
    if not v or not m:
        return None
    return int(m[1] or 0) * 60 + int(m[2] or 0)


def unit_text_stop_timeout(ctx: HostContext, text: str) -> tuple[str, str | None]:
    """A unit written elsewhere (a rollback's tag, recorded verbatim) with its TimeoutStopSec raised
    above this host's drain_timeout where it is not (systemd would SIGKILL the drain): (text, what
    was changed, or None)."""
    want = config(ctx).timeout_stop_sec()
    if want is None:
        return text, None
    lines = text.splitlines(keepends=True)
    section, service_at, found = None, None, []
    for i, line in enumerate(lines):
        st = line.strip()
        if st.startswith("[") and st.endswith("]"):
            section = st
            service_at = i if st == "[Service]" else service_at
        elif section == "[Service]" and st.split("=", 1)[0].strip() == "TimeoutStopSec":
            found.append(i)
    if service_at is None:
        return text, None
    if found:
        have = _stop_seconds(lines[found[-1]].split("=", 1)[1])  # systemd: the last assignment wins
        if have is not None and have > config(ctx).drain_timeout:
            return text, None
        old = lines[found[-1]].strip()
        lines[found[-1]] = f"TimeoutStopSec={want}\n"
        return "".join(lines), f"{old} -> TimeoutStopSec={want} (larger than drain_timeout)"
    lines.insert(service_at + 1, f"TimeoutStopSec={want}\n")
    return "".join(lines), f"TimeoutStopSec={want} added (larger than drain_timeout)"


def before_stop(ctx: HostContext, svc, *, restart: bool) -> None:
    """Before the service step restarts (restart=True) or starts the engine: take the host out
    of rotation and drain it (a start has nothing to drain; the traffic step registers it)."""
    cfg = config(ctx)
    if ctx.check or not cfg.drains or not serves_http(ctx.vars):
        return
    d = Drain(
        cfg,
        ctx.host.name,
        ctx.session,
        engine_host=svc.host,
        engine_port=svc.port,
        engine_api_key=svc.api_key,
        progress=ctx.progress,
    )
    Rotation(drain=d).put(ctx)
    ctx.report["traffic"] = d.record
    if restart:
        d.take_out()


class TrafficStep(Step):
    """Back into rotation once the engine this run restarted answers health and smoke."""

    name = "traffic"
    fact_names = ()

    def plan(self, ctx: HostContext) -> list[Change]:
        rot = Rotation.get(ctx)
        if rot is None or rot.drain is None:
            return self._unlisted(ctx)
        if ctx.check:
            return []
        d = rot.drain
        if d.cfg.mode in ("gateway", "hook"):
            ctx.progress("traffic: back into rotation")
            d.put_back()
        else:
            d.serving_again()
        ctx.report["traffic"] = d.record
        return []

    def _unlisted(self, ctx: HostContext) -> list[Change]:
        """Gateways that do not list this host's (not restarted, healthy) engine: a change each."""
        cfg = config(ctx)
        if cfg.mode != "gateway" or not serves_http(ctx.vars):
            return []
        out = []
        for url in cfg.gateways:
            gw = Gateway(url, cfg.api_key)
            try:
                listed = gw.find(cfg.worker_url) is not None
            except GatewayError as exc:
                raise StepFailed(f"traffic: {exc}") from None
            if not listed:
                out.append(Change(f"register {cfg.worker_url} at gateway {gw.name} (POST /workers)", action=url))
        return out

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        eh = EngineHost(ctx)
        host, port = eh.target()
        d = Drain(
            replace(config(ctx), gateways=tuple(c.action for c in changes)),
            ctx.host.name,
            ctx.session,
            engine_host=host,
            engine_port=port,
            engine_api_key=eh.api_key(),
            progress=ctx.progress,
        )
        d.put_back()
        ctx.report["traffic"] = {**d.record, "registered": [Gateway(c.action).name for c in changes]}
