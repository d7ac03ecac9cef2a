"""Launch rules: DDTree's own start-up checks (sglang PR #29907, _handle_dflash and
_handle_ddtree) evaluated on the rendered command line, before any host changes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent.parent))
from k26ops.engine import launch
from k26ops.errors import UserError  # noqa: E402
from k26ops.release import launch_rules
from k26ops.release import recipe as rc  # noqa: E402
from k26ops.steps.release import profile_for  # noqa: E402
from labtools import REPO
from labtools.invoke import cli


def argv_for(recipe_name: str, **over) -> list[str]:
    prof = profile_for({"model_path": "/models/Kimi-K2.6"}, rc.load(recipe_name))
    prof.update(over)
    return launch.engine_argv({k: v for k, v in prof.items() if v is not None})


@pytest.mark.parametrize("name", ["k26-tp8-ddtree", "lab", "k26-tp8-dflash-0.5.23", "lab-registry"])
def test_shipped_profiles_pass(name):
    assert launch_rules.violations(argv_for(name)) == []


@pytest.mark.parametrize(
    "over, rule, flag",
    [
        ({"attention_backend": "flashinfer"}, "full-tree-triton", "--attention-backend"),
        ({"attention_backend": None}, "full-tree-triton", "--attention-backend"),
        ({"decode_attention_backend": "fa3"}, "full-tree-triton", "--attention-backend"),
        ({"page_size": 16}, "page-size-1", "--page-size"),
        ({"page_size": None}, "page-size-1", "--page-size"),
        ({"draft_model_path": None}, "drafter-path", "--speculative-draft-model-path"),
        (
            {"extra_args": ["--speculative-use-rejection-sampling"]},
            "no-rejection-sampling",
            "--speculative-use-rejection-sampling",
        ),
        ({"extra_args": ["--enable-dp-attention"]}, "no-dp-attention", "--enable-dp-attention"),
        ({"extra_args": ["--pp-size", "2"]}, "pp-size-1", "--pp-size"),
        (
            {"extra_args": ["--speculative-num-draft-tokens", "16"]},
            "block-size-match",
            "--speculative-num-draft-tokens",
        ),
    ],
)
def test_each_rule_names_its_flag_source_and_fix(over, rule, flag):
    bad = launch_rules.violations(argv_for("k26-tp8-ddtree", **over))
    assert [b.rule.name for b in bad][:1] == [rule]
    msg = str(bad[0])
    assert msg.startswith(flag + ":") and "speculative_hook.py" in msg and "fix:" in msg and "\n" not in msg


def test_spine_tree_needs_no_triton_and_the_full_tree_boundary_is_block_minus_one():
    # budget <= block - 1: DDTree's spine mode, any attention backend
    assert (
        launch_rules.violations(argv_for("k26-tp8-ddtree", speculative_ddtree_budget=7, attention_backend="flashinfer"))
        == []
    )
    bad = launch_rules.violations(argv_for("k26-tp8-ddtree", speculative_ddtree_budget=8, attention_backend="fa3"))
    assert [b.rule.name for b in bad] == ["full-tree-triton"]
    # the split flags win over --attention-backend, as attention_backends_of does
    ok = argv_for(
        "k26-tp8-ddtree", attention_backend="fa3", prefill_attention_backend="triton", decode_attention_backend="triton"
    )
    assert launch_rules.violations(ok) == []


def _inventory(tmp_path: Path, **host_vars) -> Path:
    doc = yaml.safe_load((REPO / "inventory/example-rtxpro6000.yml").read_text())
    doc["vars"].update(host_vars)
    p = tmp_path / "inv.yml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_deploy_check_refuses_a_broken_rule_before_any_host(tmp_path):
    """The example inventory names unreachable addresses: exit 2 proves nothing was contacted."""
    inv = _inventory(tmp_path, engine_profile={"attention_backend": "flashinfer"})
    proc = cli("-i", str(inv), "deploy", "--check", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    assert "engine launch rule full-tree-triton: --attention-backend:" in proc.stderr
    assert "--speculative-ddtree-budget 32 > block size 8 - 1" in proc.stderr and "triton" in proc.stderr
    inv = _inventory(tmp_path, extra_flags=["--speculative-use-rejection-sampling"])
    proc = cli("-i", str(inv), "deploy", timeout=60)
    assert proc.returncode == 2 and "--speculative-use-rejection-sampling" in proc.stderr


def test_production_recipe_without_its_lock_refuses_with_the_command_that_makes_it(tmp_path):
    assert not rc.load().lock_path.exists(), "the production lock exists now: replace this test with one that uses it"
    proc = cli("-i", str(_inventory(tmp_path)), "deploy", "--check", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no dependency lock for https://github.com/sgl-project/sglang.git @ 93e9850e4300" in proc.stderr
    assert "k26ops engine lock" in proc.stderr


@pytest.fixture(scope="module")
def real_flags():
    sys.path.insert(0, str(Path(__file__).parent.parent))
    import sglang_release

    from k26ops.release import engine_flags

    return engine_flags.read_flags(sglang_release.site_packages())


def test_aliases_count_as_their_flags_in_the_rules(real_flags):
    """--pipeline-parallel-size is --pp-size; --speculative-draft-model is the drafter path
    (sglang 0.5.23's own alias table, and the static one used before any host)."""
    assert {a: real_flags.aliases.get(a) for a in launch_rules.ALIASES} == launch_rules.ALIASES
    pp = argv_for("k26-tp8-dflash-0.5.23", extra_args=["--pipeline-parallel-size", "2"])
    for table in (None, real_flags):
        assert [b.rule.name for b in launch_rules.violations(pp, table)] == ["pp-size-1"]
    drafter = argv_for(
        "k26-tp8-dflash-0.5.23", draft_model_path=None, extra_args=["--speculative-draft-model", "/models/draft"]
    )
    assert "--speculative-draft-model-path" not in drafter
    for table in (None, real_flags):
        assert launch_rules.violations(drafter, table) == []
    no_drafter = argv_for("k26-tp8-dflash-0.5.23", draft_model_path=None)
    assert [b.rule.name for b in launch_rules.violations(no_drafter, real_flags)] == ["drafter-path"]


def test_ddtree_without_a_block_size_is_refused_not_skipped():
    bad = launch_rules.violations(argv_for("k26-tp8-ddtree", speculative_dflash_block_size=None))
    assert [b.rule.name for b in bad] == ["block-size-given"]
    assert str(bad[0]).startswith("--speculative-dflash-block-size: ") and "drafter's config.json" in str(bad[0])
    # the block size from --speculative-num-draft-tokens (what _handle_dflash makes equal) still counts
    ok = argv_for(
        "k26-tp8-ddtree",
        speculative_dflash_block_size=None,
        attention_backend="triton",
        extra_args=["--speculative-num-draft-tokens", "8"],
    )
    assert launch_rules.violations(ok) == []


@pytest.mark.parametrize("recipe", ["k26-tp8-ddtree.yml", "k26-tp8-dflash-0.5.23.yml"])
def test_dflash_and_ddtree_recipes_must_give_the_block_size(recipe):
    path = REPO / "playbooks/recipes" / recipe
    text = path.read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("speculative_dflash_block_size:"))
    with pytest.raises(UserError) as ei:
        rc.parse(text.replace(line + "\n", ""), path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}:") and "engine_profile.speculative_dflash_block_size: " in msg
    assert "set engine_profile speculative_dflash_block_size" in msg and "\n" not in msg
    with pytest.raises(UserError) as ei:
        rc.parse(text.replace(line, line.replace(": 8", ": 16", 1)), path)
    assert "drafter.block_size: 8 differs from engine_profile speculative_dflash_block_size 16" in str(ei.value)


