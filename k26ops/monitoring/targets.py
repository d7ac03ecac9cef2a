"""Scrape targets from the inventory: where each host's engine, DCGM exporter and
gateway answer, its api key, and the baseline's accept length. No host is contacted."""

from __future__ import annotations

from k26ops.engine import launch, profile
from k26ops.engine.host import poll_target
from k26ops.errors import UserError
from k26ops.monitoring.prometheus import HostTarget

DCGM_PORT = 9400
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def settings(vars: dict, host: str) -> dict:
    """The inventory's `monitoring`: true, or a mapping {dcgm_port: N (0: none), gateway: HOST:PORT}."""
    value = vars.get("monitoring")
    if value in (None, False):
        return {}
    if value is True:
        return {"dcgm_port": DCGM_PORT}
    if not isinstance(value, dict):
        raise UserError(
            f"host {host}: inventory var monitoring must be true or a mapping (dcgm_port, gateway), got {value!r}"
        )
    unknown = sorted(set(value) - {"dcgm_port", "gateway"})
    if unknown:
        raise UserError(
            f"host {host}: inventory var monitoring: unknown key {unknown[0]!r} (known: dcgm_port, gateway)"
        )
    port = value.get("dcgm_port", DCGM_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise UserError(
            f"host {host}: inventory var monitoring.dcgm_port must be a port number (0: none), got {port!r}"
        )
    gw = value.get("gateway")
    if gw is not None and (not isinstance(gw, str) or ":" not in gw or any(c.isspace() for c in gw)):
        raise UserError(f"host {host}: inventory var monitoring.gateway must be HOST:PORT, got {gw!r}")
    return {"dcgm_port": port, "gateway": gw}


def host_target(h, baseline_accept: float | None = None) -> tuple[HostTarget, list[str]]:
    """(the host's targets, warnings). The engine is scraped at the inventory's address, or at
    its bind address when it binds one (not loopback, not every interface)."""
    prof = profile.profile_for(h.vars, profile.recipe_for(h.vars))
    bind = str(prof.get("host") or "127.0.0.1")
    _addr, port = poll_target(prof)
    warnings = []
    addr = h.address if bind in ("0.0.0.0", "::", "", *LOOPBACK) else bind
    if bind in LOOPBACK and h.address not in LOOPBACK:
        warnings.append(
            f"{h.name}: the engine listens on {bind} only: a Prometheus on another machine cannot "
            f"scrape {h.address}:{port} (set engine_profile host: 0.0.0.0, or scrape from the host)"
        )
    mon = settings(h.vars, h.name) or {"dcgm_port": DCGM_PORT}
    key = launch.engine_flag_secrets(prof).get("--api-key") or None
    return HostTarget(
        host=h.name,
        engine=f"{_wrap(addr)}:{port}",
        dcgm=f"{_wrap(h.address)}:{mon['dcgm_port']}" if mon.get("dcgm_port") else None,
        gateway=mon.get("gateway"),
        api_key=key,
        baseline_accept=baseline_accept,
    ), warnings


def _wrap(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def baseline_accepts(stored: dict[str, dict]) -> dict[str, float]:
    """{host: the lowest accept length of the host's stored bench cells} (live traffic mixes
    temperatures: the lowest cell is the floor the alert measures against)."""
    out = {}
    for host, bench in stored.items():
        vals = [((c.get("figures") or {}).get("accept") or {}).get("median") for c in bench.get("cells") or []]
        vals = [v for v in vals if isinstance(v, (int, float)) and v > 0]
        if vals:
            out[host] = min(vals)
    return out
