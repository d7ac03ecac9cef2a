"""engine_flags: static reading of the real sglang 0.5.23 CLI, and of a copy with a
tiny fake DDTree overlay (two small edits made here, clearly named)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
import sglang_release  # noqa: E402

from k26ops.errors import UserError  # noqa: E402
from k26ops.release import engine_flags as ef  # noqa: E402

PROD = [
    "--model-path",
    "/models/k26",
    "--tp-size",
    "8",
    "--trust-remote-code",
    "--speculative-algorithm",
    "DDTREE",
    "--speculative-draft-model-path",
    "/models/draft",
    "--speculative-dflash-block-size",
    "8",
    "--speculative-ddtree-budget",
    "32",
    "--page-size",
    "1",
    "--cuda-graph-max-bs-decode",
    "16",
]


@pytest.fixture(scope="module")
def real() -> ef.EngineFlags:
    return ef.read_flags(sglang_release.site_packages())


def add_fake_ddtree_overlay(site: Path) -> None:
    """FAKE overlay for tests: registers DDTREE and --speculative-ddtree-budget the way
    upstream PR #29907 does (enum member + spec field); nothing else. Each file is
    replaced (temp file, rename), never written through: site may be a hard-linked copy."""

    def write(path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    spec_info = site / "sglang/srt/speculative/spec_info.py"
    s = spec_info.read_text()
    assert s.count("    DFLASH = auto()\n") == 1
    write(
        spec_info,
        s.replace("    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()  # FAKE overlay (test)\n"),
    )
    fields = site / "sglang/srt/arg_groups/fields/spec.py"
    s = fields.read_text()
    anchor = "    speculative_dflash_block_size: A["
    assert s.count(anchor) == 1
    write(
        fields,
        s.replace(
            anchor,
            '    speculative_ddtree_budget: A[Optional[int], "FAKE overlay (test): DDTree budget."] = None\n' + anchor,
        ),
    )


def test_real_release_surface(real):
    assert real.version == "0.5.23"
    for name in (
        "--model-path",
        "--tp-size",
        "--speculative-algorithm",
        "--speculative-dflash-block-size",
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
        "--page-size",
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        "--disable-cuda-graph",
        "--sampling-backend",
        "--config",
    ):
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
    with pytest.raises(
        UserError,
        match="the DDTree source is missing: sglang 0.5.23 has no DDTREE; "
        "build the engine from a git source pinned to a DDTree commit",
    ):
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
    ef.validate(
        ["--speculative-algorithm", "dflash", "--tp-size=8", "--trust-remote-code", "--cuda-graph-max-bs-decode", "16"],
        real.root,
        real,
    )
    ef.validate({"tp_size": 8, "trust_remote_code": True, "disable_cuda_graph": False}, real.root, real)


def test_with_fake_overlay(tmp_path):
    """On a hard-linked copy of the release (the overlay replaces the files it changes)."""
    from k26ops.release import prepcache

    site = tmp_path
    prepcache.linked_copy(sglang_release.site_packages() / "sglang", site / "sglang")
    add_fake_ddtree_overlay(site)
    assert "DDTREE" not in (sglang_release.site_packages() / "sglang/srt/speculative/spec_info.py").read_text()
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
    (srt / "server_args.py").write_text("""
def add_cli_args(parser):
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--speculative-algorithm", type=str, choices=["EAGLE", "DFLASH", "DDTREE"])
    parser.add_argument("--cuda-graph-max-bs", type=int)
    parser.add_argument("--disable-cuda-graph", action="store_true")
