"""The engine profile's keys: one table, from which the recipe's allowed `engine_profile` keys
and their checks (release.recipe), the engine's command line (engine.launch.engine_argv) and the
flags extra_args may not repeat (MANAGED) are all made. A new engine flag is one row here and
its test (tests/engine/test_profile_table.py); docs/reference/profile.md is printed from the table.

Cross-field rules (DDTree needs page_size 1, a block size, ...) are not here: they are
release.launch_rules', checked on the command line this table makes (and on a recipe's
engine_profile when the recipe is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from k26ops.errors import UserError


@dataclass(frozen=True)
class ProfileKey:
    name: str
    kind: str  # int | str | bool | path | args
    flag: str | None  # the engine's flag; None: a key k26ops reads itself
    doc: str
    default: object = None  # used when the profile has no value (or, for int/str, an empty one)
    minimum: int | None = None  # int keys
    when: str | None = None  # given only when this key is set (speculative_algorithm)
    unless: str | None = None  # given only when this key is not set (disable_cuda_graph)
    recipe: bool = True  # a recipe's engine_profile may set it (else the inventory or k26ops only)
    empty_is_none: bool = False  # an empty value (None, "") gives no flag, not the default


# In command-line order: the rendered unit's argv follows it, so a reordering restarts engines.
KEYS: tuple[ProfileKey, ...] = (
    ProfileKey("model_path", "path", "--model-path", "the model's weights directory (required)"),
    ProfileKey("tp_size", "int", "--tp-size", "tensor-parallel size", 8, minimum=1),
    ProfileKey("trust_remote_code", "bool", "--trust-remote-code", "run the model repo's own code", True),
    ProfileKey("served_model_name", "str", "--served-model-name", "the model name the API answers with"),
    ProfileKey(
        "speculative_algorithm",
        "str",
        "--speculative-algorithm",
        "DDTREE, DFLASH, ... (empty: none)",
        "DDTREE",
        empty_is_none=True,
    ),
    ProfileKey(
        "draft_model_path",
        "path",
        "--speculative-draft-model-path",
        "the drafter's weights",
        when="speculative_algorithm",
    ),
    ProfileKey(
        "speculative_ddtree_budget",
        "int",
        "--speculative-ddtree-budget",
        "DDTree's token budget",
        minimum=1,
        when="speculative_algorithm",
    ),
    ProfileKey(
        "speculative_dflash_block_size",
        "int",
        "--speculative-dflash-block-size",
        "the drafter's block size (its config.json dflash_config.block_size)",
        minimum=1,
        when="speculative_algorithm",
    ),
    ProfileKey("page_size", "int", "--page-size", "KV-cache page size (DDTree: 1)", minimum=1),
    ProfileKey("attention_backend", "str", "--attention-backend", "attention backend for prefill and decode"),
    ProfileKey("prefill_attention_backend", "str", "--prefill-attention-backend", "prefill's attention backend"),
    ProfileKey("decode_attention_backend", "str", "--decode-attention-backend", "decode's attention backend"),
    ProfileKey("disable_cuda_graph", "bool", "--disable-cuda-graph", "no CUDA graphs (slow; for diagnosis)", False),
    ProfileKey(
        "cuda_graph_max_bs_decode",
        "int",
        "--cuda-graph-max-bs-decode",
        "largest decode batch captured",
        minimum=1,
        unless="disable_cuda_graph",
    ),
    ProfileKey(
        "cuda_graph_max_bs_prefill",
        "int",
        "--cuda-graph-max-bs-prefill",
        "largest prefill batch captured",
        minimum=1,
        unless="disable_cuda_graph",
    ),
    ProfileKey("host", "str", "--host", "the address the engine listens on", "127.0.0.1"),
    ProfileKey("port", "int", "--port", "the engine's HTTP port", 30000, minimum=1),
    # multinode: --node-rank and --dist-init-addr come from the run (engine.multinode), only when nnodes > 1
    ProfileKey("nnodes", "int", "--nnodes", "nodes one engine spans (> 1: multinode)", 1, minimum=1),
    ProfileKey("node_rank", "int", "--node-rank", "this node's rank (set per host by k26ops)", recipe=False),
    ProfileKey("dist_init_addr", "str", "--dist-init-addr", "rank 0's host:port (set by k26ops)", recipe=False),
    ProfileKey("launch_module", "str", None, "python -m module that starts the engine (sglang.launch_server)"),
    ProfileKey("extra_args", "args", None, "more engine flags, none of the ones above"),
    ProfileKey("python", "path", None, "the engine's python (default: the current release's venv)", recipe=False),
    ProfileKey("release_dir", "path", None, "the release whose venv runs the engine", recipe=False),
    ProfileKey("secrets_file", "path", None, "where the secret flags' --config file is kept", recipe=False),
)
BY_NAME = {k.name: k for k in KEYS}
MULTINODE = ("nnodes", "node_rank", "dist_init_addr")  # engine_argv gives them together, or none


def managed(keys: tuple[ProfileKey, ...] = KEYS) -> frozenset[str]:
    """The flags the table sets: extra_args may not repeat them."""
    return frozenset(k.flag for k in keys if k.flag)


MANAGED = managed()


def recipe_keys(keys: tuple[ProfileKey, ...] = KEYS) -> set[str]:
    """The keys a recipe's engine_profile may hold."""
    return {k.name for k in keys if k.recipe}


def recipe_int_minimums(keys: tuple[ProfileKey, ...] = KEYS) -> dict[str, int]:
    """A recipe's integer keys and their minimum."""
    return {k.name: k.minimum or 0 for k in keys if k.recipe and k.kind == "int"}


def integer(profile: Mapping, name: str, minimum: int = 0) -> int | None:
    """An integer profile value (None when unset), or UserError naming the key."""
    value = profile.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"engine profile: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def value(k: ProfileKey, profile: Mapping):
    """The key's value in a profile: its default when absent (or empty, unless empty_is_none)."""
    v = profile.get(k.name, k.default)
    if v is None or v == "":
        return None if k.empty_is_none else k.default
    return v


def argv(profile: Mapping, keys: tuple[ProfileKey, ...] = KEYS) -> list[str]:
    """The flags the table gives for a profile, in table order (multinode's apart: the caller's)."""
    by_name = {k.name: k for k in keys}
    out: list[str] = []
    for k in keys:
        if not k.flag or k.name in MULTINODE:
            continue
        if (k.when and not value(by_name[k.when], profile)) or (k.unless and value(by_name[k.unless], profile)):
            continue
        if k.kind == "int":
            integer(profile, k.name, k.minimum or 0)  # a wrong value is refused, naming the key
        v = value(k, profile)
        if k.kind == "bool":
            if v:
                out.append(k.flag)
        elif v is not None and v != "":
            out += [k.flag, str(v)]
    return out
