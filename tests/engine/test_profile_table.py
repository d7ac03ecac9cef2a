"""The engine profile table (k26ops.engine.profile_table) is the one home of an engine flag:
the recipe's allowed keys and checks, engine_argv and the flags extra_args may not repeat
all come from it. A new flag is a row there and a case here."""

from __future__ import annotations

import pytest

from k26ops.engine import launch
from k26ops.engine import profile_table as T
from k26ops.errors import UserError
from k26ops.release import recipe

FULL = {
    "model_path": "/models/m",
    "tp_size": 4,
    "served_model_name": "k2",
    "speculative_algorithm": "DDTREE",
    "draft_model_path": "/models/d",
    "speculative_ddtree_budget": 64,
    "speculative_dflash_block_size": 16,
    "page_size": 1,
    "attention_backend": "fa3",
    "prefill_attention_backend": "fa3",
    "decode_attention_backend": "flashinfer",
    "cuda_graph_max_bs_decode": 32,
    "cuda_graph_max_bs_prefill": 8,
    "host": "0.0.0.0",
    "port": 31000,
    "python": "/opt/py",
}


def test_the_command_line_is_the_table_in_order():
    argv = launch.engine_argv(FULL)
    assert argv[:3] == ["/opt/py", "-m", "sglang.launch_server"]
    flags = [w for w in argv if w.startswith("--")]
    table = [k.flag for k in T.KEYS if k.flag and k.name not in T.MULTINODE and k.name != "disable_cuda_graph"]
    assert flags == table
    assert argv == [
        "/opt/py", "-m", "sglang.launch_server", "--model-path", "/models/m", "--tp-size", "4",
        "--trust-remote-code", "--served-model-name", "k2", "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/models/d", "--speculative-ddtree-budget", "64",
        "--speculative-dflash-block-size", "16", "--page-size", "1", "--attention-backend", "fa3",
        "--prefill-attention-backend", "fa3", "--decode-attention-backend", "flashinfer",
        "--cuda-graph-max-bs-decode", "32", "--cuda-graph-max-bs-prefill", "8", "--host", "0.0.0.0",
        "--port", "31000",
    ]  # fmt: skip


def test_defaults_when_and_unless():
    argv = launch.engine_argv({"model_path": "/m", "python": "/p", "draft_model_path": "/d"})
    assert argv == ["/p", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "8",
                    "--trust-remote-code", "--speculative-algorithm", "DDTREE",
                    "--speculative-draft-model-path", "/d", "--host", "127.0.0.1", "--port", "30000"]  # fmt: skip
    # no speculative algorithm: none of its keys; no CUDA graphs: none of their sizes
    argv = launch.engine_argv({**FULL, "speculative_algorithm": None, "disable_cuda_graph": True, "tp_size": None})
    assert "--speculative-draft-model-path" not in argv and "--speculative-ddtree-budget" not in argv
    assert "--disable-cuda-graph" in argv and "--cuda-graph-max-bs-decode" not in argv
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert "--trust-remote-code" not in launch.engine_argv({**FULL, "trust_remote_code": False})


@pytest.mark.parametrize("key", [k.name for k in T.KEYS if k.kind == "int" and k.name not in T.MULTINODE])
def test_every_integer_key_is_refused_below_its_minimum_naming_it(key):
    low = T.BY_NAME[key].minimum - 1
    with pytest.raises(UserError, match=rf"engine profile: {key} must be an integer >= \d+, got {low}"):
        launch.engine_argv({**FULL, key: low})
    with pytest.raises(UserError, match=key):
        launch.engine_argv({**FULL, key: True})


def test_the_recipe_allowed_keys_and_managed_flags_are_the_tables():
    assert set(recipe.PROFILE_INT) | recipe.PROFILE_OTHER == {k.name for k in T.KEYS if k.recipe}
    assert recipe.PROFILE_INT == {k.name: k.minimum for k in T.KEYS if k.recipe and k.kind == "int"}
    assert launch.MANAGED_FLAGS == {k.flag for k in T.KEYS if k.flag}
    # a flag the table sets may not come again in extra_args (attention backends included)
    for flag in ("--attention-backend", "--page-size", "--node-rank"):
        with pytest.raises(UserError, match="extra_args"):
            launch.engine_argv({**FULL, "extra_args": [flag, "x"]})


def test_a_new_flag_is_one_row():
    """What adding a flag takes: a row. The argv, the managed flags and the recipe's keys follow."""
    row = T.ProfileKey("mem_fraction_static", "str", "--mem-fraction-static", "KV-cache share of GPU memory")
    keys = (*T.KEYS, row)
    assert T.argv({**FULL, "mem_fraction_static": "0.85"}, keys)[-2:] == ["--mem-fraction-static", "0.85"]
    assert "--mem-fraction-static" in T.managed(keys) and "mem_fraction_static" in T.recipe_keys(keys)
    assert "--mem-fraction-static" not in T.argv(FULL, keys)
    n = T.ProfileKey("max_running_requests", "int", "--max-running-requests", "cap", minimum=1)
    assert T.recipe_int_minimums((*T.KEYS, n))["max_running_requests"] == 1
