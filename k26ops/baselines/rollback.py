"""`k26ops rollback --tag TAG`: bring each host back to what the tag recorded.

Per host (under the host lock, through the playbook runner):
  baseline_release  the recorded release if it is still on the host and its
                    patched files match the tag's hashes: switch `current` to
                    it; otherwise rebuild it from the tag (its recipe file,
                    recorded lock, shipped patches under their recorded names:
                    the same commit and release id), then switch.
  baseline_service  the tag's unit file as recorded (its TimeoutStopSec raised
                    above the host's drain_timeout where it is not: systemd
                    never SIGKILLs a drain, k26ops.steps.traffic); its env file with the
                    secrets filled in from the inventory / environment (as a
                    deploy does), and the secret-flags file its unit reads
                    (--config) from the inventory's flags: a baseline never
                    holds a secret; restart when anything changed.
  health, smoke     the deploy's own steps; a failure rolls the host back to
                    the unit, env file and release it ran before.
  baseline_verify   the running release's patched files, unit and release id
                    equal the tag's; otherwise roll back as above.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from k26ops.baselines import drift, hostscript
from k26ops.baselines.repo import Baselines
from k26ops.engine import launch, profile, secret_policy, systemd
from k26ops.engine.host import EngineHost
from k26ops.errors import UserError
from k26ops.orchestrate.rollout import playbook_work
from k26ops.release import installer
from k26ops.runstate import HostState
from k26ops.steps import Change, HostContext, Step, StepFailed
from k26ops.steps import engine as engine_steps
from k26ops.steps import release as release_step
from k26ops.steps import traffic as traffic_step
from k26ops.steps.release import ReleaseDecision
from k26ops.steps.traffic import TrafficStep
from k26ops.transport import agents


def _b(step: Step, ctx: HostContext) -> dict:
    """This host's part of the tag (the steps' param `baselines`: host_baselines' answer)."""
    return step.params["baselines"][ctx.host.name]


@dataclass
class BaselineCheck(HostState):
    """What baseline_release found of the tag's release on the host before any step changed it."""

    probe: dict  # the host script's probe: the release, `current`, the unit and env file
    mode: str  # "switch" (the release is there as recorded) or "rebuild"
    damage: str  # what is wrong with it on the host, said in the plan and messages


@dataclass
class BaselineUnit(HostState):
    """The tag's unit text as this rollback writes it (None: the tag has none), and what differs
    from the recorded one (the TimeoutStopSec a drain needs), or None."""

    text: str | None
    note: str | None = None


def baseline_unit(ctx: HostContext, b: dict) -> BaselineUnit:
    if b["unit_text"] is None:
        return BaselineUnit(None)
    return BaselineUnit(*traffic_step.unit_text_stop_timeout(ctx, b["unit_text"]))


@dataclass
class BaselineEnv(HostState):
    """The tag's env file with its secrets filled in from the inventory (None: the tag has none)."""

    text: str | None = field(default=None, repr=False)  # holds secrets: never in a repr


