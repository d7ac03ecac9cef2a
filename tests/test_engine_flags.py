"""engine_flags: static reading of the real sglang 0.5.23 CLI, and of a copy with a
tiny fake DDTree overlay (two small edits made here, clearly named)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sglang_release  # noqa: E402

from k26ops.release import engine_flags as ef  # noqa: E402
from k26ops.errors import UserError  # noqa: E402

PROD = ["--model-path", "/models/k26", "--tp-size", "8", "--trust-remote-code",
        "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/models/draft",
        "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget", "32",
        "--page-size", "1", "--cuda-graph-max-bs-decode", "16"]


@pytest.fixture(scope="module")
def real() -> ef.EngineFlags:
    return ef.read_flags(sglang_release.site_packages())


def add_fake_ddtree_overlay(site: Path) -> None:
    """FAKE overlay for tests: registers DDTREE and --speculative-ddtree-budget the way
    upstream PR #29907 does (enum member + spec field); nothing else."""
    spec_info = site / "sglang/srt/speculative/spec_info.py"
    s = spec_info.read_text()
    assert s.count("    DFLASH = auto()\n") == 1
    spec_info.write_text(s.replace("    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()  # FAKE overlay (test)\n"))
    fields = site / "sglang/srt/arg_groups/fields/spec.py"
    s = fields.read_text()
    anchor = "    speculative_dflash_block_size: A["
    assert s.count(anchor) == 1
    fields.write_text(s.replace(anchor, '    speculative_ddtree_budget: A[Optional[int], "FAKE overlay (test): DDTree budget."] = None\n' + anchor))


def test_real_release_surface(real):
    assert real.version == "0.5.23"
    for name in ("--model-path", "--tp-size", "--speculative-algorithm", "--speculative-dflash-block-size",
                 "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill", "--page-size",
                 "--speculative-draft-model-path", "--speculative-draft-model", "--disable-cuda-graph",
                 "--sampling-backend", "--config"):
        assert name in real.flags, name
    assert "--cuda-graph-max-bs" not in real.flags
    assert not real.flags["--trust-remote-code"].takes_value
    assert real.flags["--disaggregation-mode"].choices == ("null", "prefill", "decode")
    assert {"DFLASH", "EAGLE", "EAGLE3", "NEXTN", "NGRAM"} <= real.spec_algorithms
    assert "DDTREE" not in real.spec_algorithms and not real.has_ddtree


def test_renamed_cuda_graph_max_bs(real):
    with pytest.raises(UserError) as ei:
        ef.validate(["--tp-size", "8", "--cuda-graph-max-bs", "16"], real.root)
    msg = str(ei.value)
    assert "--cuda-graph-max-bs " in msg and "0.5.23 renamed it" in msg
    assert "--cuda-graph-max-bs-decode" in msg and "--cuda-graph-max-bs-prefill" in msg


def test_ddtree_missing_on_plain_release(real):
    with pytest.raises(UserError, match="the DDTree source is missing: sglang 0.5.23 has no DDTREE; "
                                        "build the engine from a git source pinned to a DDTree commit"):
        ef.validate(PROD, real.root, real)
    with pytest.raises(UserError, match="DDTree source is missing"):
        ef.validate({"speculative_ddtree_budget": 32}, real.root, real)


def test_unknown_flag_suggests_and_choices(real):
    with pytest.raises(UserError, match=r"--tp-sise .*did you mean --tp-size"):
        ef.validate(["--tp-sise", "8"], real.root, real)
    with pytest.raises(UserError, match="not one of null, prefill, decode"):
        ef.validate(["--disaggregation-mode=both"], real.root, real)
    with pytest.raises(UserError, match="EAGLE9: not an algorithm"):
        ef.validate({"speculative-algorithm": "EAGLE9"}, real.root, real)
    ef.validate(["--speculative-algorithm", "dflash", "--tp-size=8", "--trust-remote-code",
                 "--cuda-graph-max-bs-decode", "16"], real.root, real)
    ef.validate({"tp_size": 8, "trust_remote_code": True, "disable_cuda_graph": False}, real.root, real)


def test_with_fake_overlay(tmp_path):
    site = sglang_release.copy_tree(tmp_path)
    add_fake_ddtree_overlay(site)
    flags = ef.read_flags(site)
    assert flags.has_ddtree and "--speculative-ddtree-budget" in flags.flags
    ef.validate(PROD, site, flags)
    with pytest.raises(UserError, match="renamed"):
        ef.validate(PROD + ["--cuda-graph-max-bs", "8"], site, flags)


def test_add_argument_style_tree(tmp_path):
    """Older layouts (and possibly the overlay) register flags with parser.add_argument."""
    srt = tmp_path / "sglang/srt"
    srt.mkdir(parents=True)
    (tmp_path / "sglang/version.py").write_text('__version__ = "0.4.9"\n')
    (srt / "server_args.py").write_text('''
def add_cli_args(parser):
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--speculative-algorithm", type=str, choices=["EAGLE", "DFLASH", "DDTREE"])
    parser.add_argument("--cuda-graph-max-bs", type=int)
    parser.add_argument("--disable-cuda-graph", action="store_true")
''')
    flags = ef.read_flags(tmp_path)
    assert flags.version == "0.4.9" and flags.spec_algorithms == {"EAGLE", "DFLASH", "DDTREE"}
    ef.validate(["--tp", "8", "--speculative-algorithm", "DDTREE", "--disable-cuda-graph",
                 "--cuda-graph-max-bs", "16"], tmp_path, flags)
    with pytest.raises(UserError, match="not accepted"):
        ef.validate(["--cuda-graph-max-bs-decode", "16"], tmp_path, flags)


def test_missing_tree(tmp_path):
    with pytest.raises(UserError, match="server_args.py: not found"):
        ef.read_flags(tmp_path)
