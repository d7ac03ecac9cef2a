"""CUDA toolkit fact: which nvcc exists and its version.

Why: the engine JIT-compiles kernels (FlashInfer, SGLang) and the self-test
builds one with nvcc; k26ops may install its own toolchain under
<k26ops_root>/toolchain, which is not on PATH, so that place is searched too.
"""

from __future__ import annotations

import re
import shlex

from k26ops.facts.base import Fact, safe
from k26ops.layout import Layout

TOOLCHAIN_DIR = Layout().toolchain_dir  # a host without k26ops_root; preflight.host_facts passes its own


def nvcc_command(toolchain_dir: str = TOOLCHAIN_DIR) -> str:
    """Each candidate prints '== <path>' then its `nvcc --version`; PATH's first.
    `toolchain_dir` is <k26ops_root>/toolchain, where the toolchain step installs.
    A path two patterns name (cuda-*/ and */ do) runs once: every nvcc start is host CPU."""
    d = shlex.quote(toolchain_dir)
    return (
        'seen=; for n in "$(command -v nvcc 2>/dev/null)" '
        + d
        + "/cuda-*/bin/nvcc "
        + d
        + "/*/bin/nvcc /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do "
        '[ -n "$n" ] && [ -x "$n" ] || continue; case "$seen" in *"|$n|"*) continue;; esac; seen="$seen|$n|"; '
        'echo "== $n"; "$n" --version 2>&1; done; true'
    )


NVCC_COMMAND = nvcc_command()
_REL_RE = re.compile(r"release (\d+\.\d+), V([\d.]+)")


def parse_nvcc_version(text: str) -> dict | None:
    """`nvcc --version` text -> {"release": "13.0", "version": "13.0.88"}, None if not nvcc's."""
    m = _REL_RE.search(text)
    return {"release": m.group(1), "version": m.group(2)} if m else None


@safe
def parse_cuda_toolkit(stdout: str, rc: int) -> dict | None:
    """None when no nvcc anywhere; else the first (PATH wins) plus every install found.

    Also accepts a bare `nvcc --version` output (no '== path' lines).
    """
    if "== " not in stdout:
        v = parse_nvcc_version(stdout)
        return {**v, "path": None, "installs": [{**v, "path": None}]} if v else None
    installs, seen = [], set()
    for block in re.split(r"^== ", stdout, flags=re.M)[1:]:
        path, _, rest = block.partition("\n")
        v = parse_nvcc_version(rest)
        real = path.strip()
        if v and real not in seen:
            seen.add(real)
            installs.append({"path": real, **v})
    if not installs:
        return None
    return {**installs[0], "installs": installs}


def cuda_toolkit_fact(toolchain_dir: str = TOOLCHAIN_DIR) -> Fact:
    return Fact("cuda_toolkit", nvcc_command(toolchain_dir), parse_cuda_toolkit)


FACTS = {"cuda_toolkit": cuda_toolkit_fact()}