class BaselineRelease(Step):
    """Switch `current` to the recorded release, rebuilding it first when it is gone or damaged."""

    name = "baseline_release"

    def prepare(self, ctx: HostContext) -> None:
        b = _b(self, ctx)
        rec = b["record"]
        rid = rec["release_id"]
        # full: every file of the release read against its wheels' RECORD (what it switches to runs these bytes)
        probe = hostscript.call(
            ctx.session,
            "probe",
            releases_root=ctx.releases_root,
            release=rid,
            verify="full",
            unit_path=rec["unit"]["path"],
            env_path=rec["env"]["path"],
            timeout=1800,
        )
        r = probe["release"]
        m = r.get("manifest") or {}
        probed = set(r.get("probe_files") or [])  # a probe a killed run left: reverted by apply, not rebuilt
        bad = sorted(p for p, h in rec["patched_files"].items() if r["hashes"].get(p) != h and p not in probed)
        damaged = r.get("record_bad") or []
        ok = (
            r["exists"]
            and m.get("release_id") == rid
            and (m.get("patched_files") or {}) == rec["patched_files"]
            and not bad
            and not damaged
        )
        found = BaselineCheck(
            probe,
            "switch" if ok else "rebuild",
            "missing"
            if not r["exists"]
            else "no manifest"
            if not m
            else f"{len(bad)} file(s) differ"
            if bad
            else f"{len(damaged)} file(s) differ from their wheels' RECORD "
            f"({', '.join(d['path'] + ': ' + d['why'] for d in damaged[:2])})"
            if damaged
            else "manifest differs",
        ).put(ctx)
        if ok:
            return
        if not rec.get("rebuildable"):
            raise StepFailed(
                f"release {rid} is {found.damage} on the host and the tag cannot rebuild it: {rec.get('rebuild_check')}"
            )
        profile.use_recorded(ctx, b["override"])
        ctx.progress(f"baseline: release {rid} {found.damage}: preparing a rebuild from the tag")
        prep = release_step.prepare(ctx)
        if prep.release_id != rid:
            raise StepFailed(
                f"the tag's sources give release {prep.release_id}, not the recorded {rid}; not rebuilding"
            )
        ReleaseDecision.of(ctx).prepare(ctx, prep)

    def plan(self, ctx: HostContext) -> list[Change]:
        rid = _b(self, ctx)["record"]["release_id"]
        found = BaselineCheck.of(ctx)
        cur = found.probe["release"]["current"]
        d = ReleaseDecision.of(ctx)
        d.release_id, d.previous = rid, cur
        changes = []
        if found.mode == "rebuild":
            changes.append(Change(f"rebuild release {rid} from the baseline ({found.damage} on the host)"))
        elif found.probe["release"].get("probe_dirs"):
            changes.append(
                Change(
                    f"revert the probe left applied in release {rid} "
                    f"({', '.join(found.probe['release']['probe_dirs'])})",
                    action="unprobe",
                )
            )
        if cur != rid or changes:
            changes.append(Change(f"switch current: {cur or '(none)'} -> {rid}"))
        return changes

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        rid = _b(self, ctx)["record"]["release_id"]
        d = ReleaseDecision.of(ctx)
        found = BaselineCheck.of(ctx)
        if found.mode == "rebuild":
            inodes = [x["ino"] for x in found.probe["release"].get("record_bad") or [] if x.get("ino")]
            if inodes:  # the damaged files' store entries (hard links share the inode): unpacked again
                agents.run(
                    ctx.session,
                    "store",
                    "evict",
                    600,
                    what="store agent",
                    store=installer.store_dir(ctx.root),
                    inodes=inodes,
                )
            release_step.Release()._build(ctx, d.prepared)
            ctx.report["release_rebuilt"] = True
        elif any(c.action == "unprobe" for c in changes):
            ctx.report["probe_reverted"] = release_step.revert_probes(
                ctx, f"{ctx.releases_root}/{rid}", found.probe["release"]["probe_dirs"]
            )
        release_step.point_current(ctx, rid)
        d.changed = True

    def undo(self, ctx: HostContext) -> str | None:
        return release_step.undo_switch(ctx)


class BaselineService(engine_steps.ServiceStep):
    """The tag's unit (verbatim) and env file (secrets from the inventory/environment)."""

    name = "baseline_service"
    preflight = False  # the tag's unit names its own model and drafter

    def prepare(self, ctx: HostContext) -> None:
        b = _b(self, ctx)
        env_text = b["env_text"]
        if env_text is None:
            BaselineEnv(None).put(ctx)
            return
        eh = EngineHost(ctx)
        # a tag from before the secrets file kept secret flags in the env file as K26OPS_SECRET_*
        want = {
            **eh.env(),
            **{secret_policy.secret_ref_name(f): v for f, v in launch.engine_flag_secrets(eh.profile()).items()},
        }
        for key, value, start, end in reversed(systemd.parse_env(env_text)):
            if value == b["record"]["env"].get("marker", secret_policy.REDACTED):  # a secret name or a credential in it
                if want.get(key) in (None, ""):
                    raise StepFailed(
                        f"the baseline's env file needs {key}: set it in the inventory "
                        f"(or the control node's environment) as for a deploy"
                    )
                env_text = env_text[:start] + systemd.env_quote(want[key]) + env_text[end:]
        BaselineEnv(env_text).put(ctx)

    def plan(self, ctx: HostContext) -> list[Change]:
        b = _b(self, ctx)
        rec = b["record"]
        unit, upath, epath = rec["unit"]["name"], rec["unit"]["path"], rec["env"]["path"]
        spath = launch.secrets_file_beside(epath)
        eh = EngineHost(ctx)
        cur = engine_steps.agent(
            ctx.session,
            "read",
            unit=unit,
            unit_path=upath,
            env_path=epath,
            current=eh.layout.current,
            lab_module=None,
            secrets_path=spath,
        )
        env_text = BaselineEnv.of(ctx).text
        secrets = eh.secrets(old_env_text=cur["env"], old_secret_config=cur.get("secrets"))
        show = cur["show"]
        # the deploy's constructor: the same fields, the engine's api_key included (smoke needs it)
        svc = engine_steps.ServiceState.build(
            eh,
            secrets=secrets,
            unit=unit,
            unit_path=upath,
            env_path=epath,
            port=b.get("port"),
            show=show,
            secrets_path=spath,
        ).put(ctx)
        changes, todo, reasons = [], {}, []
        secret_text = None
        bu = baseline_unit(ctx, b).put(ctx)
        if b["unit_text"] is not None and f"--config {spath}" in b["unit_text"]:
            secret_text = launch.engine_launch(eh.profile())[1]
            if secret_text is None:
                raise StepFailed(
                    f"the baseline's unit reads secret engine flags from {spath}: set them "
                    "(extra_flags: api-key ...) in the inventory as for a deploy"
                )
        engine_steps.plan_secret_config(spath, cur, secret_text, changes, todo, reasons)
        if bu.text is not None:
            engine_steps.plan_file(
                cur,
                "unit",
                upath,
                bu.text,
                f"restore {upath} from the baseline" + (f" ({bu.note})" if bu.note else ""),
                secrets,
                changes,
                todo,
                reasons,
            )
        if env_text is not None:
            engine_steps.plan_file(
                cur,
                "env",
                epath,
                env_text,
                f"restore {epath} from the baseline (mode 0600, secrets from the inventory)",
                secrets,
                changes,
                todo,
                reasons,
            )
        return engine_steps.plan_enable_and_restart(ctx, svc, show, unit, changes, todo, reasons)


