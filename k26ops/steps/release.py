"""The release step: build the patched engine into its own release directory
and make it current by one atomic symlink switch.

A release is identified by its content (recipe pins, overlay commit, patch
series); the same inputs give the same id and nothing is rebuilt. Before any
host is touched, the control node assembles the release's sources once
(sglang wheel + DDTree overlay + patch series) and validates the engine flags
against them, so a patch that does not apply, or a flag the engine does not
know, stops the run with every host unchanged.

On the host the build goes into <releases>/<id>/ and is complete only when
its manifest.json is written, last. `current` only ever points at a complete
release: `ln -s` to a temp name, then `mv -T` over `current` (rename(2) is
atomic). A failed build is removed and the previous release stays current.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from k26ops import engine_flags, overlay, patchset, prepcache, units, wheelhouse
from k26ops import recipe as recipe_mod
from k26ops.errors import UserError
from k26ops.ssh import q
from k26ops.steps import Change, HostContext, Step, StepFailed, register
from k26ops.steps.toolchain import host_recipe

PATCHSET_SCRIPT = Path(patchset.__file__)


@dataclass
class Prepared:
    """What the control node knows about a release before any host builds it."""
    release_id: str
    recipe: recipe_mod.Recipe
    overlay_commit: str | None
    overlay_tar: Path | None
    patches: list
    patch_dir: Path  # series + patch files, as shipped
    wheels: list
    patch_state: dict  # from applying the series to the control node's copy
    sources: Path  # site-packages tree on the control node (sglang/ inside)

    def manifest(self) -> dict:
        r = self.recipe
        return {
            "release_id": self.release_id,
            "recipe": {"name": r.name, "sglang": r.sglang, "install": r.install, "pins": r.pins,
                       "toolkit": {"method": r.toolkit.method, "version": r.toolkit.version}},
            "requirements": r.requirements(),
            "overlay": ({"url": r.overlay.url, "ref": r.overlay.ref, "commit": self.overlay_commit}
                        if r.overlay else None),
            "wheels": [{"name": w.name, "sha256": w.sha256} for w in self.wheels],
            "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
            "patched_files": patchset.expected_hashes(self.patch_state),
        }


_PREP: dict[str, Prepared] = {}
_PREP_LOCK = threading.Lock()


def effective_recipe(ctx: HostContext) -> recipe_mod.Recipe:
    ov = ctx.shared.get("release_override")
    if ov:  # a rebuild from a baseline: its recorded recipe file and overlay source
        r = ov.get("_recipe")
        if r is None:
            r = ov["_recipe"] = recipe_mod.load(ov["recipe"])
            if ov.get("overlay"):
                r = ov["_recipe"] = recipe_mod.with_overlay(r, ov["overlay"]["url"], ov["overlay"]["ref"])
        return r
    r = host_recipe(ctx)
    url = ctx.vars.get("ddtree_overlay_url")
    if url:
        r = recipe_mod.with_overlay(r, str(url), str(ctx.vars.get("ddtree_overlay_ref", recipe_mod.UPSTREAM_DDTREE_REF)))
    return r


def engine_profile(ctx: HostContext, r: recipe_mod.Recipe | None = None) -> dict:
    """The engine profile: the recipe's defaults, then the inventory's overrides."""
    r = r or effective_recipe(ctx)
    prof = dict(r.profile)
    prof.update(ctx.vars.get("engine_profile") or {})
    for key in ("model_path", "draft_model_path", "launch_module", "served_model_name",
                "nnodes", "node_rank", "dist_init_addr"):  # the last three: k26ops.multinode
        if key in ctx.vars:
            prof[key] = ctx.vars[key]
    if "engine_port" in ctx.vars:
        prof["port"] = ctx.vars["engine_port"]
    if ctx.vars.get("extra_flags"):
        prof["extra_args"] = ctx.vars["extra_flags"]
    prof.setdefault("draft_model_path", f"{prof.get('model_path', '/models/Kimi-K2.6')}-DFlash-drafter")
    return prof


def prepare(ctx: HostContext, tags: tuple = ()) -> Prepared:
    """Assemble and check the release once per run on the control node (shared by hosts)."""
    r = effective_recipe(ctx)
    ov = ctx.shared.get("release_override") or {}
    pin = (ov.get("overlay") or {}).get("commit")
    py = ".".join(((ctx.facts.get("python3") or {}).get("version") or "3.11").split(".")[:2])
    key = json.dumps([str(r.source), r.overlay and [r.overlay.url, r.overlay.ref], list(tags), py, pin,
                      [list(x) for x in ov.get("patches") or []]])
    with _PREP_LOCK:
        if key in _PREP:
            return _PREP[key]
        commit = None
        if r.overlay:
            ctx.progress(f"fetching DDTree overlay {r.overlay.url} {r.overlay.ref}")
            commit = overlay.fetch(r.overlay.url, pin or r.overlay.ref)
            if pin and commit != pin:
                raise UserError(f"ddtree overlay: {r.overlay.url} has no commit {pin}")
        if ov.get("patches"):  # [(name as recorded, file)]: same names + contents -> same release id
            patches = [patchset.parse_patch(Path(f).read_text(), name) for name, f in ov["patches"]]
        else:
            patches = patchset.load_series(r.series, tuple(r.tags) + tuple(tags))
        rid = recipe_mod.release_id(r, commit, patches)
        work = prepcache.VARIANTS / f"{rid}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
        ctx.progress(f"downloading wheels for {rid} (once for all hosts)")
        wheels = wheelhouse.ensure(r.requirements(), no_deps=r.no_deps, python=py)
        sg = [w for w in wheels if w.name.lower().startswith("sglang-")]
        if not sg:
            raise UserError(f"{r.source}: no sglang wheel among the downloaded wheels")
        site, tar, pdir = work / "site-packages", work / "overlay.tar", work / "patches"
        if not (work / prepcache.MARK).exists():  # assembled once per release id on this node
            _assemble(work, r, commit, patches, sg[0],
                      {name: Path(f) for name, f in ov.get("patches") or []})
            prepcache.prune()
        prepcache.used(work)
        pstate = patchset.load_state(work / "patch-state")
        tar = tar if r.overlay else None
        prep = Prepared(rid, r, commit, tar, patches, pdir, wheels, pstate, site)
        _PREP[key] = prep
        return prep


_FLAGS: dict[Path, engine_flags.EngineFlags] = {}


def validate_flags(ctx: HostContext, prep: Prepared) -> list[str]:
    """The engine's command line, its flags checked against the release's own sources."""
    ov = ctx.shared.get("release_override") or {}
    argv = list(ov["engine_argv"]) if ov.get("engine_argv") else units.engine_argv(engine_profile(ctx, prep.recipe))
    flags = argv[argv.index("-m") + 2:] if "-m" in argv else argv[1:]
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
        engine_flags.validate(flags, prep.sources, _FLAGS[prep.sources])
        with open(seen, "a") as fh:
            fh.write(key + "\n")
    return argv


@register
class Release(Step):
    name = "release"

    def prepare(self, ctx: HostContext) -> None:
        prep = prepare(ctx, tuple(self.params.get("tags", ())))
        ctx.shared["prepared"] = prep
        ctx.shared["engine_argv"] = validate_flags(ctx, prep)
        ctx.shared["release_id"] = prep.release_id

    def plan(self, ctx: HostContext) -> list[Change]:
        prep = ctx.shared["prepared"]
        rid = prep.release_id
        ctx.shared["release_id"] = rid
        rel = ctx.releases_root
        res = ctx.run(f"cd {q(rel)} 2>/dev/null && {{ readlink current; echo ===; "
                      f"test -f {q(rid)}/manifest.json && echo complete; }}; true")
        current, _, rest = res.stdout.partition("===")
        current = current.strip() or None
        ctx.shared["previous_release"] = current
        complete = "complete" in rest
        if current == rid and complete:
            return []
        changes = []
        if not complete:
            changes.append(Change(f"build release {rid} in {rel}/{rid} (sglang {prep.recipe.sglang}"
                                  + (f", overlay {prep.overlay_commit[:12]}" if prep.overlay_commit else "")
                                  + f", {len(prep.patches)} patch(es))"))
        changes.append(Change(f"switch current: {current or '(none)'} -> {rid}"))
        return changes

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        prep: Prepared = ctx.shared["prepared"]
        rid, rel = prep.release_id, ctx.releases_root
        if changes[0].what.startswith("build "):
            self._build(ctx, prep)
        ctx.run(f"set -e; cd {q(rel)}; test -f {q(rid)}/manifest.json; ln -sfn {q(rid)} .current.tmp; "
                f"mv -T .current.tmp current", check=True)
        ctx.shared["release_changed"] = True
        self._prune(ctx, int(self.params.get("keep", 3)))

    def _build(self, ctx: HostContext, prep: Prepared) -> None:
        rid, rel = prep.release_id, ctx.releases_root
        d = f"{rel}/{rid}"
        wh = f"{ctx.root}/wheelhouse"
        ctx.progress(f"pushing wheels for {rid}")
        ctx.run(f"rm -rf {q(d)} && mkdir -p {q(d)}/k26ops/patches", check=True)
        try:
            wheelhouse.push(ctx.session, prep.wheels, wh)
            ctx.session.put_file(PATCHSET_SCRIPT, f"{d}/k26ops/patchset.py")
            for f in sorted(prep.patch_dir.iterdir()):
                ctx.session.put_file(f, f"{d}/k26ops/patches/{f.name}")
            if prep.overlay_tar:
                ctx.session.put_file(prep.overlay_tar, f"{d}/k26ops/overlay.tar")
            reqs = " ".join(q(x) for x in prep.recipe.requirements())
            ctx.progress(f"building release {rid} (venv, pip install from the pushed wheels)")
            script = (
                f"set -e; cd {q(d)}; python3 -m venv venv; "
                f"venv/bin/python -m pip install -q --no-index --find-links {q(wh)} "
                f"{'--no-deps ' if prep.recipe.no_deps else ''}{reqs}; "
                "SP=$(venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
                + ("tar -xf k26ops/overlay.tar -C \"$SP\" --exclude=k26ops-overlay.json; " if prep.overlay_tar else "")
                + f"python3 k26ops/patchset.py apply --root \"$SP\" --series k26ops/patches/series "
                  f"--state patch-state --installed sglang=={q(prep.recipe.sglang)} >/dev/null; "
                "python3 k26ops/patchset.py verify --root \"$SP\" --state patch-state; "
                "echo \"SITE=$SP\"")
            res = ctx.run(_tied_to_channel(script), timeout=3600)
            if not res.ok:
                lines = (res.stdout + "\n" + res.stderr.replace("\0", "")).strip().splitlines()
                raise StepFailed(f"building release {rid} failed: {lines[-1] if lines else 'no output'}")
            site = res.stdout.rsplit("SITE=", 1)[1].strip()
            self._verify_hashes(ctx, prep, site)
            manifest = {**prep.manifest(), "site_packages": site, "engine_argv": ctx.shared["engine_argv"]}
            ctx.session.put(json.dumps(manifest, indent=1, sort_keys=True).encode(), f"{d}/manifest.json")
        except BaseException:
            ctx.run(f"rm -rf {q(d)}")
            raise

    def _verify_hashes(self, ctx, prep: Prepared, site: str) -> None:
        """The host's patched files must equal the control node's (same bytes)."""
        expected = patchset.expected_hashes(prep.patch_state)
        if not expected:
            return
        files = " ".join(q(f"{site}/{p}") for p in sorted(expected))
        res = ctx.run(f"sha256sum {files}", check=True)
        got = {line.split(None, 1)[1].strip()[len(site) + 1:]: line.split()[0]
               for line in res.stdout.splitlines() if line.strip()}
        bad = [p for p, h in expected.items() if got.get(p) != h]
        if bad:
            raise StepFailed(f"release files differ from the control node's build: {', '.join(bad)}")

    def _prune(self, ctx: HostContext, keep: int) -> None:
        """Keep the newest `keep` releases, never `current` nor one a baseline pins."""
        rel = ctx.releases_root
        pins = ctx.pins_file
        ctx.run(f"cd {q(rel)} && cur=$(readlink current); "
                f"ls -1t --ignore=current --ignore='.*' | tail -n +{keep + 1} | while read -r r; do "
                f"[ \"$r\" = \"$cur\" ] && continue; grep -qxF \"$r\" {q(pins)} 2>/dev/null && continue; "
                "rm -rf -- \"$r\"; done; true")


def _tied_to_channel(script: str) -> str:
    """`script` in its own process group, killed when our SSH channel goes away.

    sshd sends no signal to a non-tty command when the client dies (killed
    control node, Ctrl-C, lost network): the build would go on, unowned, and
    race the next run's rebuild of the same directory. A watchdog writes one
    NUL byte to the channel's stderr every second; once the channel is gone the
    write fails (EPIPE) and it kills the build's process group.
    """
    return ("setsid sh -c " + q(script) + " & b=$!; trap '' PIPE; "
            "while kill -0 $b 2>/dev/null; do sleep 1; "
            "printf '\\0' >&2 || { kill -TERM -$b 2>/dev/null; sleep 2; kill -KILL -$b 2>/dev/null; exit 143; }; "
            "done; wait $b")


def _assemble(work: Path, r, commit, patches, sglang_wheel: wheelhouse.Wheel,
              patch_files: dict | None = None) -> None:
    """The release's sources on the control node: wheel + overlay + patch series."""
    shutil.rmtree(work, ignore_errors=True)
    site = work / "site-packages"
    work.mkdir(parents=True)
    prepcache.linked_copy(prepcache.pristine(sglang_wheel.path, sglang_wheel.sha256), site)
    tar = None
    if r.overlay:
        overlay.export(r.overlay.url, commit, work / "overlay", r.overlay.subdir, r.overlay.include)
        overlay.apply_overlay(work / "overlay", site)
        tar = work / "overlay.tar"
        overlay.tarball(work / "overlay", tar)
    try:
        patchset.apply(site, patches, work / "patch-state", {"sglang": r.sglang})
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
    (pdir / "series").write_text("\n".join(series_lines) + "\n")
    (work / prepcache.MARK).write_text("ok\n")
