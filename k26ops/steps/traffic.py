"""Step `traffic`, and the service step's call before it stops the engine: the drain
(k26ops.traffic.drain) wired into a playbook.

- `before_stop(ctx, svc, restart=)` runs in the service step's apply, before any signal:
  out of rotation, in-flight requests waited for (Ctrl-C there puts the worker back and
  the old engine keeps serving).
- `traffic`, the playbook's last step (after health and smoke, and a rollback's verify),
  puts the host back and waits until every gateway lists it healthy; a host whose engine
  failed never gets here (health and smoke fail the host), so it is never put back.
- `unit_settings(ctx, settings)`: the unit's TimeoutStopSec, larger than drain_timeout.
The host's report gets `traffic` (the drain's record: seconds, requests, out of rotation).
"""

from __future__ import annotations

from dataclasses import dataclass

from k26ops.multinode import serves_http
from k26ops.runstate import HostState
from k26ops.steps import Change, HostContext, Step, StepFailed
from k26ops.traffic.drain import Drain, TrafficConfig


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
            raise StepFailed(f"unit_settings timeout_stop_sec {have!r} is not larger than drain_timeout "
                             f"{cfg.drain_timeout:g}: systemd would SIGKILL a drain; nothing was changed")
        return settings
    return {**settings, "timeout_stop_sec": want}


def before_stop(ctx: HostContext, svc, *, restart: bool) -> None:
    """Before the service step restarts (restart=True) or starts the engine: take the host out
    of rotation and drain it (a start has nothing to drain; the traffic step registers it)."""
    cfg = config(ctx)
    if ctx.check or not cfg.drains or not serves_http(ctx.vars):
        return
    d = Drain(cfg, ctx.host.name, ctx.session, engine_host=svc.host, engine_port=svc.port,
              engine_api_key=svc.api_key, progress=ctx.progress)
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
        if ctx.check or rot is None or rot.drain is None:
            return []
        d = rot.drain
        if d.cfg.mode in ("gateway", "hook"):
            ctx.progress("traffic: back into rotation")
            d.put_back()
        else:
            d.serving_again()
        ctx.report["traffic"] = d.record
        return []

    def apply(self, ctx, changes):  # pragma: no cover - plan never returns changes
        pass
