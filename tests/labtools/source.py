"""k26ops' source parsed once per run for the tests that walk it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(), filename=path)


def parsed(path: Path) -> ast.Module:
    """`path` parsed, once per run for the same file contents (keyed by mtime and size):
    five test modules walk every module of k26ops/ (~0.3 CPU-s a parse). The tree is
    shared: read it (ast.walk, a NodeVisitor), never change it."""
    st = Path(path).stat()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)