@pytest.mark.parametrize(
    "line, to, key, says",
    [
        ("speculative_ddtree_budget", "", "speculative_ddtree_budget", "DDTREE needs a tree budget"),
        ("page_size", "  page_size: 16", "page_size", "DDTREE supports only page size 1, got 16"),
        ("attention_backend", "  attention_backend: flashinfer", "attention_backend", "full tree"),
        ("port", "  port: 30000\n  extra_args: [--enable-dp-attention]", "extra_args", "dp attention"),
    ],
)
def test_a_recipe_is_judged_by_the_launch_rules_naming_its_file_line_and_key(line, to, key, says):
    """The cross-field rules have one home, launch_rules: recipe.parse asks it about the
    recipe's engine_profile and names the key to change (extra_args for a flag given there)."""
    path = REPO / "playbooks/recipes/k26-tp8-ddtree.yml"
    text, n = re.subn(rf"(?m)^  {line}:.*$\n?", to + "\n" if to else "", path.read_text(), count=1)
    assert n == 1
    with pytest.raises(UserError) as ei:
        rc.parse(text, path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}:") and f"engine_profile.{key}: " in msg and says in msg and "\n" not in msg


def test_a_recipe_that_names_no_algorithm_leaves_speculation_to_the_inventory():
    """Judged at deploy, on the whole command line: the inventory's engine_profile may complete it."""
    assert launch_rules.profile_violations({"tp_size": 8}) == []
    assert [key for key, _bad in launch_rules.profile_violations({"speculative_algorithm": "DDTREE"})] == [
        "page_size",
        "speculative_dflash_block_size",
        "speculative_ddtree_budget",
    ]


def test_recipe_parse_holds_no_cross_field_rule_of_its_own():
    """Where does a rule like "DDTREE needs page size 1" go: launch_rules only (issue 48). The
    recipe's parser names no algorithm, so a copied rule cannot creep back unseen."""
    source = (REPO / "k26ops/release/recipe.py").read_text()
    assert not re.search(r"\bDDTREE\b|\bDFLASH\b|speculative_algorithm", source), "rules go in launch_rules.RULES"
