"""The engine's own start-up checks, evaluated by k26ops on the rendered command
line before any host changes.

Why: a DDTree engine that refuses its flags does so only after the weights
start loading on every host, in a restart loop. These rules are the checks the
engine makes in its argument hooks, read from the engine source at a named
commit (`SOURCE`); each names where it comes from, so when the base moves the
rule can be re-read. A violation is one line naming the flag and the fix.

This module is the one home of the profile's cross-field rules. They are judged twice:
on a recipe's `engine_profile` alone when the recipe is read (`profile_violations`: a
recipe names its speculation completely, so the error can name the recipe's file, line
and key), and on the whole rendered command line, inventory included, before any host
changes (`violations`). A rule with `recipe=False` reads what only the inventory may give.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from k26ops.engine import profile_table

# Where the rules were read: sglang PR #29907 (DDTree) at this commit.
PR29907 = "93e9850e430035f8a363fd881a6a0c5436b95108"
HOOK = f"python/sglang/srt/arg_groups/speculative_hook.py @ {PR29907[:12]} (sglang PR #29907)"
# Rules that are k26ops' own, not the engine's: what k26ops must know before a restart.
K26OPS = "k26ops: checked before any host, where the engine would decide only after the weights load"


class LaunchRuleError(ValueError):
    """One broken rule: `flag` is what to change."""

    def __init__(self, rule: "Rule", detail: str):
        self.rule, self.detail = rule, detail
        super().__init__(f"{rule.flag}: {detail} ({rule.where}); fix: {rule.fix}")


# The aliases of the flags these rules read, as sglang 0.5.23 declares them
# (python/sglang/srt/arg_groups/fields/*.py, `Arg(aliases=[...])`). Used when no
# engine sources are at hand (the checks before any host); with the release's
# sources, their own alias table is used instead (`violations(argv, engine)`).
ALIASES = {
    "--pipeline-parallel-size": "--pp-size",  # fields/parallel.py:63
    "--tensor-parallel-size": "--tp-size",  # fields/parallel.py:49
    "--decode-context-parallel-size": "--dcp-size",  # fields/parallel.py:56
    "--speculative-draft-model": "--speculative-draft-model-path",  # fields/spec.py:40
}


def parse_flags(argv: list[str], engine=None) -> dict[str, object]:
    """`--name value` and bare `--flag` (True) from an engine argv, under each flag's
    canonical name (an alias counts as its flag); the last one wins, as argparse does.
    With `engine` (engine_flags.EngineFlags): its aliases, its `--no-` forms (False)
    and how many words each flag takes; without, the ALIASES above and a guess (a flag
    followed by a word takes it). Anything before `-m MODULE` is the interpreter."""
    if "-m" in argv:
        argv = argv[argv.index("-m") + 2 :]
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--"):
            continue
        name, eq, val = a.partition("=")
        info = engine.flags.get(name) if engine is not None else None
        canon = info.canonical if info is not None else ALIASES.get(name, name)
        if info is not None and info.kind == "boolean_optional":
            out[canon] = not name.startswith("--no-")
        elif eq:
            out[canon] = val
        elif info is not None and info.kind == "store_true":
            out[canon] = True
        elif info is not None and info.nargs in ("+", "*"):
            vals = []
            while i < len(argv) and not argv[i].startswith("--"):
                vals.append(argv[i])
                i += 1
            out[canon] = vals
        elif i < len(argv) and not argv[i].startswith("--"):
            out[canon] = argv[i]
            i += 1
        else:
            out[canon] = True
    return out


def _int(flags, name, default=None):
    v = flags.get(name, default)
    try:
        return int(v) if v is not None and v is not True else None
    except (TypeError, ValueError):
        return None


def block_size(flags) -> int | None:
    """DFlash's verify window: --speculative-dflash-block-size, else --speculative-num-draft-tokens
    (_handle_dflash makes them equal; without either the engine reads the drafter's config)."""
    return _int(flags, "--speculative-dflash-block-size") or _int(flags, "--speculative-num-draft-tokens")


def attention_backends(flags) -> tuple[object, object]:
    """(prefill, decode): the split flags fall back to --attention-backend (attention_backends_of)."""
    base = flags.get("--attention-backend")
    return flags.get("--prefill-attention-backend") or base, flags.get("--decode-attention-backend") or base


@dataclass(frozen=True)
class Rule:
    name: str
    algorithms: tuple[str, ...]
    flag: str
    where: str
    fix: str
    check: Callable[[dict], str | None]  # the problem, or None
    recipe: bool = True  # judged on a recipe's engine_profile alone (False: reads what the inventory gives)


def _block_size_given(flags):
    if block_size(flags) is None:
        return (
            "the block size is not on the command line: the engine would read it from the drafter's "
            "config.json only after the weights load, and then check the full-tree/triton rule"
        )
    return None


def _full_tree_triton(flags):
    budget, block = _int(flags, "--speculative-ddtree-budget"), block_size(flags)
    if budget is None or block is None or budget <= block - 1:
        return None
    pre, dec = attention_backends(flags)
    if pre == "triton" and dec == "triton":
        return None
    return (
        f"--speculative-ddtree-budget {budget} > block size {block} - 1 (a full tree) needs the triton "
        f"attention backend for prefill and decode; got prefill {pre or '(default)'}, decode {dec or '(default)'}"
    )


def _dflash_block_matches(flags):
    a, b = _int(flags, "--speculative-dflash-block-size"), _int(flags, "--speculative-num-draft-tokens")
    if a is not None and b is not None and a != b:
        return f"--speculative-num-draft-tokens {b} differs from --speculative-dflash-block-size {a}"
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "drafter-path",
        ("DFLASH", "DDTREE"),
        "--speculative-draft-model-path",
        f"{HOOK}:_handle_dflash",
        "set the drafter's path (recipe `drafter.path` or inventory `draft_model_path`)",
        lambda f: (
            None
            if f.get("--speculative-draft-model-path") not in (None, True, "")
            else "DFLASH/DDTREE speculative decoding needs a drafter path"
        ),
        recipe=False,  # the recipe's drafter.path, or the inventory's draft_model_path
    ),
    Rule(
        "no-dp-attention",
        ("DFLASH", "DDTREE"),
        "--enable-dp-attention",
        f"{HOOK}:_handle_dflash",
        "remove --enable-dp-attention",
        lambda f: "DFLASH does not support dp attention" if f.get("--enable-dp-attention") else None,
    ),
    Rule(
        "pp-size-1",
        ("DFLASH", "DDTREE"),
        "--pp-size",
        f"{HOOK}:_handle_dflash",
        "use --pp-size 1",
        lambda f: None if _int(f, "--pp-size", 1) in (1, None) else f"DFLASH needs --pp-size 1, got {f['--pp-size']}",
    ),
    Rule(
        "block-size-match",
        ("DFLASH", "DDTREE"),
        "--speculative-num-draft-tokens",
        f"{HOOK}:_handle_dflash",
        "drop --speculative-num-draft-tokens or make it equal to the block size",
        _dflash_block_matches,
    ),
    Rule(
        "budget-positive",
        ("DDTREE",),
        "--speculative-ddtree-budget",
        f"{HOOK}:_handle_ddtree",
        "use a budget >= 1",
        lambda f: (
            None
            if _int(f, "--speculative-ddtree-budget", 1) is None or _int(f, "--speculative-ddtree-budget", 1) >= 1
            else f"--speculative-ddtree-budget must be >= 1, got {f['--speculative-ddtree-budget']}"
        ),
    ),
    Rule(
        "no-rejection-sampling",
        ("DDTREE",),
        "--speculative-use-rejection-sampling",
        f"{HOOK}:_handle_ddtree",
        "remove --speculative-use-rejection-sampling (DDTree samples on the target side)",
        lambda f: (
            "DDTREE does not support rejection sampling" if f.get("--speculative-use-rejection-sampling") else None
        ),
    ),
    # _handle_ddtree compares the raw field (`server_args.page_size != 1`), and at that
    # point of __post_init__ an unset page size may still be None: so it must be given.
    Rule(
        "page-size-1",
        ("DDTREE",),
        "--page-size",
        f"{HOOK}:_handle_ddtree",
        "set --page-size 1 (engine_profile page_size: 1)",
        lambda f: (
            None
            if _int(f, "--page-size") == 1
            else f"DDTREE supports only page size 1, got {f.get('--page-size') or 'none given (the raw field is checked)'}"
        ),
    ),
    # _handle_ddtree infers a missing block size from the drafter's config after the
    # weights load, then refuses a full tree without triton: so k26ops needs it given.
    # For DFLASH too: given, `k26ops check` compares it with the drafter's config.json.
    Rule(
        "block-size-given",
        ("DFLASH", "DDTREE"),
        "--speculative-dflash-block-size",
        f"{HOOK}:_handle_ddtree; {K26OPS}",
        "set engine_profile speculative_dflash_block_size to the drafter's block size "
        "(its config.json dflash_config.block_size)",
        _block_size_given,
    ),
    # The engine's default budget (block size - 1) is a chain, not a tree; the budget also
    # sets the verify graph's shape (budget + 1 tokens a request) and the full-tree rule below.
    Rule(
        "budget-given",
        ("DDTREE",),
        "--speculative-ddtree-budget",
        K26OPS,
        "set engine_profile speculative_ddtree_budget (DDTree's token budget)",
        lambda f: (
            None if _int(f, "--speculative-ddtree-budget") is not None else "DDTREE needs a tree budget, none given"
        ),
    ),
    Rule(
        "full-tree-triton",
        ("DDTREE",),
        "--attention-backend",
        f"{HOOK}:_handle_ddtree",
        "set --attention-backend triton (engine_profile attention_backend: triton), or a budget <= block size - 1",
        _full_tree_triton,
    ),
)


