"""The None-field probe patch against the REAL sglang 0.5.23 sources.

The patch is applied with `patch -p1` to a copy of the released tree; the
patched functions are then taken from the patched files (their source, via ast:
importing sglang pulls CUDA-only dependencies) and run with torch on the CPU.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import sglang_release

from k26ops.diagnose.classify import classify

# In CI (CI=true) nothing here may skip: a missing dependency must fail the run.
torch = (
    __import__("torch")
    if os.environ.get("CI")
    else pytest.importorskip("torch", reason="pip install torch==2.13.0 (CPU wheel)")
)

PATCH = Path(__file__).resolve().parent.parents[1] / "patches/sglang-0.5.23/cuda-graph-none-probe.patch"
BUFFERS = "sglang/srt/model_executor/runner_utils/buffers.py"
REGISTRY = "sglang/srt/model_executor/cuda_graph_buffer_registry.py"
DECODE_RUNNER = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
PREFILL_RUNNER = "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py"
INPUT_BUFFERS = "sglang/srt/model_executor/input_buffers.py"
MODULES = {
    BUFFERS: "sglang.srt.model_executor.runner_utils.buffers",
    REGISTRY: "sglang.srt.model_executor.cuda_graph_buffer_registry",
}
# What the tests read or patch: the patch's files and the file _registry_module reads beside them.
FILES = [*sglang_release.patched_paths(PATCH), INPUT_BUFFERS]
FIELDS = ["input_ids", "req_pool_indices", "seq_lens", "out_cache_loc", "positions"]

pytestmark = pytest.mark.skipif(shutil.which("patch") is None and not os.environ.get("CI"), reason="needs GNU patch")


def _patch(root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["patch", "-p1", "--batch", *extra, "-d", str(root)], input=PATCH.read_bytes(), capture_output=True
    )


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """(pristine, patched): the released sglang tree (the read-only cache) and a copy
    of the files the patch touches, patched."""
    pristine = sglang_release.site_packages()
    patched = sglang_release.copy_files(tmp_path_factory.mktemp("patched"), FILES)
    result = _patch(patched)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    return pristine, patched


def _load(root: Path, rel: str, *names: str) -> dict:
    """Exec the named top-level functions of a real file in a torch namespace."""
    tree = ast.parse((root / rel).read_text(), filename=str(root / rel))
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    methods = [
        m
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for m in c.body
        if isinstance(m, ast.FunctionDef) and m.name in names
    ]
    assert {n.name for n in wanted + methods} == set(names), f"missing in {rel}"
    ns = {
        "torch": torch,
        "__name__": MODULES[rel],
        "_has_foreach_copy": hasattr(torch, "_foreach_copy_"),
        **{k: getattr(typing, k) for k in typing.__all__ if hasattr(typing, k)},
    }
    module = ast.Module(body=wanted + methods, type_ignores=[])
    exec(compile(module, str(root / rel), "exec"), ns)
    return ns


def _inputs():
    gen = torch.Generator().manual_seed(7)
    srcs = [
        torch.randint(0, 50000, (16,), generator=gen, dtype=torch.int64),
        torch.randint(0, 64, (2,), generator=gen, dtype=torch.int64),
        torch.randint(1, 4096, (2,), generator=gen, dtype=torch.int32),
        torch.randint(0, 1 << 20, (16,), generator=gen, dtype=torch.int64),
        torch.randn(16, generator=gen, dtype=torch.float32),
    ]
    dst_dtypes = [torch.int64, torch.int32, torch.int64, torch.int32, torch.bfloat16]
    dsts = [torch.zeros(s.shape[0], dtype=d) for s, d in zip(srcs, dst_dtypes)]
    return dsts, srcs


def test_header_names_base_and_purpose():
    head = PATCH.read_text().split("\n--- ", 1)[0]
    assert "Base: sglang==0.5.23 (PyPI)" in head
    assert "_grouped_foreach_copy_" in head and "K26OPS-PROBE" in head
    assert "fill_from" in head and "K26OPS-PROBE watched:" in head


def test_applies_and_reverts_byte_exact(tmp_path):
    """On a copy of the files the patch names (patch -p1 writes no other) and one beside them."""
    root = sglang_release.copy_files(tmp_path, FILES)
    before = {p: p.read_bytes() for p in root.rglob("*.py")}
    assert _patch(root, "--dry-run").returncode == 0
    assert _patch(root).returncode == 0
    changed = {str(p.relative_to(root)) for p, b in before.items() if p.read_bytes() != b}
    assert {BUFFERS, REGISTRY, DECODE_RUNNER, PREFILL_RUNNER} <= changed
    assert _patch(root, "-R").returncode == 0
    assert all(p.read_bytes() == b for p, b in before.items())
    assert not list(root.rglob("*.orig")) and not list(root.rglob("*.rej"))


@pytest.mark.parametrize("rel", [BUFFERS, REGISTRY])
def test_none_source_raises_the_tagged_error(trees, rel):
    fn = _load(trees[1], rel, "_grouped_foreach_copy_")["_grouped_foreach_copy_"]
    dsts, srcs = _inputs()
    srcs[2] = None
    with pytest.raises(RuntimeError) as info:
        fn(dsts, srcs, names=FIELDS)
    assert str(info.value) == (
        f"K26OPS-PROBE cuda-graph-none-field: src[2] (seq_lens) is None in _grouped_foreach_copy_ ({MODULES[rel]})"
    )
    assert all(int(d.abs().sum()) == 0 for d in dsts), "nothing copied before the error"
    diagnosis = classify(f"[2026-05-20 08:02:44 TP3] RuntimeError: {info.value}")
    assert diagnosis.signature == "cuda-graph-none-field"
    assert diagnosis.detail["field"] == "seq_lens" and diagnosis.detail["index"] == 2


@pytest.mark.parametrize("rel", [BUFFERS, REGISTRY])
def test_none_destination_and_unnamed_index(trees, rel):
    fn = _load(trees[1], rel, "_grouped_foreach_copy_")["_grouped_foreach_copy_"]
    dsts, srcs = _inputs()
    dsts[0] = None
    with pytest.raises(
        RuntimeError,
        match=r"^K26OPS-PROBE cuda-graph-none-field: dst\[0\] "
        r"\(input_ids\) is None",
    ):
        fn(dsts, srcs, names=FIELDS)
    dsts, srcs = _inputs()
    srcs[4] = None  # called without names (an uninstrumented call site)
    with pytest.raises(
        RuntimeError,
        match=r"^K26OPS-PROBE cuda-graph-none-field: src\[4\] is None"
        r" in _grouped_foreach_copy_",
    ):
        fn(dsts, srcs)


@pytest.mark.parametrize("rel", [BUFFERS, REGISTRY])
def test_valid_inputs_copied_exactly_as_before(trees, rel):
    pristine = _load(trees[0], rel, "_grouped_foreach_copy_")["_grouped_foreach_copy_"]
    patched = _load(trees[1], rel, "_grouped_foreach_copy_")["_grouped_foreach_copy_"]
    old_dsts, srcs = _inputs()
    new_dsts, _ = _inputs()
    pristine(old_dsts, srcs)
    patched(new_dsts, srcs, names=FIELDS)
    for old, new, src in zip(old_dsts, new_dsts, srcs):
        assert old.dtype == new.dtype and torch.equal(old, new)
        assert torch.equal(new, src.to(new.dtype))


@pytest.mark.parametrize("rel", [BUFFERS, REGISTRY])
def test_unpatched_function_fails_without_a_name(trees, rel):
    fn = _load(trees[0], rel, "_grouped_foreach_copy_")["_grouped_foreach_copy_"]
    dsts, srcs = _inputs()
    srcs[2] = None
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'dtype'"):
        fn(dsts, srcs)


def test_registry_copy_slots_names_the_slot(trees):
    ns = _registry_module(trees[1])
    ns["copy_slots"] = ns["CudaGraphBufferRegistry"].copy_slots
    registry = type("Registry", (), {})()  # carries only the attribute copy_slots reads
    registry._slots = {
        name: type("Slot", (), {"buffer": torch.zeros(8, dtype=torch.int64)})()
        for name in ("seq_lens", "req_pool_indices")
    }
    sources = {"req_pool_indices": torch.arange(2), "seq_lens": torch.tensor([5, 9])}
    ns["copy_slots"](registry, sources)
    assert registry._slots["seq_lens"].buffer[:2].tolist() == [5, 9]
    sources["seq_lens"] = None
    with pytest.raises(RuntimeError, match=r"src\[1\] \(seq_lens\) is None"):
        ns["copy_slots"](registry, sources)


# ---------------------------------------------------------------- fill_from (the DFLASH graph paths)


def _registry_module(root: Path) -> dict:
    """The real cuda_graph_buffer_registry.py executed whole on the CPU, its sglang
    imports replaced: INDEX_SEMANTIC_BUFFERS read from the real input_buffers.py,
    the pool sharing off (share_pool=False below), the fill fast path at its default."""
    tree = ast.parse((root / REGISTRY).read_text(), filename=str(root / REGISTRY))
    body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang"))
        and not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    ]
    index = [
        n
        for n in ast.parse((root / INPUT_BUFFERS).read_text()).body  # 0.5.23 (0.5.17 has none)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "INDEX_SEMANTIC_BUFFERS"
    ]
    flag = type("EnvBool", (), {"get": lambda self: False})()
    ns = {
        "__name__": MODULES[REGISTRY],
        "ForwardBatch": object,
        "share_input_buffer": lambda name, buf: buf,
        "get_parallel": None,
        "envs": type("Envs", (), {"SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH": flag})(),
    }
    module = types.ModuleType(MODULES[REGISTRY])  # dataclasses look their module up
    module.__dict__.update(ns)
    saved = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        exec(
            compile(ast.Module(body=[*body[:2], *index, *body[2:]], type_ignores=[]), str(root / REGISTRY), "exec"),
            module.__dict__,
        )
    finally:
        if saved is None:
            del sys.modules[module.__name__]
        else:
            sys.modules[module.__name__] = saved
    return module.__dict__


def _decode_registry(ns):
    return ns["build_decode_registry"](
        device=torch.device("cpu"),
        max_bs=4,
        max_num_token=16,
        seq_len_fill_value=1,
        cache_loc_dtype=torch.int64,
        register_global_num_tokens=False,
        share_pool=False,
    )


def _batch(step: int, **override):
    """A verify batch as fill_from reads it: 2 requests of 4 tokens."""
    fb = {
        "input_ids": torch.arange(8) + 100 * step,
        "positions": torch.arange(8) + 10 * step,
        "out_cache_loc": torch.arange(8) + 1000 * step,
        "req_pool_indices": torch.tensor([3, 1]),
        "seq_lens": torch.tensor([20, 30]) + step,
        "seq_lens_cpu": torch.tensor([20, 30]) + step,
        "mrope_positions": None,
        "input_embeds": None,
    }
    fb.update(override)
    return type("FB", (), fb)()


def _fill(reg, fb):
    reg.fill_from(fb, raw_bs=2, padded_bs=2, raw_num_tokens=8, padded_num_tokens=8)


@pytest.fixture(scope="module")
def registry_modules(trees):
    return _registry_module(trees[0]), _registry_module(trees[1])


def test_unpatched_fill_from_skips_a_none_silently_and_replays_stale_contents(registry_modules):
    """What the issue says of 0.5.23: no error, the graph reads the previous step's seq_lens."""
    reg = _decode_registry(registry_modules[0])
    _fill(reg, _batch(1))
    _fill(reg, _batch(2, seq_lens=None))
    assert reg.get_slot("seq_lens").buffer[:2].tolist() == [21, 31]  # step 1's, not step 2's
    assert reg.get_slot("input_ids").buffer[:8].tolist() == (torch.arange(8) + 200).tolist()