class BaselineVerify(Step):
    """What now runs must be the tag's: release id, patched file hashes, unit file."""

    name = "baseline_verify"

    def plan(self, ctx: HostContext) -> list[Change]:
        if ctx.check:
            return []
        b = _b(self, ctx)
        rec = b["record"]
        # the same call records the tag on the host: `status` names it among tags of the same content
        p = hostscript.call(
            ctx.session,
            "probe",
            releases_root=ctx.releases_root,
            release=None,
            unit_path=rec["unit"]["path"],
            env_path=rec["env"]["path"],
            tag_file=drift.tag_file(ctx.state_dir),
            record_tag=rec.get("tag"),
        )
        r = p["release"]
        why = []
        if r["current"] != rec["release_id"]:
            why.append(f"current is {r['current']}, not {rec['release_id']}")
        bad = sorted(k for k, h in rec["patched_files"].items() if r["hashes"].get(k) != h)
        if bad:
            why.append(f"patched files differ: {', '.join(bad[:3])}")
        want_unit = (BaselineUnit.get(ctx) or baseline_unit(ctx, b)).text
        if want_unit is not None and p["unit"] != want_unit:
            why.append("unit file differs")
        if why:
            engine_steps.fail_and_roll_back(
                ctx,
                engine_steps.ServiceState.of(ctx),
                "after rollback the host does not match the baseline: " + "; ".join(why),
            )
        out = ctx.report
        out["verified_files"] = len(rec["patched_files"])
        out["baseline"] = rec.get("tag")
        return []

    def apply(self, ctx, changes):  # pragma: no cover - plan never returns changes
        pass


def steps(baselines: dict) -> list[Step]:
    """The rollback's playbook: the tag's release and unit, the deploy's health and smoke, then
    verify. `baselines`: host_baselines' answer, the tag's steps' input."""
    tagged = {"baselines": baselines}
    return [
        BaselineRelease(tagged),
        BaselineService(tagged),
        engine_steps.HealthStep(),
        engine_steps.SmokeStep(),
        BaselineVerify(tagged),
        TrafficStep(),
    ]  # back into rotation only once verified healthy


