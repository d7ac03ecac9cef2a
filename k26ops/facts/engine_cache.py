"""The engine's compile cache on a host: where a release keeps it, which variables
point the engine at it, and what is in it.

Why: a start pays for JIT compilation and CUDA-graph capture that do not depend on
the weights (a real H200, sglang 0.5.17, tests/data/rehearsal: ready 140-169 s cold,
~51 s with warm caches; the first sampled request 85-115 s cold, 0.4 s warm). The
caches only carry over when the engine finds them at the same path, so k26ops gives
each release one cache dir per GPU kind and speculative profile, and points every
variable the release's engine reads at it.

- The dir: `<k26ops_root>/engine-cache/<release id>/<key>`, key = GPU SKU, compute
  capability, TP size and speculative profile (`h200-sm90-tp8-ddtree-bs8-budget32`).
  It belongs to its release (pruned with it, wiped when the release is built again):
  two builds never share compiled objects. Root-only (`engine-cache` 0700): cached
  objects are loaded into the engine process.
- The variables, by the release's engine version (CACHE_VARS, the one table): sglang
  0.5.23's `SGLANG_CACHE_DIR` (srt/environ.py "Cache directories": triton, inductor,
  CUDA, flashinfer, tilelang and deep_gemm under one root), else the per-library ones
  that 0.5.17's libraries read (triton, flashinfer, tvm-ffi, the CUDA driver's
  ComputeCache, inductor, and XDG_CACHE_HOME for what defaults under ~/.cache).
- A variable the inventory's `engine_env` sets itself wins (an explicit setting is
  kept); the plan and the report say which ones, since the warm-start check then
  sees only the part of the cache that is in the release's dir.
- What is in it: the engine agent's `cache` op counts files, kernels (KERNEL_SUFFIXES:
  a compiled module or cubin each) and bytes; a start that adds kernels compiled.
"""

from __future__ import annotations

import re

# (first engine version that reads them, {variable: subdir of the cache dir ("" = the dir)}), newest first
CACHE_VARS: tuple[tuple[tuple[int, ...], dict[str, str]], ...] = (
    ((0, 5, 23), {"SGLANG_CACHE_DIR": ""}),
    (
        (),
        {
            "TRITON_CACHE_DIR": "triton",
            "FLASHINFER_WORKSPACE_BASE": "flashinfer",
            "TVM_FFI_CACHE_DIR": "tvm-ffi",
            "CUDA_CACHE_PATH": "nv-compute",
            "TORCHINDUCTOR_CACHE_DIR": "inductor",
            "XDG_CACHE_HOME": "xdg",
        },
    ),
)
# A compiled kernel on disk: triton's .cubin, a JIT-built extension module (flashinfer, tvm-ffi, sglang's jit)
KERNEL_SUFFIXES = (".cubin", ".so", ".hsaco")
SUBDIR = "engine-cache"  # under k26ops_root


def version_tuple(version: str | None) -> tuple[int, ...]:
    """`0.5.23+lab` -> (0, 5, 23); an unreadable version -> () (oldest)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version or ""))
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def variables(engine_version: str | None, cache_dir: str) -> dict[str, str]:
    """The variables the release's engine reads, each pointed into `cache_dir`."""
    have = version_tuple(engine_version)
    table = next(t for since, t in CACHE_VARS if have >= since)
    return {k: f"{cache_dir}/{sub}" if sub else cache_dir for k, sub in table.items()}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def _flag(argv: list[str], flag: str) -> str | None:
    for i, w in enumerate(argv):
        if w == flag and i + 1 < len(argv):
            return argv[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


def gpu_part(gpus: list[dict] | None) -> str:
    """`h200-sm90` from the gpus fact's list (every SKU on the host, joined); `gpu-unknown`
    when nvidia-smi said nothing."""
    kinds = sorted(
        {
            (
                _slug(g.get("name") or "").removeprefix("nvidia-") or "gpu",
                "sm" + str(g.get("compute_cap") or "").replace(".", ""),
            )
            for g in gpus or []
            if g.get("name") or g.get("compute_cap")
        }
    )
    return "+".join(f"{n}-{cc}" if cc != "sm" else n for n, cc in kinds) or "gpu-unknown"


def key(argv: list[str], gpus: list[dict] | None) -> str:
    """The cache dir's name for an engine command line on these GPUs: SKU, compute
    capability, TP size, speculative algorithm, block size and budget."""
    tp = _flag(argv, "--tp-size") or _flag(argv, "--tp") or "1"
    algo = _flag(argv, "--speculative-algorithm")
    spec = _slug(algo) if algo else "nospec"
    for flag, short in (("--speculative-dflash-block-size", "bs"), ("--speculative-ddtree-budget", "budget")):
        if _flag(argv, flag):
            spec += f"-{short}{_slug(_flag(argv, flag))}"
    return f"{gpu_part(gpus)}-tp{_slug(tp)}-{spec}"


def cache_dir(root: str, release_id: str, argv: list[str], gpus: list[dict] | None) -> str:
    """`<k26ops_root>/engine-cache/<release id>/<key>`."""
    if not release_id or "/" in release_id or release_id.startswith("."):
        raise ValueError(f"engine cache: not a release id: {release_id!r}")
    return f"{root}/{SUBDIR}/{release_id}/{key(argv, gpus)}"


def release_cache(root: str, release_id: str) -> str:
    """Everything one release cached (removed with the release)."""
    return f"{root}/{SUBDIR}/{release_id}"


def apply(env: dict, wanted: dict[str, str]) -> tuple[dict, list[str]]:
    """`env` with the cache variables added; (the env, the names `engine_env` set itself,
    which win: the engine keeps those caches where the inventory says)."""
    out = dict(env)
    kept = sorted(k for k in wanted if k in out and str(out[k]) != wanted[k])
    for k, v in wanted.items():
        out.setdefault(k, v)
    return out, kept


def kept_note(kept: list[str]) -> str | None:
    if not kept:
        return None
    return (
        f"engine cache: engine_env sets {', '.join(kept)} itself; those caches stay where it says "
        "(shared between releases, outside the warm-start check)"
    )


def other_key_note(rehearsal_argv: list[str], unit_argv: list[str], gpus: list[dict] | None) -> str | None:
    """A rehearsal whose command line keys another cache dir than the unit's (its own --tp-size)
    compiles for that one: the note that says the unit's start is not warmed by it; else None."""
    mine, unit = key(rehearsal_argv, gpus), key(unit_argv, gpus)
    if mine == unit:
        return None
    return (
        f"engine cache: the rehearsal fills {mine}, the unit's start reads {unit} (another TP size or "
        "speculative profile compiles other kernels): the unit's start stays cold"
    )


def grew(before: dict | None, after: dict | None) -> dict:
    """What a start added to the cache dir: {"kernels", "files", "bytes"} (never negative)."""
    b, a = before or {}, after or {}
    return {k: max(0, int(a.get(k) or 0) - int(b.get(k) or 0)) for k in ("kernels", "files", "bytes")}