@pytest.mark.parametrize("graph", ["verify", "draft"])
def test_patched_fill_from_names_the_none_slot_and_the_graph(trees, graph, capfd):
    ns = _registry_module(trees[1])  # its own counters
    reg = _decode_registry(ns)
    reg.k26ops_probe_graph = graph
    _fill(reg, _batch(1))
    with pytest.raises(RuntimeError) as info:
        _fill(reg, _batch(2, seq_lens=None))
    assert str(info.value) == (
        f"K26OPS-PROBE cuda-graph-none-field: slot seq_lens is None in fill_from ({graph} graph; {MODULES[REGISTRY]})"
    )
    err = capfd.readouterr().err.splitlines()
    assert err[-1] == (f"K26OPS-PROBE watched: fill_from[{graph}]=1 slots_checked=6 pid={os.getpid()}"), err
    d = classify(f"[2026-05-20 08:02:44 TP0] RuntimeError: {info.value}")
    assert d.signature == "cuda-graph-none-field" and d.detail["field"] == "seq_lens"
    assert d.detail["graph"] == graph
    from k26ops.diagnose.probe import watched_counts

    assert watched_counts("\n".join(err)) == {"fill_from": {graph: 1}, "copy_slots": 0, "slots_checked": 6}


def test_patched_fill_from_size_mismatch_and_slots_that_had_a_tensor(registry_modules):
    reg = _decode_registry(registry_modules[1])
    reg.k26ops_probe_graph = "verify"
    with pytest.raises(
        RuntimeError,
        match=r"^K26OPS-PROBE cuda-graph-size-mismatch: slot seq_lens source \[3\] vs "
        r"buffer slice \[2\] in fill_from \(verify graph;",
    ):
        _fill(reg, _batch(1, seq_lens=torch.tensor([1, 2, 3])))
    reg = _decode_registry(registry_modules[1])
    reg.k26ops_probe_graph = "verify"
    _fill(reg, _batch(1, seq_lens_cpu=None))  # never given: an optional slot, skipped as before
    _fill(reg, _batch(2))
    with pytest.raises(RuntimeError, match=r"slot seq_lens_cpu is None in fill_from \(verify graph"):
        _fill(reg, _batch(3, seq_lens_cpu=None))  # given at step 2, gone at step 3: stale
    d = classify(
        "RuntimeError: K26OPS-PROBE cuda-graph-size-mismatch: slot seq_lens source [3] vs buffer "
        "slice [2] in fill_from (verify graph; m)"
    )
    assert d.signature == "cuda-graph-shape-mismatch" and d.detail["field"] == "seq_lens"
    assert d.detail["got"] == 3 and d.detail["expected"] == 2 and d.detail["graph"] == "verify"


