"""`k26ops snapshot --tag TAG`: record the selected hosts' known-good state in
the baselines repository, commit it, tag it, and pin its releases on the hosts.

Per host one remote call reads everything (hostscript `snapshot`); the
control node checks it all (health, canonical files, no secret anywhere),
and only then writes: one commit + annotated tag, then one call per host to
add the release to <k26ops_root>/state/pinned-releases (prune keeps it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from k26ops import facts as facts_mod
from k26ops.baselines import hostscript
from k26ops.baselines.pins import pin_release
from k26ops.baselines.repo import Baselines, check_tag_name
from k26ops.engine import secret_policy, systemd
from k26ops.engine.host import EngineHost, agent, foreign_listener
from k26ops.engine.multinode import serves_http
from k26ops.enginebench.run import run_host
from k26ops.errors import UserError
from k26ops.orchestrate import rollout
from k26ops.release import engine_source
from k26ops.release import recipe as recipe_mod
from k26ops.shell import q
from k26ops.steps import HostContext
from k26ops.steps import engine as engine_steps
from k26ops.steps.engine import smoke_summary
from k26ops.transport.fleet import Connections, Outcome
from k26ops.weights import manifest as mf

FACT_NAMES = ("gpus", "nvidia_smi", "cuda_toolkit", "os_release", "python3")
SMOKE_PROMPT = "Say hello in one short sentence."


def host_target(session) -> tuple[HostContext, dict]:
    """The host's context and its engine's unit, env file, port (as a deploy sees them)."""
    ctx = HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
    eh = EngineHost(ctx)
    host, port = eh.target()
    return ctx, {
        "unit": eh.unit,
        "unit_path": eh.unit_path,
        "env_path": eh.env_path,
        "host": host,
        "port": port,
        "releases_root": ctx.releases_root,
        "api_key": eh.api_key(),
    }


def run_smoke(session, t: dict) -> dict:
    """The deploy's smoke requests (greedy, then sampled), as the deploy records them."""
    r = agent(
        session,
        "smoke",
        timeout=300,
        port=t["port"],
        host=t["host"],
        unit=t["unit"],
        api_key=t.get("api_key"),
        prompt=SMOKE_PROMPT,
        max_new_tokens=16,
        timeout_s=120.0,
        requests=engine_steps.smoke_requests({}),
    )
    if r.get("foreign"):
        return {
            "ok": False,
            "failed": r["failed"],
            "status": None,
            "crashed": False,
            "why": foreign_listener(t["port"], t["unit"], r["foreign"]),
        }
    if r["failed"]:
        last = r["results"][-1]
        return {"ok": False, "failed": r["failed"], "status": last["status"], "crashed": bool(r.get("crash"))}
    return engine_steps.smoke_outcome(r["results"])


def known_secrets(ctx: HostContext, env_text: str | None) -> list[str]:
    return EngineHost(ctx).secrets(old_env_text=env_text)


