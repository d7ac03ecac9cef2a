"""The API-key redaction patches against the REAL sglang 0.5.23 and 0.5.17 sources.

Both releases log every server argument at start-up (the journal of the unit),
`api_key` in clear. The patch of each base is applied with `patch -p1` to a copy
of the released tree, as a deploy applies its series; the start-up log's
formatting is then run from the patched file (via ast: importing sglang pulls
CUDA-only dependencies) and compared with the pristine one, which leaks.
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import sglang_release

from k26ops.release import patchset

PATCHES = Path(__file__).resolve().parent.parents[1] / "patches"
NAME = "redact-api-key-in-startup-log.patch"
KEY = "sk-k26ops-test-0123456789"

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch")


FILES = {"0.5.23": "sglang/srt/entrypoints/engine.py", "0.5.17": "sglang/srt/server_args.py"}


def _tree(dest: Path, version: str) -> Path:
    """The released file the patch touches, copied under `dest` (the whole tree is 130 MB)."""
    rel = FILES[version]
    (dest / rel).parent.mkdir(parents=True)
    shutil.copyfile(sglang_release.site_packages(version) / rel, dest / rel)
    return dest


def _apply(root: Path, version: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["patch", "-p1", "--batch", *extra, "-d", str(root)],
        input=(PATCHES / f"sglang-{version}" / NAME).read_bytes(),
        capture_output=True,
    )


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17"])
def test_patch_is_in_the_series_untagged_names_its_base_and_applies_cleanly(tmp_path, version):
    text = (PATCHES / f"sglang-{version}" / "series").read_text()
    assert any(line.strip() == NAME for line in text.splitlines()), "applied on every deploy (no tag)"
    p = patchset.parse_patch((PATCHES / f"sglang-{version}" / NAME).read_text(), NAME)
    assert ("sglang", f"=={version}") in [(b[0], b[1]) for b in p.bases]
    root = _tree(tmp_path / "t", version)
    before = {f: f.read_bytes() for f in root.rglob("*.py")}
    res = _apply(root, version)
    assert res.returncode == 0 and b"offset" not in res.stdout and b"fuzz" not in res.stdout, res.stdout
    assert _apply(root, version, "-R").returncode == 0
    assert all(f.read_bytes() == b for f, b in before.items())


def _logging_function(engine_py: Path):
    """0.5.23's `_server_args_for_logging`, taken from the file and run."""
    tree = ast.parse(engine_py.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_server_args_for_logging")
    ns: dict = {
        "Dict": Dict,
        "Any": Any,
        "ServerArgs": object,
        "redact_watermark_secrets": lambda d: {k: v for k, v in d.items() if k != "watermark_key"},
    }
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(engine_py), "exec"), ns)
    return ns["_server_args_for_logging"]


class _Args:
    def __init__(self, **kw):
        self.kw = kw

    def resolved_dict(self):
        return dict(self.kw)


def test_0523_startup_log_keeps_the_key_out_and_everything_else_in(tmp_path):
    pristine = _tree(tmp_path / "a", "0.5.23")
    patched = _tree(tmp_path / "b", "0.5.23")
    assert _apply(patched, "0.5.23").returncode == 0
    rel = "sglang/srt/entrypoints/engine.py"
    args = _Args(api_key=KEY, admin_api_key=KEY + "-admin", port=30000, watermark_key="w", model_path="/m")
    leaked = str(_logging_function(pristine / rel)(args))
    assert KEY in leaked  # the released engine logs the key: what the patch is for
    logged = _logging_function(patched / rel)(args)
    assert KEY not in str(logged)
    assert logged == {"api_key": "<redacted>", "admin_api_key": "<redacted>", "port": 30000, "model_path": "/m"}
    # no key set: logged as the engine logs it (None stays None)
    assert _logging_function(patched / rel)(_Args(api_key=None, port=1)) == {"api_key": None, "port": 1}


def _server_args_fields(server_args_py: Path, names: tuple[str, ...]):
    """A dataclass built from the real ServerArgs' declarations of `names` (their
    annotations dropped: they need sglang's own types), as the engine declares them."""
    tree = ast.parse(server_args_py.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    body = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            body.append(
                ast.AnnAssign(
                    target=node.target, annotation=ast.Name("Optional_str", ast.Load()), value=node.value, simple=1
                )
            )
    assert [b.target.id for b in body] == list(names)
    klass = ast.ClassDef(
        name="ServerArgs",
        bases=[],
        keywords=[],
        body=body,
        decorator_list=[ast.parse("dataclasses.dataclass", mode="eval").body],
        type_params=[],
    )
    mod = ast.fix_missing_locations(ast.Module(body=[klass], type_ignores=[]))
    ns = {"dataclasses": dataclasses, "Optional_str": Optional[str]}
    exec(compile(mod, str(server_args_py), "exec"), ns)
    return ns["ServerArgs"]


def test_0517_startup_log_repr_leaves_the_keys_out_and_defaults_stay_none(tmp_path):
    pristine = _tree(tmp_path / "a", "0.5.17")
    patched = _tree(tmp_path / "b", "0.5.17")
    assert _apply(patched, "0.5.17").returncode == 0
    rel = "sglang/srt/server_args.py"
    names = ("api_key", "admin_api_key")
    # the engine logs f"{server_args=}": the dataclass repr
    assert KEY in repr(_server_args_fields(pristine / rel, names)(api_key=KEY))
    cls = _server_args_fields(patched / rel, names)
    assert KEY not in repr(cls(api_key=KEY, admin_api_key=KEY))
    assert cls(api_key=KEY).api_key == KEY  # the engine still checks requests against it
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    assert defaults == {"api_key": None, "admin_api_key": None}  # what the argument parser reads