def test_patched_fill_from_copies_valid_batches_exactly_and_leaves_unlabelled_registries_alone(registry_modules):
    old, new = _decode_registry(registry_modules[0]), _decode_registry(registry_modules[1])
    new.k26ops_probe_graph = "verify"
    for step in (1, 2):
        _fill(old, _batch(step, input_embeds=torch.zeros(8, 4)))
        _fill(new, _batch(step, input_embeds=torch.zeros(8, 4)))
        for name in old.slot_names():
            assert torch.equal(old.get_slot(name).buffer, new.get_slot(name).buffer), name
    # input_ids may be None beside input_embeds (an embeddings batch): not an error
    _fill(new, _batch(3, input_ids=None, input_embeds=torch.zeros(8, 4)))
    eager = _decode_registry(registry_modules[1])  # unlabelled: e.g. the eager runner's registry
    before = dict(registry_modules[1]["_K26OPS_PROBE_WATCHED"])
    _fill(eager, _batch(1, seq_lens=None))
    assert registry_modules[1]["_K26OPS_PROBE_WATCHED"] == before


def _label_expr(root: Path, rel: str) -> ast.expr:
    tree = ast.parse((root / rel).read_text())
    found = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "self.buffer_registry.k26ops_probe_graph"
    ]
    assert len(found) == 1, rel
    return found[0]


