"""What a host deploys: its recipe (the inventory's, a mirror's source URL, or a
baseline's recorded one when rolling back), the recipe's dependency lock, and the
engine profile (the recipe's defaults, then the inventory's overrides) that the
unit's command line, the flag checks and the rehearsal are all built from.

Below the steps: the engine host, preflight, the release step and the rehearsal
all ask this module, none of them another's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from k26ops import config
from k26ops.engine import launch, multinode
from k26ops.errors import UserError
from k26ops.hostvars import Var, declare
from k26ops.layout import DEFAULT_PORT
from k26ops.release import enginelock, inputs
from k26ops.release import recipe as recipe_mod
from k26ops.runstate import HostState


@dataclass
class HostRecipe(HostState):
    """This host's recipes in this run, each loaded (and validated) once. Kept here,
    beside the readers, because this module decides what a host deploys; the
    rollback's baseline_release sets `override` (use_recorded) when it rebuilds."""

    inventory: recipe_mod.Recipe | None = None  # the inventory's `recipe`
    effective: recipe_mod.Recipe | None = None  # that one with the inventory's source mirror
    override: dict | None = None  # a baseline's recorded recipe, lock and patches (baselines.rollback)


def use_recorded(ctx, override: dict) -> None:
    """From now on this host deploys a baseline's recorded release (its recipe file,
    source URL, patches as recorded and engine_argv), not the inventory's."""
    HostRecipe.of(ctx).override = override


def release_override(ctx) -> dict | None:
    """The baseline's recorded release this host rebuilds (use_recorded), or None."""
    return HostRecipe.of(ctx).override


DEFAULT_MODEL_PATH = "/models/Kimi-K2.6"  # also what preflight checks when neither recipe nor inventory names one

declare(
    __name__,
    "the engine",
    Var(
        "recipe",
        "str",
        recipe_mod.DEFAULT_RECIPE,
        "recipe name or path: the engine version, patches and profile to build",
    ),
    Var("engine_source_mirrors", "mapping", {}, "a recipe's git URL -> mirror URL to fetch the engine source from"),
    Var("engine_profile", "mapping", {}, "engine flags over the recipe's profile (tp_size, page_size, ...)"),
    Var("engine_port", "int", DEFAULT_PORT, "the engine's HTTP port (--port)", f"the recipe's port ({DEFAULT_PORT})"),
    Var("extra_flags", "list", [], "extra engine command-line flags"),
    Var(
        "monitoring",
        "bool or mapping",
        False,
        "scrape this host: the engine runs with --enable-metrics and `k26ops monitoring` writes its "
        "Prometheus targets; a mapping sets dcgm_port (9400; 0: none) and gateway (HOST:PORT)",
    ),
)
# Taken into the engine profile as they are, over the recipe's.
PROFILE_VARS = declare(
    __name__,
    "the engine",
    Var("model_path", "path", DEFAULT_MODEL_PATH, "the model's weights directory (--model-path)"),
    Var(
        "draft_model_path",
        "path",
        None,
        "the DFlash drafter's directory (--speculative-draft-model-path)",
        "the recipe's drafter path",
    ),
    Var("launch_module", "str", launch.LAUNCH_MODULE, "python -m module that starts the engine"),
    Var("served_model_name", "str", None, "--served-model-name"),
)


def inventory_recipe(ctx) -> recipe_mod.Recipe:
    """The inventory's recipe for this host, loaded (and validated) once per run."""
    st = HostRecipe.of(ctx)
    if st.inventory is None:
        st.inventory = recipe_mod.load(ctx.vars.get("recipe"))
    return st.inventory


def recipe_for(vars: dict, override: dict | None = None, cache: dict | None = None) -> recipe_mod.Recipe:
    """The recipe a host deploys: a baseline's recorded one when rolling back,
    else the inventory's, with the engine source fetched from a mirror when the
    inventory's `engine_source_mirrors` maps the recipe's git URL to one (like
    git's url.insteadOf; the commit stays the recipe's)."""
    if override:
        r = override.get("_recipe")
        if r is None:
            r = recipe_mod.load(override["recipe"])
            if override.get("source_url") and r.git:
                r = recipe_mod.with_source_url(r, override["source_url"], "the baseline's recorded source URL")
            override["_recipe"] = r
        return r
    cache = {} if cache is None else cache
    mirrors = vars.get("engine_source_mirrors") or {}
    if not isinstance(mirrors, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mirrors.items()):
        raise UserError("inventory var engine_source_mirrors must map a recipe's git URL to a mirror URL")
    for src_url, mirror in mirrors.items():  # git reads a value that starts with `-` as an option
        why = inputs.git_url_problem(mirror)
        if why:
            raise UserError(
                f"inventory var engine_source_mirrors[{src_url!r}]: {mirror!r}: not a git URL k26ops fetches: {why}"
            )
    key = (str(vars.get("recipe")), json.dumps(mirrors, sort_keys=True))
    if key not in cache:
        r = recipe_mod.load(vars.get("recipe"))
        if r.git and r.git.url in mirrors:
            r = recipe_mod.with_source_url(r, mirrors[r.git.url], "inventory var engine_source_mirrors")
        cache[key] = r
    return cache[key]