def host_baselines(repo: Baselines, tag: str, hosts: list[str], workdir: Path) -> dict:
    """Per host: the tag's record, unit and env text, and the rebuild override (files under workdir)."""
    info = repo.tag(tag)
    index_hosts = list((info.index or {}).get("hosts") or {})
    missing = [h for h in hosts if h not in index_hosts]
    if missing:
        raise UserError(
            f"baseline {tag!r} has no record of {', '.join(missing)} (it holds: "
            f"{', '.join(index_hosts) or 'no hosts'}); use --limit; nothing was changed"
        )
    out = {}
    for h in hosts:
        rec = repo.host_record(tag, h)
        if rec is None:
            raise UserError(f"baseline {tag!r}: hosts/{h}/baseline.json is missing; nothing was changed")
        base = f"hosts/{h}"
        unit = repo.read(tag, f"{base}/{rec['unit']['file']}")
        env = repo.read(tag, f"{base}/{rec['env']['file']}")
        d = workdir / h
        pdir = d / "patches"
        pdir.mkdir(parents=True)
        for name, data in repo.files_under(tag, f"{base}/patches").items():
            (pdir / name).write_bytes(data)
        series = rec.get("shipped_series") or []
        names = [p["name"] for p in rec.get("patches") or []]
        if len(series) != len(names):
            raise UserError(f"baseline {tag!r}: {h}: shipped series and recorded patches disagree")
        recipe_text = (repo.read(tag, f"{base}/recipe.yml") or b"").decode()
        doc = yaml.safe_load(recipe_text) or {}
        doc.setdefault("patches", {})
        doc["patches"] = {**(doc.get("patches") or {}), "series": str(pdir / "series")}
        eng = doc.get("engine") if isinstance(doc.get("engine"), dict) else {}
        src = eng.get("source") if isinstance(eng.get("source"), dict) else None
        engine_base = f"sglang@{src.get('commit')}" if src else f"sglang=={eng.get('sglang')}"
        (pdir / "series").write_text(f"# Base: {engine_base}\n" + "".join(f"{s}\n" for s in series))
        lock = repo.read(tag, f"{base}/engine.lock")
        if isinstance(doc.get("engine"), dict):  # git sources and registry releases alike
            if lock is None:
                raise UserError(
                    f"baseline {tag!r}: {h}: the engine's lock (hosts/{h}/engine.lock) was not "
                    "recorded; this baseline cannot rebuild its engine"
                )
            name = (((rec.get("engine") or {}).get("lock") or {}).get("file")) or "engine.lock"
            name = name if "/" not in name and not name.startswith((".", "-")) else "engine.lock"
            (d / name).write_bytes(lock)  # its own name: the rebuilt release's provenance is the same
            doc["engine"]["lock"] = name  # beside recipe.yml: a recipe's lock path stays in its directory
        if isinstance(doc.get("model"), dict):  # the weights' manifest beside recipe.yml, as the tag kept it
            model = repo.read(tag, f"{base}/model.manifest")
            if model is None:  # a tag from before it was kept: the rebuilt release records no weights
                doc.pop("model")
            else:
                (d / "model.manifest").write_bytes(model)
                doc["model"]["manifest"] = "model.manifest"
        (d / "recipe.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        src = (rec.get("engine") or {}).get("source") or {}
        override = {
            "recipe": str(d / "recipe.yml"),
            "source_url": src.get("git"),
            "patches": [(n, str(pdir / s)) for n, s in zip(names, series)],
            "engine_argv": rec.get("engine_argv"),
        }
        # the port the recorded engine really ran with (its command line), not the one of
        # whichever run first built this release (the manifest's engine_argv)
        argv = rec.get("cmdline") or rec.get("engine_argv") or []
        port = int(argv[argv.index("--port") + 1]) if "--port" in argv[:-1] else None
        out[h] = {
            "record": rec,
            "port": port,
            "unit_text": unit.decode() if unit is not None else None,
            "env_text": env.decode() if env is not None else None,
            "override": override,
        }
    return out


def open_repo(tag: str, baselines_dir=None) -> Baselines:
    """The repository holding `tag` (UserError naming the known tags otherwise)."""
    repo = Baselines(baselines_dir)
    if not repo.exists():
        raise UserError(f"no baselines repository at {repo.path}: no tags to roll back to; nothing was changed")
    repo.tag(tag)  # unknown tag: one line listing the known ones
    return repo


@contextmanager
def prepared(repo: Baselines, tag: str, hosts: list[str], *, check: bool = False):
    """The rollback of `hosts` to `tag` as a rollout's work(session, progress);
    the tag's files (recipe, lock, patches) lie in a temporary directory while it runs."""
    workdir = Path(tempfile.mkdtemp(prefix="k26ops-rollback-"))
    try:
        per_host = host_baselines(repo, tag, hosts, workdir)
        yield playbook_work(steps(per_host), check=check, purpose=f"rollback to {tag}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# The rollback's table columns (k26ops.cli shows them).
COLUMNS = [
    ("release", "release"),
    ("changed", "_changed"),
    ("engine", "_engine"),
    ("health", "_health"),
    ("smoke", "_smoke"),
    ("verified", "verified_files"),
]