""")
    flags = ef.read_flags(tmp_path)
    assert flags.version == "0.4.9" and flags.spec_algorithms == {"EAGLE", "DFLASH", "DDTREE"}
    ef.validate(
        ["--tp", "8", "--speculative-algorithm", "DDTREE", "--disable-cuda-graph", "--cuda-graph-max-bs", "16"],
        tmp_path,
        flags,
    )
    with pytest.raises(UserError, match="not accepted"):
        ef.validate(["--cuda-graph-max-bs-decode", "16"], tmp_path, flags)


def test_missing_tree(tmp_path):
    with pytest.raises(UserError, match="server_args.py: not found"):
        ef.read_flags(tmp_path)


# ---- the parser as 0.5.23 builds it (arg_groups/arg_utils.py add_cli_args_from_dataclass)


def _fields_text(real) -> str:
    return "".join(p.read_text() for p in sorted((real.root / "sglang/srt/arg_groups/fields").glob("*.py")))


def test_boolean_optional_flags_take_no_value_and_have_their_no_forms(real):
    bools = sorted({f.canonical for f in real.flags.values() if f.kind == "boolean_optional"})
    # as many as the fields declare with argparse.BooleanOptionalAction (read as text here)
    assert len(bools) == _fields_text(real).count("action=argparse.BooleanOptionalAction") == 12
    assert "--enable-tf32-matmul" in bools and "--speculative-enable-w4a4-mxfp4-megamoe" in bools
    for b in bools:
        ef.validate([b, "--tp-size", "8"], real.root, real)
        ef.validate(["--no-" + b[2:], "--tp-size", "8"], real.root, real)
    with pytest.raises(UserError, match=r"^engine flags: unrecognized arguments: yes \(the parser of sglang 0.5.23\)$"):
        ef.validate(["--enable-tf32-matmul", "yes"], real.root, real)
    with pytest.raises(UserError, match="not accepted"):  # plain store_true flags have no --no- form
        ef.validate(["--no-trust-remote-code"], real.root, real)


def test_list_flags_take_all_their_values_and_the_mapping_form_renders_them_once(real):
    from k26ops.engine import launch

    assert real.flags["--cuda-graph-bs-decode"].nargs == "+"  # Optional[List[int]] -> nargs '+'
    ef.validate(["--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "--tp-size", "8"], real.root, real)
    with pytest.raises(UserError, match="argument --cuda-graph-bs-decode: expected at least one argument"):
        ef.validate(["--cuda-graph-bs-decode", "--tp-size", "8"], real.root, real)
    with pytest.raises(UserError, match=r"--cuda-graph-bs-decode x: not an int \(sglang 0.5.23, fields/exec_.py:\d+\)"):
        ef.validate(["--cuda-graph-bs-decode", "1", "x"], real.root, real)
    argv = launch.engine_argv(
        {
            "model_path": "/m",
            "speculative_algorithm": None,
            "extra_args": {"cuda-graph-bs-decode": [1, 2, 4, 8, 16], "enable-tf32-matmul": True},
        }
    )
    i = argv.index("--cuda-graph-bs-decode")
    assert argv.count("--cuda-graph-bs-decode") == 1 and argv[i : i + 6] == [
        "--cuda-graph-bs-decode",
        "1",
        "2",
        "4",
        "8",
        "16",
    ]
    ef.validate(argv[3:], real.root, real)


def _assigned(path: Path, name: str):
    import ast

    tree = ast.parse(path.read_text())
    return next(
        ast.literal_eval(st.value)
        for st in tree.body
        if isinstance(st, ast.Assign) and any(getattr(t, "id", None) == name for t in st.targets)
    )


def test_named_choice_lists_and_types_are_checked(real):
    choices_py = real.root / "sglang/srt/arg_groups/choices.py"
    backends = _assigned(choices_py, "ATTENTION_BACKEND_CHOICES")
    assert "triton" in backends and list(real.flags["--attention-backend"].choices) == backends
    assert list(real.flags["--speculative-draft-load-format"].choices) == _assigned(choices_py, "LOAD_FORMAT_CHOICES")
    assert real.flags["--cuda-graph-backend-decode"].choices is None  # a type_parser runs first: left to the engine
    with pytest.raises(UserError) as ei:
        ef.validate(["--attention-backend", "tritonn"], real.root, real)
    msg = str(ei.value)
    assert msg.startswith("engine flag --attention-backend tritonn: not one of triton, ") and "\n" not in msg
    assert all(b in msg for b in backends) and "fields/exec_.py:" in msg
    ef.validate(["--attention-backend", "triton", "--decode-attention-backend", "fa3"], real.root, real)
    with pytest.raises(UserError, match="--tp-size eight: not an int"):
        ef.validate(["--tp-size", "eight"], real.root, real)
    with pytest.raises(UserError, match="argument --tp-size/--tensor-parallel-size: expected one argument"):
        ef.validate(["--tp-size"], real.root, real)


def test_aliases_are_accepted_as_their_flags(real):
    assert real.aliases["--pipeline-parallel-size"] == "--pp-size"
    assert real.aliases["--speculative-draft-model"] == "--speculative-draft-model-path"
    ef.validate(
        [
            "--pipeline-parallel-size",
            "1",
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model",
            "/models/draft",
            "--tensor-parallel-size",
            "8",
        ],
        real.root,
        real,
    )