def sha256(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _rebuild_check(recipe_text: str, recipe_path: Path, manifest: dict, lock_text: str | None) -> tuple[bool, str]:
    """Would this recipe file (with its lock and the recorded patches) give the same release id?"""
    try:
        r = recipe_mod.parse(recipe_text, recipe_path)
    except UserError as exc:
        return False, f"recipe does not load: {exc}"
    lock_sha = sha256(lock_text)
    if lock_text is None:
        return False, f"the recipe's lock {r.lock_path} is missing"
    pats = [SimpleNamespace(name=p["name"], sha256=p["sha256"]) for p in manifest.get("patches") or []]
    try:
        rid = recipe_mod.release_id(r, lock_sha, pats)
    except UserError as exc:
        return False, str(exc)
    if rid != manifest.get("release_id"):
        return False, (
            f"the recipe file {recipe_path} (and its lock) now give release {rid}, not "
            f"{manifest.get('release_id')}: they changed since the release was built"
        )
    return True, "recipe + lock + recorded patches give the same release id"


def model_entry(recipe, manifest_text: str | None, release_manifest: dict) -> dict | None:
    """The weights of this known-good state (issue 44): the recipe's model manifest (its
    identity, the hash of its entry lines) beside the one the release was built with."""
    if recipe is None or recipe.model is None:
        return None
    built = (release_manifest.get("model") or {}).get("manifest_sha256")
    try:
        sha = mf.parse(manifest_text, str(recipe.model.manifest)).sha256 if manifest_text is not None else None
    except UserError:
        sha = None
    return {
        "name": recipe.model.name,
        "manifest": str(recipe.model.manifest),
        "manifest_sha256": sha,
        "release_manifest_sha256": built,
    }


def gather_host(session, tag: str, now: str) -> tuple[Outcome, dict[str, bytes], dict]:
    """One remote call; returns (report row, files for the repository, the host's record)."""
    ctx, t = host_target(session)
    name = session.host.name
    req = dict(
        {k: v for k, v in t.items() if k != "api_key"},
        facts=facts_mod.command_list(list(FACT_NAMES)),
        prompt=SMOKE_PROMPT,
        max_new_tokens=16,
    )
    raw = hostscript.call(session, "snapshot", timeout=240, **req)
    raw["smoke"] = run_smoke(session, t) if raw["health"]["state"] == "healthy" else None
    rel = raw["release"]
    m = rel.get("manifest")
    if not rel.get("current"):
        raise hostscript.HostScriptFailed(f"no release is deployed ({t['releases_root']}/current missing)")
    if not isinstance(m, dict):
        raise hostscript.HostScriptFailed(f"release {rel['current']} has no readable manifest.json")
    secrets = known_secrets(ctx, raw.get("env"))
    base = f"hosts/{name}"
    files: dict[str, bytes] = {}

    def put(path: str, data, redact: bool = True):
        if isinstance(data, (dict, list)):
            data = json.dumps(data, indent=1, sort_keys=True) + "\n"
        if isinstance(data, str):
            data = (secret_policy.redact(data, secrets) if redact else data).encode()
        files[f"{base}/{path}"] = data

    drift = sorted(p for p, h in (m.get("patched_files") or {}).items() if rel["hashes"].get(p) != h)
    # facts: parsed on this node, as a deploy would
    parsed = facts_mod.parse_results(raw["facts"], list(FACT_NAMES))
    gpus = (parsed.get("gpus") or {}).get("gpus") or []
    facts = {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "driver": gpus[0].get("driver_version") if gpus else None,
        "cuda_toolkit": parsed.get("cuda_toolkit"),
        "os": parsed.get("os_release"),
        "python3": parsed.get("python3"),
    }
    recipe_path = recipe_mod.resolve(ctx.vars.get("recipe"))
    try:
        recipe_text = Path(recipe_path).read_text()
    except OSError as exc:
        raise UserError(f"{recipe_path}: cannot read recipe: {exc.strerror}") from None
    lock_text = model_text = rp = None
    try:
        rp = recipe_mod.parse(recipe_text, Path(recipe_path))
        py = ((facts["python3"] or {}).get("version") or "").split(".")[:2]
        if len(py) == 2 and ".".join(py) in rp.pythons:  # the lock this host's release was made from
            rp = recipe_mod.for_python(rp, ".".join(py))
        if rp.lock_path.exists():
            lock_text = rp.lock_path.read_text()
        if rp.model is not None and rp.model.manifest.exists():
            model_text = rp.model.manifest.read_text()
    except UserError:
        pass
    rebuildable, why = _rebuild_check(recipe_text, Path(recipe_path), m, lock_text)
    shipped = raw["release"].get("patches") or {}
    series = [
        ln.strip()
        for ln in (shipped.get("series") or "").splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    env_text = raw.get("env")
    env_base = secret_policy.env_for_baseline(env_text) if env_text is not None else None
    secret_keys = sorted(
        {k for k, v, _s, _e in systemd.parse_env(env_text or "") if secret_policy.is_secret_item(k, v)}
    )
    unit_text = raw.get("unit")
    health, smoke = raw["health"], raw.get("smoke")
    health_state = health["state"]
    if health_state == "healthy" and not (smoke or {}).get("ok"):
        health_state = "unhealthy"
        st = (smoke or {}).get("status")
        health["why"] = (smoke or {}).get("why") or (
            f"smoke /generate failed (HTTP {st}"
            + (": the engine wants its api key; is extra_flags api-key in this inventory?)" if st == 401 else ")")
        )
    elif health_state != "healthy" and not health.get("why"):
        health["why"] = (
            f"unit {health_state}"
            if health_state == "inactive"
            else f"/health {health.get('health')}, /health_generate {health.get('health_generate')}"
        )
    cmdline = raw.get("cmdline") or m.get("engine_argv")
    unit_file = f"unit/{t['unit']}"
    env_file = f"env/{Path(t['env_path']).name}"
    record = {
        "host": name,
        "tag": tag,
        "taken_at": now,
        "release_id": rel["current"],
        "releases_root": t["releases_root"],
        "site_packages": m.get("site_packages"),
        "unit": {"name": t["unit"], "path": t["unit_path"], "file": unit_file, "sha256": sha256(unit_text)},
        "env": {
            "path": t["env_path"],
            "file": env_file,
            "sha256_redacted": sha256(env_base),
            "secret_keys": secret_keys,
            "marker": secret_policy.REDACTED,
        },
        "patched_files": m.get("patched_files") or {},
        "drift": drift,
        "engine": m.get("engine"),
        "patches": m.get("patches") or [],
        "shipped_series": series,
        "engine_argv": m.get("engine_argv"),
        "cmdline": cmdline,
        "health": health_state,
        "smoke": smoke,
        "rebuildable": rebuildable,
        "rebuild_check": why,
        "recipe_source": str(recipe_path),
        "model": model_entry(rp, model_text, m),
    }
    manifest = {**m, "packages": rel.get("packages") or {}}
    put("baseline.json", record)
    put("manifest.json", manifest)
    put("recipe.yml", recipe_text)
    if lock_text is not None:
        put("engine.lock", lock_text, redact=False)
    if model_text is not None:
        put("model.manifest", model_text, redact=False)
    for pname, text in shipped.items():
        put(f"patches/{pname}", text or "", redact=False)
    if unit_text is not None:
        put(unit_file, unit_text)
    if env_base is not None:
        put(env_file, env_base)
    put("engine-cmdline.txt", " ".join(q(a) for a in (cmdline or [])) + "\n")
    put("facts.json", facts)
    put("health.json", {"health": health, "smoke": smoke})
    if rel.get("patch_state"):
        put("patch-state.json", rel["patch_state"])
    for path, b64 in sorted((rel.get("files") or {}).items()):
        files[f"{base}/files/{path}"] = base64.b64decode(b64)
    row = Outcome(
        release=rel["current"],
        health=health_state,
        accept=(smoke or {}).get("spec_accept_length"),
        latency_ms=round(smoke["latency_s"] * 1000) if smoke and smoke.get("latency_s") is not None else None,
        files=len(rel.get("files") or {}),
        rebuildable=rebuildable,
        drift=drift,
    )
    return (
        row,
        files,
        {
            "record": record,
            "secrets": secrets,
            "why": health.get("why"),
            "probe": rel.get("probe_files") or rel.get("probe_dirs") or [],
        },
    )


def _summary_line(host: str, rec: dict) -> str:
    return (
        f"{host}: {rec['release_id']}  {rec['health']}  smoke {smoke_summary(rec.get('smoke') or {})}"
        f"  {len(rec['patched_files'])} patched file(s)"
        + ("" if rec["rebuildable"] else "  (not rebuildable: " + rec["rebuild_check"] + ")")
    )


def open_repo(tag: str, *, force: bool = False, baselines_dir=None) -> Baselines:
    """The repository a snapshot `tag` goes into; UserError (nothing written) when
    the tag is bad or taken, or the files a snapshot writes have local changes."""
    check_tag_name(tag)
    repo = Baselines(baselines_dir)
    if repo.has_tag(tag) and not force:
        raise UserError(
            f"baseline tag {tag!r} already exists in {repo.path} (use --force to move it); nothing was written"
        )
    dirty = repo.dirty_owned()
    if dirty:
        raise UserError(
            f"{repo.path} has uncommitted changes in files a snapshot writes: "
            f"{', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''} "
            "(commit or move them first); nothing was written"
        )
    return repo


def snapshot(
    repo: Baselines,
    hosts,
    options,
    tag: str,
    message: str | None = None,
    *,
    force: bool = False,
    allow_unhealthy: bool = False,
    log=lambda m: None,
    bench=None,
) -> dict:
    """Take the snapshot of `hosts` into `repo` (open_repo); raise UserError
    (nothing written) on any refusal.
    `bench` (an enginebench BenchSpec): also bench each healthy host and store
    the results as hosts/<host>/bench.json."""
    t0 = time.monotonic()
    now = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    files: dict[str, bytes] = {}
    records: dict[str, dict] = {}

    def work(session):
        row, f, info = gather_host(session, tag, now)
        if bench is not None and info["record"]["health"] == "healthy" and serves_http(session.host.vars):
            ctx = HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
            b = run_host(ctx, bench, lambda m: log(f"{session.host.name}: {m}"))
            f[f"hosts/{session.host.name}/bench.json"] = (json.dumps(b, indent=1, sort_keys=True) + "\n").encode()
            info["record"]["bench"] = b["generator"]
            row["bench"] = b["generator"]
        files.update(f)
        records[session.host.name] = info
        return row

    conns = Connections(options)  # the pins go over the same connections
    try:
        run = rollout.run(hosts, work, options, on_event=lambda h, m: log(f"{h}: {m}"), connections=conns)
        if run.interrupted:
            raise run.interrupted
        results = run.results
        failed = [r for r in results if r.status not in ("ok", "changed")]
        if failed:
            raise UserError(
                "snapshot refused, nothing was written: "
                + "; ".join(f"{r.host}: {r.status}: {r.error}" for r in failed)
            )
        probed = [
            f"{h}: a probe is left applied to release {i['record']['release_id']} ({', '.join(i['probe'][:3])}): "
            "`k26ops deploy` or `rollback` reverts it"
            for h, i in records.items()
            if i.get("probe")
        ]
        if probed:  # what runs is not the release's: never a baseline, --allow-unhealthy or not
            raise UserError("snapshot refused, nothing was written: " + "; ".join(probed))
        bad = [
            f"{h}: {i['record']['health']}" + (f" ({i['why']})" if i.get("why") else "")
            for h, i in records.items()
            if i["record"]["health"] != "healthy"
        ]
        bad += [
            f"{h}: files differ from release manifest ({', '.join(i['record']['drift'][:3])})"
            for h, i in records.items()
            if i["record"]["drift"]
        ]
        if bad and not allow_unhealthy:
            raise UserError(
                "snapshot refused (use --allow-unhealthy to record it anyway), nothing was written: " + "; ".join(bad)
            )
        secrets = sorted({s for i in records.values() for s in i["secrets"] if len(s) >= 4}, key=len, reverse=True)
        for path, data in files.items():
            for s in secrets:
                if s.encode() in data:
                    raise UserError(f"snapshot refused: {path} would contain a secret value; nothing was written")
        order = [h.name for h in hosts]
        recs = {h: records[h]["record"] for h in order}
        index = {
            "tag": tag,
            "taken_at": now,
            "message": message or "",
            "control_node": socket.gethostname(),
            "hosts": {
                h: {
                    "release_id": r["release_id"],
                    "health": r["health"],
                    "spec_accept_length": (r.get("smoke") or {}).get("spec_accept_length"),
                    "latency_s": (r.get("smoke") or {}).get("latency_s"),
                    "patched_files": len(r["patched_files"]),
                    "rebuildable": r["rebuildable"],
                    "bench": r.get("bench"),
                }
                for h, r in recs.items()
            },
        }
        files["baseline.json"] = (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()
        releases = sorted({r["release_id"] for r in recs.values()})
        healthy = all(r["health"] == "healthy" for r in recs.values())
        title = f"k26ops baseline {tag}: {len(recs)} host(s) on {', '.join(releases)}, " + (
            "all healthy" if healthy else "NOT all healthy"
        )
        body = "\n".join(_summary_line(h, r) for h, r in recs.items())
        detail = []
        for h, r in recs.items():
            detail.append(
                f"{h}:\n  release {r['release_id']} (rebuildable: {'yes' if r['rebuildable'] else 'no'})\n"
                + "".join(f"  {line}\n" for line in engine_source.describe(r.get("engine")))
                + "".join(f"  patch {p['name']} sha256 {p['sha256'][:16]}\n" for p in r["patches"])
                + "".join(f"  file {p} sha256 {(s or 'deleted')[:16]}\n" for p, s in sorted(r["patched_files"].items()))
                + f"  unit {r['unit']['path']} sha256 {(r['unit']['sha256'] or 'missing')[:16]}\n"
                f"  env {r['env']['path']} (secrets {', '.join(r['env']['secret_keys']) or 'none'}: "
                f"recorded as {secret_policy.REDACTED})"
            )
        msg_head = f"{title}\n\n" + (f"{message}\n\n" if message else "")
        commit_msg = msg_head + body + "\n\n" + "\n".join(detail) + f"\n\nTaken {now} by k26ops snapshot.\n"
        tag_msg = msg_head + body + f"\n\nTaken {now}.\n"
        for s in secrets:
            if s in commit_msg or s in tag_msg:
                raise UserError("snapshot refused: the message would contain a secret value; nothing was written")
        commit = repo.commit_snapshot(files, commit_msg, tag, tag_msg, force=force)
        # Pin the releases on the hosts so prune keeps them.
        pin_err = {}

        def pin(session):
            rid = recs[session.host.name]["release_id"]
            pin_release(session, rid)  # the pins file's one writer, under the host lock
            return Outcome(pinned=rid)

        pinned = rollout.run(hosts, pin, options, on_event=lambda h, m: log(f"{h}: {m}"), connections=conns)
        if pinned.interrupted:
            raise pinned.interrupted
        for r in pinned.results:
            if r.status not in ("ok", "changed"):
                pin_err[r.host] = r.error
        for r in results:
            r.data["pinned"] = r.host not in pin_err
    finally:
        conns.close()
    return {
        "tag": tag,
        "commit": commit,
        "repo": str(repo.path),
        "results": results,
        "pin_errors": pin_err,
        "elapsed_s": round(time.monotonic() - t0, 2),
        "title": title,
        "hosts": order,
    }
