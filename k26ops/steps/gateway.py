"""The managed gateway's steps (playbooks/gateway.yml): `gateway_release`,
`gateway_service`, `gateway_health`, `gateway_workers`. What they install is worked
out in k26ops.steps.gateway_spec; this module reads the host and changes it.

- `gateway_release` installs the gateway lock's wheels (hash-checked, from the pushed
  wheelhouse, linked from the root's store like an engine release) into
  <k26ops_root>/gateway/<id>/venv with the launcher, writes manifest.json last and
  points `current` at it by one rename; old gateway releases are pruned (keep 3).
  With `rollback: true` it builds nothing and points `current` at the previous one.
- `gateway_service` installs the unit and env file (0600: the admin key) through the
  engine agent's `apply` (systemd-analyze verify first, previous files kept under
  <k26ops_root>/state/gateway), restarting only when they or the release changed.
- `gateway_health` waits for /health with the unit watched; a crash or a timeout puts
  back the previous unit, env file and release, restarts it and registers the workers again.
- `gateway_workers` registers the engines of the hosts that name this gateway
  (POST /workers: after every start, since the router keeps its workers in memory) and
  waits until the gateway reports them healthy and /readiness says ready.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from k26ops.engine import secret_policy
from k26ops.errors import UserError
from k26ops.host import ownership
from k26ops.layout import switch_current
from k26ops.release import enginelock, installer, wheelhouse, wheelsource
from k26ops.runstate import HostState
from k26ops.shell import q
from k26ops.steps import Change, HostContext, Step, StepFailed, tied_to_channel
from k26ops.steps.engine import foreign_unit, plan_file, plan_unit_run
from k26ops.steps.gateway_spec import (
    ENV_FILE,
    GROUP,
    LAUNCHER,
    GatewayHost,
    engines_of,
    load_lock,
    lock_path,
    named_gateways,
    release_id,
)
from k26ops.steps.release import deliver_wheels, prune
from k26ops.traffic.gateway import Gateway, GatewayError
from k26ops.transport import agents

DEFAULT_TIMEOUT = 120.0


@dataclass
class GatewayDecision(HostState):
    """What the gateway's release step decided (read by the service step and the undo)."""

    release_id: str | None = None
    previous: str | None = None  # where `current` pointed before this run
    changed: bool = False  # this run moved `current`
    wheels: list = field(default_factory=list)
    lock: object = None
    prune: list = field(default_factory=list)
    claim_root: bool = False
    service_changed: bool = False  # the service step replaced the unit or env file (or may have)
    restarted: bool = False
    todo: dict = field(default_factory=dict, repr=False)  # what the service step's apply asks the agent


def _gw(ctx: HostContext) -> GatewayHost:
    return GatewayHost.of(ctx.host)


def _python(ctx: HostContext) -> str:
    return ".".join(((ctx.facts.get("python3") or {}).get("version") or "3.11").split(".")[:2])


def _read_current(rel: str, rid: str) -> str:
    return (
        f"cd {q(rel)} 2>/dev/null && {{ readlink current; echo ===; test -f {q(rid)}/manifest.json && "
        "echo complete; }; true"
    )