def effective_recipe(ctx) -> recipe_mod.Recipe:
    st = HostRecipe.of(ctx)
    if st.override:
        return recipe_for(ctx.vars, st.override)
    if st.effective is None:
        inventory_recipe(ctx)  # loads (and validates) the inventory's recipe once
        st.effective = recipe_for(ctx.vars)
    return st.effective


def profile_for(vars: dict, r: recipe_mod.Recipe) -> dict:
    """The engine profile: the recipe's defaults, then the inventory's overrides."""
    prof = dict(r.profile)
    prof.update(vars.get("engine_profile") or {})
    if r.drafter and r.drafter.path:
        prof.setdefault("draft_model_path", r.drafter.path)
    for key in (*PROFILE_VARS, *multinode.ENGINE_VARS):
        if key in vars:
            prof[key] = vars[key]
    if "engine_port" in vars:
        prof["port"] = vars["engine_port"]
    if vars.get("extra_flags"):
        prof["extra_args"] = vars["extra_flags"]
    if vars.get("monitoring"):
        prof["extra_args"] = with_metrics(prof.get("extra_args"))
    if vars.get("engine_env_file"):  # the secret flags' --config file lives beside it (EngineHost.secrets_path)
        prof["secrets_file"] = launch.secrets_file_beside(vars["engine_env_file"])
    return prof


def with_metrics(extra):
    """extra_args with --enable-metrics (the inventory's `monitoring`), unless already there."""
    if isinstance(extra, dict):
        return (
            extra
            if extra.get("--enable-metrics") or extra.get("enable-metrics")
            else {**extra, "--enable-metrics": True}
        )
    words = list(extra or [])
    return words if "--enable-metrics" in words else [*words, "--enable-metrics"]


def engine_profile(ctx, r: recipe_mod.Recipe | None = None) -> dict:
    return profile_for(ctx.vars, r or effective_recipe(ctx))


def lock_for(r: recipe_mod.Recipe) -> enginelock.Lock:
    """The engine's lock, which must belong to the recipe: a git source's to its commit
    and subdir, a registry release's to its version, install mode and pins."""
    where = "the repository and the package index" if r.git else "the package index"
    py = f" --python {r.python}" if len(r.pythons) > 1 else ""
    if recipe_mod.shipped(r.source):  # a wheel install: nobody writes into site-packages
        how = (
            f"make it with `k26ops engine lock {r.name}{py}` on a control node that reaches {where}: it "
            f"writes the recipe and its lock into your recipes dir ({config.recipes_dir()[0]}), "
            "where the deploy finds them"
        )
    else:
        how = (
            f"make it with `k26ops engine lock {r.source}{py}` on a control node that reaches {where}, "
            "then commit it beside the recipe"
        )
    lock = enginelock.load(r.lock_path)
    if r.git is None:
        if lock is None:
            raise UserError(f"{r.source}: no dependency lock for sglang=={r.sglang} ({r.lock_path} is missing): {how}")
        want = enginelock.registry_meta(r)
        bad = [k for k in ("source", "engine", "install", "requirements", "python") if lock.meta.get(k) != want[k]]
        if bad:
            k = bad[0]
            raise UserError(
                f"{r.lock_path}: the lock's {k} is {lock.meta.get(k) or '(none)'!r}, the recipe's is "
                f"{want[k]!r}: remake it: {how}"
            )
        return lock
    if lock is None:
        raise UserError(
            f"{r.source}: no dependency lock for {r.git.url} @ {r.git.commit[:12]} ({r.lock_path} is missing): {how}"
        )
    if lock.commit != r.git.commit or lock.meta.get("subdir", "python") != r.git.subdir:
        raise UserError(
            f"{r.lock_path}: the lock is for commit {lock.commit[:12] or '?'} "
            f"({lock.meta.get('subdir', 'python')}/), the recipe pins {r.git.commit[:12]} "
            f"({r.git.subdir}/): remake it: {how}"
        )
    return lock
