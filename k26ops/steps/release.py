"""The release step: build the patched engine into its own release directory
and make it current by one atomic symlink switch.

A release is identified by its content (engine source: registry pins, or git
commit + dependency lock; patch series); the same inputs give the same id and
nothing is rebuilt. Before any host is touched, the control node assembles the
release once: the engine wheel (downloaded, or built from the pinned commit),
the locked dependency wheels, the patch series applied to the wheel's own
files, and the engine flags and launch rules checked against them. A patch
that does not apply, a flag the engine does not know or a lock that does not
belong to the commit stops the run with every host unchanged.

On the host the build goes into <releases>/<id>/: a venv installed from the
pushed wheels only (`uv pip install --require-hashes --no-index --offline`,
files hard-linked from the root's store; or pip: k26ops/release/installer.py),
then the series, and is
complete only when its manifest.json is written, last. `current` only ever
points at a complete release: `ln -s` to a temp name, then `mv -T` over
`current` (rename(2) is atomic). A failed build is removed and the previous
release stays current.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from k26ops.engine import launch
from k26ops.engine.profile import (
    effective_recipe,
    engine_profile,
    lock_for,
    profile_for,  # noqa: F401 (re-exported)
    recipe_for,
    release_override,
)
from k26ops.errors import UserError
from k26ops.facts import engine_cache
from k26ops.facts.base import Fact, safe
from k26ops.host import ownership
from k26ops.layout import Layout, switch_current
from k26ops.release import (
    engine_flags,
    engine_source,
    enginelock,
    installer,
    launch_rules,
    patchset,
    prepcache,
    wheelhouse,
    wheelsource,
)
from k26ops.release import recipe as recipe_mod
from k26ops.runstate import HostState
from k26ops.shell import q
from k26ops.steps import Change, HostContext, Step, StepFailed, tied_to_channel
from k26ops.transport import agents
from k26ops.weights import manifest as mf

PATCHSET_SCRIPT = Path(patchset.__file__)


@dataclass
class Prepared:
    """What the control node knows about a release before any host builds it."""

    release_id: str
    recipe: recipe_mod.Recipe
    engine: dict  # provenance: base, source, wheel, lock
    engine_wheel: wheelhouse.Wheel
    lock: enginelock.Lock
    patches: list
    patch_dir: Path  # series + patch files, as shipped
    wheels: list  # everything the host installs, the engine wheel included
    requirements: str  # the host's pip requirements file: every wheel with its sha256
    patch_state: dict  # from applying the series to the control node's copy
    sources: Path  # site-packages tree on the control node (sglang/ inside)
    complete: bool = True  # False: --check's, the engine wheel only (never built on a host)

    def manifest(self) -> dict:
        r = self.recipe
        return {
            "release_id": self.release_id,
            "recipe": {
                "name": r.name,
                "sglang": r.sglang,
                "install": r.install,
                "pins": r.pins,
                "toolkit": {"method": r.toolkit.method, "version": r.toolkit.version},
            },
            "engine": self.engine,
            "requirements_sha256": hashlib.sha256(self.requirements.encode()).hexdigest(),
            "wheels": [{"name": w.name, "sha256": w.sha256} for w in self.wheels],
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
            "patched_files": patchset.expected_hashes(self.patch_state),
            **({"model": model_record(r.model)} if r.model else {}),
        }


def model_record(model) -> dict:
    """The weights a release is built for (the recipe's model manifest, issue 44): the
    release's manifest.json and the baselines record its hash."""
    m = mf.load(model.manifest)
    return {"name": model.name, "manifest_sha256": m.sha256, "files": len(m.entries), "bytes": m.total}


@dataclass
class ReleaseDecision(HostState):
    """What the release step decided on this host: read by the service step (restart
    when `current` moved), the crash naming (the release's engine base), the host's
    report (its release id) and the undo. The rollback's baseline_release writes the
    same fields, so every reader works after either."""

    release_id: str | None = None
    prepared: Prepared | None = None  # the control node's assembled release (None: none was prepared)
    engine_argv: list[str] | None = None  # its command line, checked against its own flags
    previous: str | None = None  # what `current` pointed at before this run
    changed: bool = False  # this run moved `current`
    claim_root: bool = False  # releases_root is not k26ops' yet: claimed before the first write
    prune: list[str] = field(default_factory=list)  # old releases apply deletes
    probes: list[str] = field(default_factory=list)  # probe state dirs a killed run left in current

    def prepare(self, ctx: HostContext, prep: Prepared) -> None:
        """The release to deploy, with its command line checked (release and baseline_release steps)."""
        self.prepared, self.release_id = prep, prep.release_id
        self.engine_argv = validate_flags(ctx, prep)


def point_current(ctx: HostContext, rid: str, *, restoring: bool = False) -> None:
    """Point `current` at release `rid` atomically (a temporary link renamed over it:
    rename(2)), only when its manifest says it is complete. `restoring`: back to the
    release this run found current (as it was: no manifest test), also after an
    interrupt (ctx.run would refuse then)."""
    run = ctx.session.run if restoring else ctx.run
    res = run(switch_current(ctx.releases_root, rid, require_manifest=not restoring))
    if not res.ok:  # one line: what the host said (`current` a directory, no manifest), not the script
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()
        raise StepFailed(
            f"switching {ctx.releases_root}/current to {rid} failed: "
            + (said[-1][:300] if said else f"exit {res.exited} (is its manifest.json there?)")
        )


def undo_switch(ctx: HostContext) -> str | None:
    """The release steps' undo: `current` back where this run found it (None: it did not move)."""
    d = ReleaseDecision.of(ctx)
    if not d.changed:
        return None
    if not d.previous:
        return "the new release stays current (there was no previous one)"
    point_current(ctx, d.previous, restoring=True)
    return f"current points at {d.previous} again"


_PREP: dict[str, Prepared] = {}
_PREP_LOCK = threading.Lock()


def check_launch(host: str, argv: list[str], engine: engine_flags.EngineFlags | None = None) -> None:
    """The engine's own start-up rules on this command line: one line naming the flag.
    With the release's flag table, its own aliases and `--no-` forms count."""
    bad = launch_rules.violations(argv, engine)
    if bad:
        raise UserError(f"{host}: engine launch rule {bad[0].rule.name}: {bad[0]}")


def engine_version(r: recipe_mod.Recipe, lock: enginelock.Lock) -> str:
    """The sglang version the release's venv reports (`pip show sglang`): a git source's
    from its lock's header (the version of the wheel built from the commit, 0.5.23+lab),
    a registry release's from the sglang wheel among the locked ones."""
    if r.git:
        name, _, version = lock.meta.get("engine", "").partition(" ")
        if name != "sglang" or not version:
            raise UserError(f"{lock.path}: the lock's header has no `# engine: sglang VERSION` line: remake it")
        return version
    found = [v for n, v, _ in lock.entries if enginelock._norm(n) == "sglang"]
    if not found:
        raise UserError(f"{lock.path}: no sglang wheel among the locked wheels")
    return found[0]


def expected_state(r: recipe_mod.Recipe, tags: tuple = ()) -> dict:
    """What a converged host holds for recipe `r`, from the recipe and its lock alone
    (no build, no host): the release id `current` points at and the sglang version in
    its venv. The release id is recipe.release_id over the same recipe, lock and series
    that the deploy's `prepare` hashes, and the Ansible comparison (bench/converged.py)
    checks these values, so the two cannot drift."""
    lock = lock_for(r)
    patches = patchset.load_series(r.series, tuple(r.tags) + tuple(tags))
    return {
        "release_id": recipe_mod.release_id(r, lock.sha256, patches),
        "sglang_version": engine_version(r, lock),
        "cuda_version": r.toolkit.version,
    }


def before_hosts(hosts) -> None:
    """Checks that need no host: the recipe and lock of every selected host, and
    the engine's launch rules on each host's command line. Exit 2 before anything runs."""
    cache: dict = {}
    for h in hosts:
        r = recipe_for(h.vars, cache=cache)
        try:
            argv = launch.engine_argv(profile_for(h.vars, r))
        except UserError as exc:
            raise UserError(f"{h.name}: {exc}") from None
        check_launch(h.name, argv)
        installer.choice(h.vars, h.name)
        for py in r.pythons or (r.python,):  # every python the recipe lists has its lock
            lock_for(recipe_mod.for_python(r, py))
        wheelsource.settings(h)


def _host_python(ctx: HostContext) -> str:
    return ".".join(((ctx.facts.get("python3") or {}).get("version") or "3.11").split(".")[:2])


def prepare(ctx: HostContext, tags: tuple = ()) -> Prepared:
    """Assemble and check the release once per run on the control node (shared by hosts)."""
    ov = release_override(ctx) or {}
    py = _host_python(ctx)
    try:  # the lock of this host's python, where the recipe lists several
        r = recipe_mod.for_python(effective_recipe(ctx), py)
    except UserError as exc:
        raise StepFailed(str(exc)) from None
    lock = lock_for(r)
    if lock.meta["python"] != py:
        raise StepFailed(recipe_mod.python_mismatch(r, lock.meta["python"], py))
    key = json.dumps(
        [
            str(r.source),
            r.base,
            r.git and r.git.url,
            lock.sha256,
            list(tags),
            py,
            [list(x) for x in ov.get("patches") or []],
        ]
    )
    # --check plans from the engine wheel alone (its flags, the series applied to its files): the
    # locked dependency wheels (GBs for a full registry closure) are fetched by the run that builds
    only_engine = bool(ctx.check)
    with _PREP_LOCK:
        if (key, only_engine) in _PREP:
            return _PREP[(key, only_engine)]
        if ov.get("patches"):  # [(name as recorded, file)]: same names + contents -> same release id
            patches = [patchset.parse_patch(Path(f).read_text(), name) for name, f in ov["patches"]]
        else:
            patches = patchset.load_series(r.series, tuple(r.tags) + tuple(tags))
        rid = recipe_mod.release_id(r, lock.sha256, patches)  # as expected_state computes it
        work = prepcache.VARIANTS / f"{rid}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
        if r.git:
            g = r.git
            built = engine_source.wheel_for(r, ctx.progress)
            engine = wheelhouse.Wheel(built.name, built.sha256, built.size, built.path)
            if only_engine:
                deps = []
            else:
                ctx.progress(f"downloading the {len(lock.entries)} locked wheels for {rid} (once for all hosts)")
                deps = wheelhouse.ensure(
                    enginelock.requirement_lines(lock.entries), no_deps=True, python=py, hashes=True
                )
            wheels = [engine] + deps
            source = {
                "git": g.url,
                "commit": g.commit,
                "subdir": g.subdir,
                "built": "prebuilt wheel" if g.wheel_sha256 else "pip wheel on the control node",
            }
        else:  # the locked set, the sglang wheel among it: exactly those files, nothing resolved here
            entries = [e for e in lock.entries if enginelock._norm(e[0]) == "sglang"] if only_engine else lock.entries
            ctx.progress(
                f"downloading {'the sglang wheel (--check)' if only_engine else f'the {len(entries)} locked wheels'}"
                f" for {rid} (once for all hosts)"
            )
            wheels = wheelhouse.ensure(enginelock.requirement_lines(entries), no_deps=True, python=py, hashes=True)
            sg = [w for w in wheels if wheelhouse.wheel_name_version(w.name)[0].lower() == "sglang"]
            if not sg:
                raise UserError(f"{lock.path}: no sglang wheel among the locked wheels")
            engine = sg[0]
            source = {"registry": f"sglang=={r.sglang}", "install": r.install}
        provenance = {
            "base": r.base,
            "source": source,
            "wheel": {"name": engine.name, "sha256": engine.sha256},
            "lock": {"file": lock.path.name, "sha256": lock.sha256, "wheels": len(lock.entries)},
        }
        site, pdir = work / "site-packages", work / "patches"
        if not (work / prepcache.MARK).exists():  # assembled once per release id on this node
            _assemble(work, r, patches, engine, {name: Path(f) for name, f in ov.get("patches") or []})
            prepcache.prune()
        prepcache.used(work)
        pstate = patchset.load_state(work / "patch-state")
        prep = Prepared(
            rid,
            r,
            provenance,
            engine,
            lock,
            patches,
            pdir,
            wheels,
            wheelhouse.requirements_file(wheels),
            pstate,
            site,
            complete=not only_engine,
        )
        _PREP[(key, only_engine)] = prep
        return prep


_FLAGS: dict[Path, engine_flags.EngineFlags] = {}


def validate_flags(ctx: HostContext, prep: Prepared) -> list[str]:
    """The engine's command line, its flags checked against the release's own sources."""
    ov = release_override(ctx) or {}
    profile = engine_profile(ctx, prep.recipe)
    argv = list(ov["engine_argv"]) if ov.get("engine_argv") else launch.engine_argv(profile)
    if not ov.get("engine_argv"):
        check_launch(ctx.host.name, argv)
    flags = argv[argv.index("-m") + 2 :] if "-m" in argv else argv[1:]
    # the secret flags reach the engine through its --config file: checked by name, never by value
    flags += [w for flag in launch.engine_flag_secrets(profile) for w in (flag, "secret")]
    # A release's sources never change (its id is their content), so a command
    # line validated once against them is remembered beside them on this node.
    seen = prep.sources.parent / "validated-argv"
    key = hashlib.sha256(json.dumps(flags).encode()).hexdigest()
    # Under the lock: CPython 3.11's ast is not safe to run from several
    # threads at once (SystemError: recursion depth mismatch).
    with _PREP_LOCK:
        if seen.exists() and key in seen.read_text().split():
            return argv
        if prep.sources not in _FLAGS:
            _FLAGS[prep.sources] = engine_flags.read_flags(prep.sources)
        if not ov.get("engine_argv"):
            check_launch(ctx.host.name, argv, _FLAGS[prep.sources])
        engine_flags.validate(flags, prep.sources, _FLAGS[prep.sources])
        with open(seen, "a") as fh:
            fh.write(key + "\n")
    return argv


CURRENT_FACT = "release_current"


# the state dirs of a probe applied to a release (diagnose cuda-graph's, rehearse --probe's): one a
# killed run left stays applied until a deploy or rollback reverts it (agents/baseline.py reads the same)
PROBE_DIRS = ("probe-state", "rehearse-probe-state")


def _read_current(releases_root: str, release: str) -> str:
    """Where `current` points, then whether `release` (a name in releases_root) is complete
    (its manifest.json, written last, whole: a JSON object ends in `}`; a truncated one is
    rebuilt, not taken as the release), then the probes left applied to `current`; read by
    `_current_and_complete`."""
    probes = " ".join(f"current/{d}/state.json" for d in PROBE_DIRS)
    return (
        f"cd {q(releases_root)} 2>/dev/null && {{ readlink current; echo ===; "
        f"test -f {q(release)}/manifest.json && tail -c 1 {q(release)}/manifest.json | grep -q '}}' && "
        "echo complete; echo ===; "
        f'for f in {probes}; do test -f "$f" && echo "$f"; done; }}; true'
    )


def _current_and_complete(out: str, rc: int = 0) -> dict:
    target, _, rest = out.partition("===")
    rest, _, probes = rest.partition("===")
    return {
        "current": target.strip() or None,
        "complete": "complete" in rest,
        "probes": [ln.split("/")[1] for ln in probes.split() if ln.count("/") == 2],
    }


def revert_probes(ctx: HostContext, release_dir: str, dirs: list[str]) -> list[str]:
    """Revert the probes a killed run left applied in `release_dir` (byte-exact, from their
    pristine copies: the probe agent's revert); the files put back."""
    man = json.loads(ctx.run(f"cat {q(release_dir + '/manifest.json')}", check=True).stdout)
    done = []
    for sdir in dirs:
        r = agents.run(
            ctx.session,
            "probe",
            "revert",
            300,
            what="probe agent",
            release=release_dir,
            site=man["site_packages"],
            probe_state=sdir,
        )
        done += r.get("done") or []
    return done


def current_fact(releases_root: str) -> Fact:
    """Where `current` points and whether that release is complete (its manifest.json)."""
    return Fact(
        CURRENT_FACT,
        _read_current(releases_root, "current"),
        safe(_current_and_complete),
        10.0,
        own="release_current",
        own_args=(releases_root, "current"),
    )


class Release(Step):
    name = "release"
    fact_names = ("python3",)  # the lock's python

    def before_hosts(self, hosts) -> None:
        before_hosts(hosts)

    def facts(self, host_vars: dict) -> list:
        """`current` and its completeness, in the playbook's one fact-gathering call."""
        return [current_fact(Layout.of(host_vars).releases_root)]

    def prepare(self, ctx: HostContext) -> None:
        ReleaseDecision.of(ctx).prepare(ctx, prepare(ctx, tuple(self.params.get("tags", ()))))

    def plan(self, ctx: HostContext) -> list[Change]:
        d = ReleaseDecision.of(ctx)
        prep = d.prepared
        rid = prep.release_id
        d.release_id = rid
        rel = ctx.releases_root
        # read with k26ops_root's before the lock (playbook.run_on_host); only k26ops runs change it
        st = ctx.releases_root_state or ownership.state(ctx.session, rel, "releases")
        why = ownership.refusal(rel, "releases", st)
        if why:
            raise StepFailed(why)
        d.claim_root = st["state"] != "owned"
        seen = ctx.facts.get(CURRENT_FACT)
        if isinstance(seen, dict) and "current" in seen and seen["current"] == rid and seen["complete"]:
            d.previous = rid  # read in the fact-gathering call: nothing to do
            return self._unprobe(d, rid, seen.get("probes"))
        found = _current_and_complete(ctx.run(_read_current(rel, rid)).stdout)
        current = d.previous = found["current"]
        complete = found["complete"]  # of the release to deploy (the fact's was of `current`)
        if current == rid and complete:
            return self._unprobe(d, rid, found.get("probes"))
        changes = []
        if not complete:
            lock = f", lock {prep.lock.sha256[:12]}" if prep.lock else ""
            changes.append(
                Change(
                    f"build release {rid} in {rel}/{rid} ({prep.recipe.base_short}, "
                    f"wheel {prep.engine_wheel.sha256[:12]}{lock}, {len(prep.patches)} patch(es))",
                    action="build",
                )
            )
        changes.append(Change(f"switch current: {current or '(none)'} -> {rid}", action="switch"))
        keep = int(self.params.get("keep", 3))
        pins = set(ctx.run(f"cat {q(ctx.pins_file)} 2>/dev/null; true").stdout.split())
        prune = d.prune = ownership.prune_plan(ownership.releases(ctx.session, rel), rid, keep, pins)
        if prune:
            changes.append(
                Change(
                    f"prune {len(prune)} old release(s) (keep {keep}, k26ops releases only): " + ", ".join(prune),
                    action="prune",
                )
            )
        return changes

    @staticmethod
    def _unprobe(d, rid: str, probes: list[str] | None) -> list[Change]:
        """The release is current, but a probe a killed run left is applied to it: reverted, and
        the engine restarted on the release's own files (as after a switch)."""
        d.probes = list(probes or [])
        return (
            [
                Change(
                    f"revert the probe left applied in release {rid} ({', '.join(d.probes)}) and restart "
                    "the engine on the release's own files",
                    action="unprobe",
                )
            ]
            if d.probes
            else []
        )

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        d = ReleaseDecision.of(ctx)
        prep = d.prepared
        rid, rel = prep.release_id, ctx.releases_root
        if [c.action for c in changes] == ["unprobe"]:
            ctx.report["probe_reverted"] = revert_probes(ctx, f"{rel}/{rid}", d.probes)
            d.changed = True  # the engine restarts (the service step), as after a switch
            return
        if d.claim_root:
            ownership.claim(ctx.session, rel)
        if any(c.action == "build" for c in changes):
            self._build(ctx, prep)
        rehearse = ctx.options.rehearse  # deploy --rehearse (rehearsal.run.Gate): before `current` moves
        if rehearse:
            rehearse(ctx, release_dir=f"{rel}/{rid}")
        point_current(ctx, rid)
        d.changed = True
        prune(ctx.session, rel, ctx.root, d.prune)

    def undo(self, ctx: HostContext) -> str | None:
        return undo_switch(ctx)

    def _build(self, ctx: HostContext, prep: Prepared) -> None:
        rid, rel = prep.release_id, ctx.releases_root
        if not prep.complete:  # a planning run's release has only the engine wheel
            raise StepFailed(f"release {rid} was prepared for --check only; run the deploy again")
        d = f"{rel}/{rid}"
        wh = f"{ctx.root}/wheelhouse"
        # the venv unpacks the wheels: about three times their size (a rough floor, said as such)
        wheelhouse.need_free(
            ctx.session,
            rel,
            3 * sum(w.size for w in prep.wheels),
            f"release {rid} (about 3x its {len(prep.wheels)} wheels)",
        )
        # a release built again starts with an empty engine cache: two builds never share compiled objects
        ctx.run(
            f"rm -rf {q(d)} {q(engine_cache.release_cache(ctx.root, rid))} && mkdir -p {q(d)}/k26ops/patches && "
            f"echo {q(rid)} > {q(d + '/' + ownership.RELEASE_MARKER)}",
            check=True,
        )
        how = installer.choice(ctx.vars, ctx.host.name)
        try:
            # the engine wheel built here is on no index; the locked ones are
            deliver_wheels(ctx, prep.wheels, wh, how, local=(prep.engine_wheel,) if prep.recipe.git else ())
            link_mode = store_ready(ctx) if how == "uv" else None
            ctx.session.put_file(PATCHSET_SCRIPT, f"{d}/k26ops/patchset.py")
            for f in sorted(prep.patch_dir.iterdir()):
                ctx.session.put_file(f, f"{d}/k26ops/patches/{f.name}")
            ctx.session.put(prep.requirements.encode(), f"{d}/k26ops/requirements.txt")
            ctx.progress(
                f"building release {rid} (venv, {how} install --require-hashes from the pushed wheels"
                + (f", {link_mode} from the store)" if link_mode else ")")
            )
            no_deps = prep.recipe.git is None and prep.recipe.no_deps
            script = (
                f"set -e; cd {q(d)}; python3 -m venv venv; "
                f"{installer.install_command(how, ctx.root, wh, no_deps, link_mode or 'hardlink')}; "
                "SP=$(venv/bin/python k26ops/patchset.py site); "
                f'python3 k26ops/patchset.py apply --root "$SP" --series k26ops/patches/series '
                f"--state patch-state --base {q(prep.recipe.base)} >/dev/null; "
                'python3 k26ops/patchset.py verify --root "$SP" --state patch-state; '
                'echo "SITE=$SP"'
            )
            for attempt in (1, 2):
                res = ctx.run(tied_to_channel(script), timeout=3600)
                if not res.ok:
                    lines = (res.stdout + "\n" + res.stderr.replace("\0", "")).strip().splitlines()
                    raise StepFailed(
                        f"building release {rid} failed: "
                        f"{disk_full(ctx, rel, lines) or (lines[-1] if lines else 'no output')}"
                    )
                site = res.stdout.rsplit("SITE=", 1)[1].strip()
                if how != "uv":
                    break
                # uv's lock files 0600, the store's files read-only (shared with the release's links)
                agents.run(
                    ctx.session,
                    "store",
                    "seal",
                    600,
                    what="store agent",
                    store=installer.store_dir(ctx.root),
                    locks=[f"{d}/venv/.lock"],
                )
                if not self._store_damage(ctx, prep, site, rid, attempt):
                    break
                ctx.run(f"cd {q(d)} && rm -rf venv patch-state", check=True)
            self._verify_hashes(ctx, prep, site)
            manifest = {
                **prep.manifest(),
                "site_packages": site,
                "engine_argv": ReleaseDecision.of(ctx).engine_argv,
                "installer": f"uv {installer.UV_VERSION}" if how == "uv" else "pip",
                "link_mode": link_mode,
            }
            ctx.session.put(json.dumps(manifest, indent=1, sort_keys=True).encode(), f"{d}/manifest.json")
        except BaseException:
            ctx.run(f"rm -rf {q(d)}")
            raise

    def _store_damage(self, ctx, prep: Prepared, site: str, rid: str, attempt: int) -> bool:
        """The new release's files against their wheels' RECORD (there, of their size): a file
        deleted from or changed in the store would be missing or changed here. Its store
        entries are dropped so the install runs again and uv unpacks those wheels from the
        wheelhouse (True); a second failure is the host's to explain."""
        v = agents.run(
            ctx.session,
            "baseline",
            "verify",
            600,
            what="release verify",
            site=site,
            skip=sorted(patchset.expected_hashes(prep.patch_state)),
        )
        bad = v["bad"]
        if not bad:
            return False
        what = ", ".join(f"{b['path']} ({b['why']})" for b in bad[:3])
        if attempt > 1:
            raise StepFailed(
                f"release {rid}: {len(bad)} file(s) differ from their wheels' RECORD after re-unpacking them: {what}"
            )
        ctx.progress(f"the release store is damaged ({len(bad)} file(s): {what}); unpacking those wheels again")
        agents.run(
            ctx.session,
            "store",
            "evict",
            600,
            what="store agent",
            store=installer.store_dir(ctx.root),
            inodes=[b["ino"] for b in bad if b.get("ino")],
            dists=sorted({b["dist"] for b in bad}),
        )
        ctx.report.setdefault("store_repaired", []).extend(b["path"] for b in bad)
        return True

    def _verify_hashes(self, ctx, prep: Prepared, site: str) -> None:
        """The host's patched files must equal the control node's (same bytes)."""
        expected = patchset.expected_hashes(prep.patch_state)
        if not expected:
            return
        files = " ".join(q(f"{site}/{p}") for p in sorted(expected))
        res = ctx.run(f"sha256sum {files}", check=True)
        got = {
            line.split(None, 1)[1].strip()[len(site) + 1 :]: line.split()[0]
            for line in res.stdout.splitlines()
            if line.strip()
        }
        bad = [p for p, h in expected.items() if got.get(p) != h]
        if bad:
            raise StepFailed(f"release files differ from the control node's build: {', '.join(bad)}")


def disk_full(ctx: HostContext, path: str, lines: list[str]) -> str | None:
    """A build that failed for want of space, named as such: its output says so (not always on
    the last line), or the filesystem has under 64 MiB left (venv's ensurepip swallows pip's
    own words and says only `exit status 1`)."""
    hit = [ln for ln in lines if "No space left on device" in ln or "Disk quota exceeded" in ln]
    df = ctx.run(f"df -Pk {q(path)} | tail -1")
    try:
        free_kb = int(df.stdout.split()[3])
    except (IndexError, ValueError):
        free_kb = None
    if hit or (free_kb is not None and free_kb < 64 * 1024):
        return f"disk full ({free_kb // 1024 if free_kb is not None else '?'} MiB free on {path}): " + (
            hit[-1].strip()[:160] if hit else (lines[-1] if lines else "no output")
        )
    return None


def deliver_wheels(ctx: HostContext, wheels: list, wh: str, how: str, local: tuple = ()) -> None:
    """A release build's wheels into the host's wheelhouse `wh` (wheelsource.deliver, `local`: built
    here, on no index), with uv's own wheel and uv installed from it when `how` is uv. Shared by the
    engine's and the gateway's release steps."""
    tools = [installer.uv_wheel()] if how == "uv" else []
    wheelsource.deliver(ctx, wheels + tools, wh, local=local)
    if tools and not ctx.run(f"test -x {q(installer.uv_path(ctx.root))}").ok:
        got = agents.run(
            ctx.session,
            "store",
            "uv",
            what="store agent",
            wheel=f"{wh}/{tools[0].name}",
            sha256=tools[0].sha256,
            dest=installer.uv_path(ctx.root),
        )
        if not got.get("ok"):
            raise StepFailed(f"installing uv: {got.get('error')}")


def store_ready(ctx: HostContext) -> str:
    """Before uv runs: the store private (0700), no lock of it held (named: pid, user, command,
    rather than a deploy that waits on it for an hour), and the link mode its filesystem offers."""
    got = agents.run(ctx.session, "store", "prepare", 120, what="store agent", store=installer.store_dir(ctx.root))
    if got["held"]:
        h = got["held"][0]
        raise StepFailed(
            f"the release store's lock {h['path']} is held by pid {h['pid']} (user {h['user']}: "
            f"{h['command'][:80]}); uv would wait for it: stop that process; nothing was installed"
        )
    return got["link_mode"]


def prune(session, releases_root: str, root: str, names: list[str]) -> dict:
    """Delete the k26ops releases `names`, then the store's files that only they linked:
    a file shared with a kept release stays (its link count says so), so what is freed
    is what the pruned releases alone held. {"deleted": [...], "removed": n, "freed": bytes
    freed from the store}."""
    gone = ownership.delete(session, releases_root, names)
    if not gone:
        return {"deleted": [], "removed": 0, "freed": 0}
    # each release's engine cache goes with it (k26ops_root/engine-cache/<id>: ids are checked names)
    session.run("rm -rf " + " ".join(q(engine_cache.release_cache(root, n)) for n in gone), check=True)
    gc = agents.run(session, "store", "gc", 600, what="store agent", store=installer.store_dir(root))
    return {"deleted": gone, **gc}


def _assemble(work: Path, r, patches, engine_wheel: wheelhouse.Wheel, patch_files: dict | None = None) -> None:
    """The release's sources on the control node: the engine wheel's files + the patch series."""
    shutil.rmtree(work, ignore_errors=True)
    site = work / "site-packages"
    work.mkdir(parents=True)
    prepcache.linked_copy(prepcache.pristine(engine_wheel.path, engine_wheel.sha256), site)
    base = patchset.parse_base(r.base)
    try:
        patchset.apply(site, patches, work / "patch-state", {base[0]: base[1]})
    except patchset.PatchError as exc:
        raise UserError(f"patch series does not apply to the release sources (no host was changed): {exc}") from None
    pdir = work / "patches"
    pdir.mkdir()
    series_lines = []
    for i, p in enumerate(patches, 1):
        shipped = f"{i:02d}-{Path(p.name).name}"  # flat, ordered, unique
        src = (patch_files or {}).get(p.name) or Path(r.series).parent / p.name
        (pdir / shipped).write_text(src.read_text())
        series_lines.append(shipped)
    (pdir / "series").write_text(f"# Base: {r.base}\n" + "".join(line + "\n" for line in series_lines))
    (work / prepcache.MARK).write_text("ok\n")