class GatewayRelease(Step):
    name = "gateway_release"
    fact_names = ("python3",)

    def before_hosts(self, hosts) -> None:
        for h in hosts:
            GatewayHost.of(h)
            if not self.params.get("rollback"):
                load_lock(lock_path(h.vars))
            installer.choice(h.vars, h.name)
            wheelsource.settings(h)

    def prepare(self, ctx: HostContext) -> None:
        if self.params.get("rollback"):
            return
        d = GatewayDecision.of(ctx)
        lock = load_lock(lock_path(ctx.vars))
        if lock.python != _python(ctx):
            raise StepFailed(
                f"the gateway lock {lock.path.name} is for python {lock.python}, this host has python "
                f"{_python(ctx)}: make one with `k26ops gateway lock {lock.version} --python "
                f"{_python(ctx)}` and set gateway_lock"
            )
        ctx.progress(f"gateway: the {len(lock.entries)} locked wheels of sglang-router {lock.version}")
        d.wheels = wheelhouse.ensure(
            enginelock.requirement_lines(lock.entries), no_deps=True, python=lock.python, hashes=True
        )
        d.lock, d.release_id = lock, release_id(lock)

    def plan(self, ctx: HostContext) -> list[Change]:
        gw, d = _gw(ctx), GatewayDecision.of(ctx)
        rel = gw.releases_root
        st = ownership.state(ctx.session, rel, "releases")
        why = ownership.refusal(rel, "releases", st)
        if why:
            raise StepFailed(why.replace("releases_root", "the gateway's releases dir"))
        d.claim_root = st["state"] != "owned"
        if self.params.get("rollback"):
            changes = self._plan_rollback(ctx, gw, d)
            ctx.report["gateway_release"] = d.release_id
            return changes
        rid = ctx.report["gateway_release"] = d.release_id
        out = ctx.run(_read_current(rel, rid)).stdout
        target, _, rest = out.partition("===")
        d.previous = target.strip() or None
        complete = "complete" in rest
        if d.previous == rid and complete:
            return []
        changes = []
        if not complete:
            changes.append(
                Change(
                    f"build gateway release {rid} in {rel}/{rid} (sglang-router {d.lock.version}, "
                    f"{len(d.wheels)} wheels, lock {d.lock.sha256[:12]})",
                    action="build",
                )
            )
        changes.append(Change(f"switch gateway current: {d.previous or '(none)'} -> {rid}", action="switch"))
        keep = int(self.params.get("keep", 3))
        d.prune = ownership.prune_plan(ownership.releases(ctx.session, rel), rid, keep, set())
        if d.prune:
            changes.append(
                Change(
                    f"prune {len(d.prune)} old gateway release(s) (keep {keep}): " + ", ".join(d.prune), action="prune"
                )
            )
        return changes

    def _plan_rollback(self, ctx: HostContext, gw: GatewayHost, d: GatewayDecision) -> list[Change]:
        cur = ctx.run(_read_current(gw.releases_root, "current")).stdout.partition("===")[0].strip() or None
        older = [r for r in ownership.releases(ctx.session, gw.releases_root) if r != cur]
        complete = [r for r in older if ctx.run(f"test -f {q(gw.releases_root + '/' + r + '/manifest.json')}").ok]
        if not complete:
            raise StepFailed(f"no previous gateway release to roll back to in {gw.releases_root} (current: {cur})")
        d.previous, d.release_id = cur, complete[0]
        return [Change(f"switch gateway current: {cur or '(none)'} -> {complete[0]} (rollback)", action="switch")]

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        gw, d = _gw(ctx), GatewayDecision.of(ctx)
        if d.claim_root:
            ownership.claim(ctx.session, gw.releases_root)
        if any(c.action == "build" for c in changes):
            self._build(ctx, gw, d)
        ctx.run(switch_current(gw.releases_root, d.release_id), check=True)
        d.changed = True
        if d.prune:
            prune(ctx.session, gw.releases_root, ctx.root, d.prune)

    def undo(self, ctx: HostContext) -> str | None:
        d = GatewayDecision.of(ctx)
        if not d.changed or not d.previous:
            return None
        ctx.session.run(switch_current(_gw(ctx).releases_root, d.previous, require_manifest=False), check=True)
        return f"gateway current points at {d.previous} again"

    def _build(self, ctx: HostContext, gw: GatewayHost, d: GatewayDecision) -> None:
        rid, wh = d.release_id, ctx.layout.wheelhouse_dir
        path = f"{gw.releases_root}/{rid}"
        wheelhouse.need_free(ctx.session, gw.releases_root, 3 * sum(w.size for w in d.wheels), f"gateway release {rid}")
        ctx.run(
            f"rm -rf {q(path)} && mkdir -p {q(path)}/k26ops && echo {q(rid)} > {q(path + '/' + ownership.RELEASE_MARKER)}",
            check=True,
        )
        how = installer.choice(ctx.vars, ctx.host.name)
        try:
            deliver_wheels(ctx, d.wheels, wh, how)
            ctx.session.put_file(LAUNCHER, f"{path}/k26ops/gateway_launch.py")
            ctx.session.put(wheelhouse.requirements_file(d.wheels).encode(), f"{path}/k26ops/requirements.txt")
            ctx.progress(f"building gateway release {rid} ({how} install --require-hashes from the pushed wheels)")
            # the launcher's --help imports the router (its Rust module included) and exits 0: the venv works
            script = (
                f"set -e; cd {q(path)}; python3 -m venv venv; "
                f"{installer.install_command(how, ctx.root, wh, True)}; "
                "venv/bin/python k26ops/gateway_launch.py --help >/dev/null"
            )
            res = ctx.run(tied_to_channel(script), timeout=1800)
            if not res.ok:
                lines = (res.stdout + "\n" + res.stderr).strip().splitlines()
                raise StepFailed(f"building gateway release {rid} failed: {lines[-1] if lines else 'no output'}")
            manifest = {
                "release_id": rid,
                "sglang_router": d.lock.version,
                "python": d.lock.python,
                "lock_sha256": d.lock.sha256,
                "wheels": [{"name": w.name, "sha256": w.sha256} for w in d.wheels],
                "installer": f"uv {installer.UV_VERSION}" if how == "uv" else "pip",
            }
            ctx.session.put(json.dumps(manifest, indent=1, sort_keys=True).encode(), f"{path}/manifest.json")
        except BaseException:
            ctx.run(f"rm -rf {q(path)}")
            raise


