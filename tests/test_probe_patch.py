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
import typing
from pathlib import Path

import pytest

import sglang_release
from k26ops.diagnose.classify import classify

# In CI (CI=true) nothing here may skip: a missing dependency must fail the run.
torch = (__import__("torch") if os.environ.get("CI")
         else pytest.importorskip("torch", reason="pip install torch==2.13.0 (CPU wheel)"))

PATCH = Path(__file__).resolve().parents[1] / "patches/sglang-0.5.23/cuda-graph-none-probe.patch"
BUFFERS = "sglang/srt/model_executor/runner_utils/buffers.py"
REGISTRY = "sglang/srt/model_executor/cuda_graph_buffer_registry.py"
MODULES = {BUFFERS: "sglang.srt.model_executor.runner_utils.buffers",
           REGISTRY: "sglang.srt.model_executor.cuda_graph_buffer_registry"}
FIELDS = ["input_ids", "req_pool_indices", "seq_lens", "out_cache_loc", "positions"]

pytestmark = pytest.mark.skipif(shutil.which("patch") is None and not os.environ.get("CI"),
                                reason="needs GNU patch")


def _patch(root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["patch", "-p1", "--batch", *extra, "-d", str(root)],
                          input=PATCH.read_bytes(), capture_output=True)


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """(pristine, patched) copies of the released sglang tree."""
    pristine = sglang_release.copy_tree(tmp_path_factory.mktemp("pristine"))
    patched = sglang_release.copy_tree(tmp_path_factory.mktemp("patched"))
    result = _patch(patched)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    return pristine, patched


def _load(root: Path, rel: str, *names: str) -> dict:
    """Exec the named top-level functions of a real file in a torch namespace."""
    tree = ast.parse((root / rel).read_text(), filename=str(root / rel))
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    methods = [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body
               if isinstance(m, ast.FunctionDef) and m.name in names]
    assert {n.name for n in wanted + methods} == set(names), f"missing in {rel}"
    ns = {"torch": torch, "__name__": MODULES[rel],
          "_has_foreach_copy": hasattr(torch, "_foreach_copy_"),
          **{k: getattr(typing, k) for k in typing.__all__ if hasattr(typing, k)}}
    module = ast.Module(body=wanted + methods, type_ignores=[])
    exec(compile(module, str(root / rel), "exec"), ns)
    return ns


def _inputs():
    gen = torch.Generator().manual_seed(7)
    srcs = [torch.randint(0, 50000, (16,), generator=gen, dtype=torch.int64),
            torch.randint(0, 64, (2,), generator=gen, dtype=torch.int64),
            torch.randint(1, 4096, (2,), generator=gen, dtype=torch.int32),
            torch.randint(0, 1 << 20, (16,), generator=gen, dtype=torch.int64),
            torch.randn(16, generator=gen, dtype=torch.float32)]
    dst_dtypes = [torch.int64, torch.int32, torch.int64, torch.int32, torch.bfloat16]
    dsts = [torch.zeros(s.shape[0], dtype=d) for s, d in zip(srcs, dst_dtypes)]
    return dsts, srcs


def test_header_names_base_and_purpose():
    head = PATCH.read_text().split("\n--- ", 1)[0]
    assert "Base: sglang==0.5.23 (PyPI)" in head
    assert "_grouped_foreach_copy_" in head and "K26OPS-PROBE" in head


def test_applies_and_reverts_byte_exact(tmp_path):
    root = sglang_release.copy_tree(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*.py")}
    assert _patch(root, "--dry-run").returncode == 0
    assert _patch(root).returncode == 0
    changed = {str(p.relative_to(root)) for p, b in before.items() if p.read_bytes() != b}
    assert {BUFFERS, REGISTRY} <= changed
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
    assert str(info.value) == ("K26OPS-PROBE cuda-graph-none-field: src[2] (seq_lens) is None"
                               f" in _grouped_foreach_copy_ ({MODULES[rel]})")
    assert all(int(d.abs().sum()) == 0 for d in dsts), "nothing copied before the error"
    diagnosis = classify(f"[2026-05-20 08:02:44 TP3] RuntimeError: {info.value}")
    assert diagnosis.signature == "cuda-graph-none-field"
    assert diagnosis.detail["field"] == "seq_lens" and diagnosis.detail["index"] == 2


@pytest.mark.parametrize("rel", [BUFFERS, REGISTRY])
def test_none_destination_and_unnamed_index(trees, rel):
    fn = _load(trees[1], rel, "_grouped_foreach_copy_")["_grouped_foreach_copy_"]
    dsts, srcs = _inputs()
    dsts[0] = None
    with pytest.raises(RuntimeError, match=r"^K26OPS-PROBE cuda-graph-none-field: dst\[0\] "
                                           r"\(input_ids\) is None"):
        fn(dsts, srcs, names=FIELDS)
    dsts, srcs = _inputs()
    srcs[4] = None  # called without names (an uninstrumented call site)
    with pytest.raises(RuntimeError, match=r"^K26OPS-PROBE cuda-graph-none-field: src\[4\] is None"
                                           r" in _grouped_foreach_copy_"):
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
    ns = _load(trees[1], REGISTRY, "_grouped_foreach_copy_", "same_tensor_view", "copy_slots")
    registry = type("Registry", (), {})()  # carries only the attribute copy_slots reads
    registry._slots = {name: type("Slot", (), {"buffer": torch.zeros(8, dtype=torch.int64)})()
                       for name in ("seq_lens", "req_pool_indices")}
    sources = {"req_pool_indices": torch.arange(2), "seq_lens": torch.tensor([5, 9])}
    ns["copy_slots"](registry, sources)
    assert registry._slots["seq_lens"].buffer[:2].tolist() == [5, 9]
    sources["seq_lens"] = None
    with pytest.raises(RuntimeError, match=r"src\[1\] \(seq_lens\) is None"):
        ns["copy_slots"](registry, sources)
