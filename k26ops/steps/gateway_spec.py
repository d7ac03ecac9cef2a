"""The managed SGLang Model Gateway (`sglang-router`): what a gateway host runs,
worked out on the control node with no host access.

A host in the inventory group `gateway` runs the router as a release of its own,
beside (never inside) the engine's: the pinned wheel set of a gateway lock
(playbooks/gateway/sglang-router-VERSION.lock, every wheel with its sha256, made
by `k26ops gateway lock`), installed like an engine release (store, hash-checked
wheels, release dir, atomic `current`, prune) under <k26ops_root>/gateway, and a
unit of its own rendered from templates/sglang-router.service.j2.

The admin API key (`gateway_admin_key`, a secret) is never in argv: sglang-router
0.3.2 takes control-plane keys only as `--control-plane-api-keys id:name:role:key`
(router_args.py), so the unit runs a small launcher (templates/gateway_launch.py)
that reads the key from the 0600 env file and adds that argument in memory.

Engine hosts name their gateways (`gateways`: a gateway host's name or a URL);
the gateway registers those engines with POST /workers after every start.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from k26ops import resources
from k26ops.engine import launch, units
from k26ops.engine.profile import profile_for, recipe_for
from k26ops.errors import UserError
from k26ops.hostvars import Var, declare
from k26ops.layout import UNIT_DIR, Layout, check_unit_name
from k26ops.release import enginelock

GROUP = "gateway"
DEFAULT_VERSION = "0.3.2"
DEFAULT_PORT = 30080
DEFAULT_METRICS_PORT = 29000  # the router's own default (--prometheus-port)
DEFAULT_UNIT = "k26-gateway.service"
ENV_FILE = "/etc/k26ops/gateway.env"
KEY_ENV = "K26OPS_GATEWAY_ADMIN_KEY"  # the launcher reads and drops it (never in argv)
LOCKS_DIR = resources.path("playbooks") / "gateway"
LAUNCHER = units.TEMPLATES_DIR / "gateway_launch.py"
UNIT_TEMPLATE = "sglang-router.service.j2"
STOP_GRACE = 180  # --shutdown-grace-period-secs (the router's default, set explicitly)
# Flags the rendered command line sets itself (or the launcher, from the env file).
MANAGED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--prometheus-host",
        "--prometheus-port",
        "--worker-urls",
        "--control-plane-api-keys",
        "--api-key",
        "--shutdown-grace-period-secs",
    }
)

declare(
    __name__,
    "the managed gateway (hosts of the group `gateway`)",
    Var(
        "gateway_lock",
        "path (local)",
        None,
        "the gateway's lock (pinned sglang-router wheels with sha256)",
        f"playbooks/gateway/sglang-router-{DEFAULT_VERSION}.lock",
    ),
    Var("gateway_port", "int", DEFAULT_PORT, "the gateway's HTTP port (--port)"),
    Var("gateway_bind", "str", "0.0.0.0", "the address the gateway listens on (--host)"),
    Var("gateway_metrics_port", "int", DEFAULT_METRICS_PORT, "the gateway's Prometheus port (--prometheus-port)"),
    Var("gateway_flags", "mapping|list", {}, "extra sglang-router flags (not the ones k26ops sets)"),
    Var("gateway_unit", "str", DEFAULT_UNIT, "the gateway's systemd unit name (NAME.service)"),
    Var("gateway_admin_key", "str (secret)", None, "the gateway's admin API key (control plane; never in argv)"),
    Var(
        "gateway_health_timeout",
        "number (s)",
        120.0,
        "seconds to wait for the gateway's /health and its registered workers",
    ),
    Var(
        "gateways",
        "list",
        [],
        "an engine host's gateways: names of `gateway` group hosts, or URLs; where "
        "model_gateway is not set, the drain goes through them (their URLs and admin key)",
    ),
)


def _int(hvars: dict, key: str, default: int, host: str) -> int:
    v = hvars.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        raise UserError(f"{host}: inventory var {key}: expected a port 1-65535, got {v!r}")
    return v


@dataclass(frozen=True)
class GatewayLock:
    path: Path
    version: str
    python: str
    entries: tuple  # (name, version, sha256)
    sha256: str


def lock_path(hvars: dict) -> Path:
    given = hvars.get("gateway_lock")
    return Path(str(given)).expanduser() if given else LOCKS_DIR / f"sglang-router-{DEFAULT_VERSION}.lock"


def load_lock(path: Path) -> GatewayLock:
    lock = enginelock.load(path)
    if lock is None:
        raise UserError(f"{path}: gateway lock not found (make one with `k26ops gateway lock VERSION`)")
    pin = lock.meta.get("engine", "")
    m = re.fullmatch(r"sglang-router==(\S+)", pin)
    found = [v for n, v, _ in lock.entries if enginelock._norm(n) == "sglang-router"]
    if not m or found != [m.group(1)]:
        raise UserError(
            f"{path}: not a gateway lock: its header must say `# engine: sglang-router==VERSION` "
            "and the wheels must hold that sglang-router (remake it with `k26ops gateway lock`)"
        )
    return GatewayLock(path, m.group(1), lock.meta["python"], lock.entries, lock.sha256)


LOCK_HEADER = (
    "# k26ops gateway lock: made by `k26ops gateway lock {version} --python {python}`; review\n"
    "# changes as a diff. Gateway hosts install exactly these wheels (--require-hashes --no-index).\n"
)


def make_lock(version: str, python: str, index_urls=()) -> str:
    """The text of a gateway lock: sglang-router==`version` and its dependencies for cpython
    `python` on manylinux x86_64, each wheel with its sha256 (resolved by uv, as engine locks are)."""
    if not re.fullmatch(r"\d+(\.\d+)*([a-z0-9.+-]*)", version) or not re.fullmatch(r"3\.\d+", python):
        raise UserError(f"gateway lock: expected VERSION like 0.3.2 and --python like 3.11, got {version!r} {python!r}")
    entries = enginelock.resolve_requirements([f"sglang-router=={version}"], python, index_urls)
    meta = {
        "source": "registry",
        "engine": f"sglang-router=={version}",
        "python": python,
        "platform": enginelock.platform_line(python),
    }
    out = [LOCK_HEADER.format(version=version, python=python)]
    out += [f"# {k}: {v}\n" for k, v in meta.items()]
    for name, ver, sha in sorted(entries, key=lambda e: e[0].lower()):
        out.append(f"{name}=={ver} \\\n    --hash=sha256:{sha}\n")
    return "".join(out)


def release_id(lock: GatewayLock) -> str:
    """Content-named: the lock's bytes and the launcher's (a rollback restores both)."""
    h = hashlib.sha256(lock.sha256.encode() + hashlib.sha256(LAUNCHER.read_bytes()).hexdigest().encode())
    return f"sglang-router-{lock.version}-{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class GatewayHost:
    """Where the gateway lives on one host and how it is started (host vars only)."""

    name: str
    address: str
    port: int
    bind: str
    metrics_port: int
    unit: str
    flags: tuple
    admin_key: str | None
    layout: Layout

    @classmethod
    def of(cls, host) -> "GatewayHost":
        v = host.vars
        unit = check_unit_name(str(v.get("gateway_unit") or DEFAULT_UNIT))
        key = v.get("gateway_admin_key")
        if key is not None and (not isinstance(key, str) or not key.isprintable() or " " in key):
            raise UserError(
                f"{host.name}: inventory var gateway_admin_key: expected one word of text (value not shown)"
            )
        bind = str(v.get("gateway_bind") or "0.0.0.0")
        if not re.fullmatch(r"[0-9A-Za-z.:\[\]-]+", bind):
            raise UserError(f"{host.name}: inventory var gateway_bind: not an address: {bind!r}")
        return cls(
            host.name,
            str(host.address or host.name),
            _int(v, "gateway_port", DEFAULT_PORT, host.name),
            bind,
            _int(v, "gateway_metrics_port", DEFAULT_METRICS_PORT, host.name),
            unit,
            tuple(extra_flags(v.get("gateway_flags"), host.name)),
            key or None,
            Layout.of(v),
        )

    @property
    def releases_root(self) -> str:
        return f"{self.layout.root}/gateway"

    @property
    def current(self) -> str:
        return f"{self.releases_root}/current"

    @property
    def state_dir(self) -> str:
        """The previous unit and env file for a rollback (the engine's are under state/service)."""
        return f"{self.layout.state_dir}/gateway"

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    @property
    def url(self) -> str:
        """Where the control node (and the drain path) reaches it."""
        host = self.address
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def poll_host(self) -> str:
        """Where it answers from the host itself."""
        return "127.0.0.1" if self.bind in ("0.0.0.0", "::", "") else self.bind.strip("[]")

    def argv(self) -> list[str]:
        cur = self.current
        return [
            f"{cur}/venv/bin/python",
            f"{cur}/k26ops/gateway_launch.py",
            "--host",
            self.bind,
            "--port",
            str(self.port),
            "--prometheus-host",
            self.bind,
            "--prometheus-port",
            str(self.metrics_port),
            "--shutdown-grace-period-secs",
            str(STOP_GRACE),
            *self.flags,
        ]

    def env(self) -> dict:
        return {KEY_ENV: self.admin_key} if self.admin_key else {}

    def render_unit(self, release: str | None) -> str:
        text = units.render(
            UNIT_TEMPLATE,
            {"argv": self.argv(), "release_id": release, "env_file": ENV_FILE, "timeout_stop_sec": STOP_GRACE + 30},
        )
        if not text.startswith(units.UNIT_MARKER):
            raise UserError(f"template {UNIT_TEMPLATE} must start with the line '{units.UNIT_MARKER}...'")
        return text

    def render_env(self) -> str:
        return units.render_env({"env": self.env()})


def extra_flags(value, host: str) -> list[str]:
    """`gateway_flags`: a list of words or a mapping flag -> value (True: bare flag); never a flag k26ops sets."""
    return launch.unmanaged_words(
        value if value not in (None, {}) else None,
        f"{host}: inventory var gateway_flags",
        MANAGED_FLAGS,
        ": k26ops sets it (gateway_port, gateway_bind, gateway_metrics_port, gateway_admin_key, `gateways`)",
    )


# ---------------------------------------------------------------- which engines a gateway routes to


def named_gateways(host) -> list[str]:
    """An engine host's `gateways` entries (names or URLs)."""
    value = host.vars.get("gateways") or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise UserError(f"{host.name}: inventory var gateways: expected a list of gateway host names or URLs")
    return value


def engines_of(gw: GatewayHost, engines: list[dict]) -> list[dict]:
    """The engines (`worker` records: name, url, gateways, api_key) that name this gateway, by its
    host name or its URL."""
    mine = {gw.name, gw.url.rstrip("/")}
    return [e for e in engines if mine & {g.rstrip("/") for g in e["gateways"]}]


def engine_workers(hosts) -> list[dict]:
    """Every inventory host that names a gateway, as the worker it registers: its engine's URL
    (address and engine port, from its profile) and the engine's --api-key (the gateway sends it on)."""
    out, cache = [], {}
    for h in hosts:
        names = named_gateways(h)
        if not names:
            continue
        prof = profile_for(h.vars, recipe_for(h.vars, cache=cache))
        port = int(prof.get("port") or 30000)
        addr = str(h.address or h.name)
        url = f"http://[{addr}]:{port}" if ":" in addr else f"http://{addr}:{port}"
        out.append(
            {
                "name": h.name,
                "url": url,
                "gateways": names,
                "api_key": launch.engine_flag_secrets(prof).get("--api-key") or None,
            }
        )
    return out