# ---------------------------------------------------------------- the unit


def _agent_paths(gw: GatewayHost) -> dict:
    return {"unit": gw.unit, "unit_path": gw.unit_path, "env_path": ENV_FILE, "secrets_path": None}


class GatewayService(Step):
    name = "gateway_service"
    fact_names = ()

    def plan(self, ctx: HostContext) -> list[Change]:
        gw, d = _gw(ctx), GatewayDecision.of(ctx)
        cur = agents.run(
            ctx.session, "engine", "read", what="engine agent", current=gw.current, lab_module=None, **_agent_paths(gw)
        )
        rid = d.release_id or (os.path.basename(cur["current"]) if cur["current"] else None)
        why = foreign_unit(gw.unit, gw.unit_path, cur.get("unit"), cur.get("show") or {})
        if why:
            raise StepFailed(f"refusing gateway_unit {gw.unit}: {why}; name another unit (gateway_unit)")
        secrets = [gw.admin_key] if gw.admin_key else []
        changes, todo, reasons = [], {}, []
        verb = {k: "install" if cur[k] is None else "update" for k in ("unit", "env")}
        plan_file(
            cur,
            "unit",
            gw.unit_path,
            gw.render_unit(rid),
            f"{verb['unit']} {gw.unit_path} (checked with systemd-analyze verify first)",
            secrets,
            changes,
            todo,
            reasons,
        )
        if not plan_file(
            cur,
            "env",
            ENV_FILE,
            gw.render_env(),
            f"{verb['env']} {ENV_FILE} (mode 0600)",
            secrets,
            changes,
            todo,
            reasons,
        ) and cur["env_mode"] not in (None, 0o600):
            changes.append(Change(f"chmod 0600 {ENV_FILE} (was {cur['env_mode']:04o})"))
        if d.changed:
            reasons.append("release")
        plan_unit_run(cur["show"], gw.unit, changes, todo, reasons)
        d.todo = todo
        return changes

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        gw, d = _gw(ctx), GatewayDecision.of(ctx)
        ctx.progress(f"gateway: installing {gw.unit}")
        d.service_changed = True  # from here on a failure rolls the files back
        res = agents.run(
            ctx.session,
            "engine",
            "apply",
            700,
            what="engine agent",
            state_dir=gw.state_dir,
            lab_module=None,
            **_agent_paths(gw),
            **d.todo,
        )
        if not res.get("ok"):
            out = secret_policy.redact(res.get("output") or "", [gw.admin_key] if gw.admin_key else [])
            if res.get("error") == "verify":
                d.service_changed = False
                raise StepFailed(
                    f"systemd-analyze verify rejected the new {gw.unit}; the installed unit was left "
                    f"in place: {' | '.join(out.splitlines()[-3:])[:400]}"
                )
            raise StepFailed(f"systemctl {res.get('error')} {gw.unit} failed: {' '.join(out.split())[-300:]}")
        d.restarted = bool(d.todo.get("restart") or d.todo.get("start"))
        ctx.report["gateway_restarted"] = d.restarted

    def undo(self, ctx: HostContext) -> str | None:
        d = GatewayDecision.get(ctx)
        if d is None or not (d.service_changed or d.changed):
            return None
        return roll_back(ctx)


def roll_back(ctx: HostContext) -> str:
    """The previous unit, env file and release back, restarted, healthy, its workers registered again."""
    gw, d = _gw(ctx), GatewayDecision.of(ctx)
    ctx.progress("gateway: rolling back to the previous unit, env file and release")
    try:
        res = agents.run(
            ctx.session,
            "engine",
            "rollback",
            700,
            what="engine agent",
            state_dir=gw.state_dir,
            current=gw.current,
            previous_release=d.previous if d.changed else None,
            **_agent_paths(gw),
        )
    except StepFailed as exc:
        return f"gateway rollback failed: {exc}"
    if not res.get("ok"):
        return f"gateway rollback failed: {res.get('error')}"
    if not res.get("had_unit"):
        return "no previous gateway: the new unit was stopped and removed"
    back = f"rolled the gateway back to {d.previous}" if d.changed and d.previous else "rolled the gateway's unit back"
    r = poll(ctx, gw, float(ctx.vars.get("gateway_health_timeout") or DEFAULT_TIMEOUT))
    if r["state"] != "healthy":
        return f"{back}, but it is not healthy ({r.get('why') or r['state']})"
    engines = _engines(ctx)
    if engines:
        try:
            got = register(gw, engines, float(ctx.vars.get("gateway_health_timeout") or DEFAULT_TIMEOUT))
        except StepFailed as exc:
            return f"{back}; healthy, but {exc}"
        if got["unhealthy"]:
            return f"{back}; healthy, but worker(s) not healthy in it: {', '.join(got['unhealthy'])}"
    return f"{back}; healthy, {len(engines)} worker(s) registered again"