@pytest.mark.parametrize("draft,mode,want", [(True, True, "draft"), (False, True, "verify"), (False, False, "decode")])
def test_decode_runner_labels_its_registry_draft_or_verify(trees, draft, mode, want):
    """The patched decode runner's label, evaluated on runner/batch objects shaped like DFLASH's."""
    expr = _label_expr(trees[1], DECODE_RUNNER)
    runner = type("R", (), {"model_runner": type("MR", (), {"is_draft_worker": draft})()})()
    fb = type("FB", (), {"forward_mode": type("M", (), {"is_target_verify": lambda self: mode})()})()
    assert eval(compile(ast.Expression(expr), "label", "eval"), {"self": runner, "forward_batch": fb}) == want
    assert ast.literal_eval(_label_expr(trees[1], PREFILL_RUNNER)) == "prefill"
    tree = ast.parse((trees[1] / DECODE_RUNNER).read_text())
    load = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "load_batch")
    src = ast.unparse(load)
    assert src.index("k26ops_probe_graph") < src.index("self.buffer_registry.fill_from(")


# ---------------------------------------------------------------- the 0.5.17 probe, on the real 0.5.17 wheel

PATCH_17 = PATCH.parents[1] / "sglang-0.5.17/cuda-graph-none-probe.patch"


def test_0517_probe_applies_reverts_and_names_the_none(tmp_path, capfd):
    root = sglang_release.copy_files(
        tmp_path / "t", [*sglang_release.patched_paths(PATCH_17), INPUT_BUFFERS], version="0.5.17"
    )
    before = {p: p.read_bytes() for p in root.rglob("*.py")}

    def run(*extra):
        return subprocess.run(
            ["patch", "-p1", "--batch", *extra, "-d", str(root)], input=PATCH_17.read_bytes(), capture_output=True
        )

    assert run("--dry-run").returncode == 0
    res = run()
    assert res.returncode == 0 and b"offset" not in res.stdout and b"fuzz" not in res.stdout, res.stdout
    from k26ops.release import patchset

    p = patchset.parse_patch(PATCH_17.read_text(), PATCH_17.name)
    assert [(b[0], b[1]) for b in p.bases] == [("sglang", "==0.5.17")]
    ns = _registry_module(root)
    reg = _decode_registry(ns)
    _label = _label_expr(root, DECODE_RUNNER)
    runner = type("R", (), {"model_runner": type("MR", (), {"is_draft_worker": True})()})()
    fb_mode = type("FB", (), {"forward_mode": type("M", (), {"is_target_verify": lambda self: True})()})()
    reg.k26ops_probe_graph = eval(
        compile(ast.Expression(_label), "label", "eval"), {"self": runner, "forward_batch": fb_mode}
    )
    _fill(reg, _batch(1))
    with pytest.raises(
        RuntimeError,
        match=r"^K26OPS-PROBE cuda-graph-none-field: slot out_cache_loc is None in "
        r"fill_from \(draft graph; ",
    ):
        _fill(reg, _batch(2, out_cache_loc=None))
    assert "K26OPS-PROBE watched: fill_from[draft]=1 slots_checked=6" in capfd.readouterr().err
    assert run("-R").returncode == 0
    assert all(p.read_bytes() == b for p, b in before.items())
