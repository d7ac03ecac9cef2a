"""The one `current` switch (k26ops.layout.switch_current), run by a real /bin/sh on
a real directory: it moves `current` to a complete release, refuses an incomplete
one (no manifest.json: its build did not finish) and leaves `current` as it was."""

from __future__ import annotations

import os
import subprocess

from k26ops.layout import switch_current


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True)


def test_switch_moves_current_and_refuses_an_unfinished_release(tmp_path):
    rel = tmp_path / "releases dir"  # a space: the command quotes its paths
    for rid, complete in (("r1", True), ("r2", True), ("r3", False)):
        (rel / rid).mkdir(parents=True)
        if complete:
            (rel / rid / "manifest.json").write_text("{}")
    os.symlink("r1", rel / "current")
    assert _sh(switch_current(str(rel), "r2")).returncode == 0
    assert os.readlink(rel / "current") == "r2"
    assert _sh(switch_current(str(rel), "r3")).returncode != 0
    assert os.readlink(rel / "current") == "r2" and not (rel / ".current.tmp").exists()
    # the playbook's restore after an interrupt points back without asking for a manifest
    assert _sh(switch_current(str(rel), "r3", require_manifest=False)).returncode == 0
    assert os.readlink(rel / "current") == "r3"


def test_a_current_that_is_a_directory_is_named_and_nothing_is_left(tmp_path):
    """`current` made a real directory by hand: one line naming it, exit 3, no .current.tmp
    left (issue 42: a raw `mv: cannot overwrite directory` and a stray .current.tmp)."""
    rel = tmp_path / "releases"
    (rel / "r1").mkdir(parents=True)
    (rel / "r1" / "manifest.json").write_text("{}")
    (rel / "current").mkdir()
    (rel / "current" / "keep").write_text("x")
    p = _sh(switch_current(str(rel), "r1"))
    assert p.returncode == 3
    assert (
        p.stderr == f"{rel}/current is not a symlink (a directory or file made by hand?): move it aside; "
        "current was not switched\n"
    )
    assert sorted(os.listdir(rel)) == ["current", "r1"] and (rel / "current" / "keep").exists()