# ---------------------------------------------------------------- health


def poll(ctx: HostContext, gw: GatewayHost, timeout: float) -> dict:
    return agents.run(
        ctx.session,
        "gateway",
        "poll",
        timeout + 60,
        what="gateway agent",
        unit=gw.unit,
        host=gw.poll_host,
        port=gw.port,
        wait=timeout,
    )


class GatewayHealth(Step):
    name = "gateway_health"
    fact_names = ()

    def plan(self, ctx: HostContext) -> list[Change]:
        if ctx.check:
            return []
        gw, d = _gw(ctx), GatewayDecision.of(ctx)
        timeout = float(self.params.get("timeout") or ctx.vars.get("gateway_health_timeout") or DEFAULT_TIMEOUT)
        ctx.progress(f"gateway: waiting for {gw.unit} /health")
        r = poll(ctx, gw, timeout)
        if r["state"] == "healthy":
            ctx.report["gateway_health"] = {"state": "healthy", "wait_s": r["wait_s"]}
            # seen healthy: the install is settled, so the next failed deploy restores this one (the engine
            # agent keeps an unsettled install's prev/, what ran before it, as the engine step's settle says)
            agents.run(ctx.session, "engine", "settle", 60, what="engine agent", state_dir=gw.state_dir)
            return []
        secrets = [gw.admin_key] if gw.admin_key else []
        tail = [line for line in secret_policy.redact(r.get("journal") or "", secrets).splitlines() if line.strip()]
        what = r.get("why") or f"not healthy after {timeout:.0f}s (/health {r.get('health')})"
        msg = f"{gw.unit} {what}" + (f"; last log line: {tail[-1][:300]}" if tail else "")
        ctx.report["gateway_health"] = {"state": r["state"]}
        if d.service_changed or d.changed:
            back = roll_back(ctx)
            ctx.report["rollback"] = back
            raise StepFailed(f"{msg}; {back}")
        raise StepFailed(msg)

    def apply(self, ctx, changes):  # pragma: no cover - plan never returns changes
        pass


# ---------------------------------------------------------------- workers (the Gateway API)


def api(gw: GatewayHost, method: str, path: str, body: dict | None = None, timeout: float = 10.0):
    """One Gateway API call from the control node: (status, parsed JSON or text), status 0 with the
    reason when the gateway does not answer. The drain's client (traffic.gateway) makes the call:
    the admin key in the Authorization header only, never in a message."""
    try:
        status, got = Gateway(gw.url, gw.admin_key, timeout).request(method, path, body)
    except GatewayError as exc:
        return 0, str(exc)
    return status, got[:300] if isinstance(got, str) else got


def listed(gw: GatewayHost) -> dict[str, dict]:
    """The gateway's workers by URL (GET /workers)."""
    status, body = api(gw, "GET", "/workers")
    if status != 200 or not isinstance(body, dict):
        hint = " (gateway_admin_key?)" if status in (401, 403) else ""
        raise StepFailed(f"GET {gw.url}/workers answered {status or 'nothing'}{hint}: {str(body)[:200]}")
    return {w.get("url", "").rstrip("/"): w for w in body.get("workers") or []}


REPOST_S = 15.0  # a worker POSTed but not listed this long after is POSTed again


def register(gw: GatewayHost, engines: list[dict], timeout: float) -> dict:
    """POST /workers for each engine the gateway lacks, one at a time, then wait until the gateway
    reports every one healthy (bounded); {"registered": [...], "healthy": [...], "unhealthy": [...]}.
    The router adds a POSTed worker in a background workflow (202): the next is POSTed only once
    this one is listed (two at once for one model once left one of them out, in a loaded CI run),
    and one still not listed REPOST_S after its POST is POSTed again."""
    end = time.monotonic() + timeout
    have = listed(gw)
    added: list[str] = []
    for e in engines:
        posted = None
        while e["url"] not in have and time.monotonic() < end:
            if posted is None or time.monotonic() - posted >= REPOST_S:
                body = {"url": e["url"], **({"api_key": e["api_key"]} if e.get("api_key") else {})}
                status, answer = api(gw, "POST", "/workers", body)
                if status not in (200, 201, 202):
                    raise StepFailed(
                        f"POST {gw.url}/workers {e['url']} ({e['name']}) answered {status}: {str(answer)[:200]}"
                    )
                posted = time.monotonic()
                if e["name"] not in added:
                    added.append(e["name"])
            time.sleep(0.1)
            have = listed(gw)
    while True:
        ok = [e["name"] for e in engines if (have.get(e["url"]) or {}).get("is_healthy")]
        if len(ok) == len(engines) or time.monotonic() >= end:
            return {
                "registered": added,
                "healthy": ok,
                "unhealthy": [e["name"] for e in engines if e["name"] not in ok],
            }
        time.sleep(0.5)
        have = listed(gw)