def violations(argv: list[str], engine=None, rules: tuple[Rule, ...] = RULES) -> list[LaunchRuleError]:
    """The rules an engine command line breaks (with `engine`: read with its own flag table)."""
    flags = parse_flags(argv, engine)
    algo = str(flags.get("--speculative-algorithm") or "").upper()
    out = []
    for rule in rules:
        if algo in rule.algorithms:
            problem = rule.check(flags)
            if problem:
                out.append(LaunchRuleError(rule, problem))
    return out


def profile_violations(profile: Mapping) -> list[tuple[str, LaunchRuleError]]:
    """The recipe-judged rules a recipe's engine_profile breaks, each with the profile key
    to change: the flag's row in the profile table, else `extra_args` (where the flag was given).
    A recipe that names no speculative algorithm leaves speculation to the inventory: judged
    at deploy only. One that names it names the keys its rules read."""
    if not profile.get("speculative_algorithm"):
        return []
    extra = profile.get("extra_args") or []
    argv = profile_table.argv(profile) + [str(a) for a in extra]
    keys = {k.flag: k.name for k in profile_table.KEYS if k.flag}
    return [
        (keys.get(bad.rule.flag, "extra_args"), bad)
        for bad in violations(argv, rules=tuple(r for r in RULES if r.recipe))
    ]