def _engines(ctx: HostContext) -> list[dict]:
    step = next((s for s in ctx.steps if isinstance(s, GatewayWorkers)), None)
    return engines_of(_gw(ctx), (step.params.get("engines") if step else None) or [])


class GatewayWorkers(Step):
    """Register the engines of the hosts that name this gateway; wait until they are healthy there.
    `engines` (param): every inventory host's worker record (gateway_spec.engine_workers)."""

    name = "gateway_workers"
    fact_names = ()

    def plan(self, ctx: HostContext) -> list[Change]:
        gw = _gw(ctx)
        engines = _engines(ctx)
        try:
            have = listed(gw)
        except StepFailed:
            if not ctx.check:
                raise
            have = {}  # --check before the first deploy: nothing answers yet
        missing = [e for e in engines if e["url"] not in have]
        if not ctx.check and not missing:
            self._report(ctx, gw, engines, {"registered": []})
        return [Change(f"register worker {e['url']} ({e['name']}) with {gw.url} (POST /workers)") for e in missing]

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        gw = _gw(ctx)
        engines = _engines(ctx)
        ctx.progress(f"gateway: registering {len(changes)} worker(s)")
        self._report(ctx, gw, engines, None)

    def _report(self, ctx: HostContext, gw: GatewayHost, engines: list[dict], done: dict | None) -> None:
        timeout = float(ctx.vars.get("gateway_health_timeout") or DEFAULT_TIMEOUT)
        got = register(gw, engines, timeout) if engines else {"registered": [], "healthy": [], "unhealthy": []}
        status, _ = api(gw, "GET", "/readiness")
        ctx.report["gateway"] = {"url": gw.url, "workers": len(engines), **got, "readiness": status}
        if got["unhealthy"]:
            ctx.progress(f"gateway: not healthy there after {timeout:.0f}s: {', '.join(got['unhealthy'])}")


def drain_targets(inv, hosts) -> None:
    """An engine host that names managed gateways (`gateways`) and no `model_gateway` drains through
    them (k26ops.traffic.drain): their URLs become its model_gateway and their admin key its
    model_gateway_api_key, filled into its vars as multinode.assign fills a node's. UserError (one
    line) for a name that is no gateway host, or gateways with different admin keys."""
    gw_hosts = {h.name: h for h in (inv.host(n) for n in inv.groups.get(GROUP) or [])}
    for h in hosts:
        names = named_gateways(h)
        if not names or h.vars.get("model_gateway") is not None:
            continue
        check_engines([{"name": h.name, "gateways": names}], gw_hosts.values(), set(inv.hosts))
        urls, keys = [], set()
        for g in names:
            gh = GatewayHost.of(gw_hosts[g]) if g in gw_hosts else None
            urls.append(gh.url if gh else g)
            keys |= {gh.admin_key} if gh and gh.admin_key else set()
        if len(keys) > 1 and h.vars.get("model_gateway_api_key") is None:
            raise UserError(
                f"{h.name}: inventory var gateways: {', '.join(names)} have different admin keys: "
                "give the host model_gateway_api_key (one key all of them accept)"
            )
        h.vars["model_gateway"] = urls
        if keys and h.vars.get("model_gateway_api_key") is None:
            h.vars["model_gateway_api_key"] = keys.pop()


def check_engines(engines: list[dict], gateway_hosts, all_names: set[str]) -> None:
    """A `gateways` entry that is neither a gateway host nor a URL is a typo: one line naming it."""
    gw_names = {h.name for h in gateway_hosts}
    for e in engines:
        for g in e["gateways"]:
            if not g.startswith(("http://", "https://")) and g not in gw_names:
                where = "is not in the group `gateway`" if g in all_names else "is no inventory host"
                raise UserError(f"{e['name']}: inventory var gateways: {g!r} {where} (name a gateway host or a URL)")
