"""A snapshot killed between its commit and the end of its work-tree sync (issue 42), host-free:
a real git baselines repository written by k26ops' own commit_snapshot, the kill simulated by
a git command that never returns (KeyboardInterrupt: nothing after it runs, as after SIGKILL).

Before: a kill between `update-ref` and `tag` left an untagged commit and a stale index; the
next snapshot refused (the owned files looked changed) and committing what it asked for would
have reverted the untagged snapshot. Now the next snapshot finishes the interrupted one first
(its tag, branch, owned files and index), then takes its own.
"""

from __future__ import annotations

import json

import git
import pytest

from k26ops.baselines.repo import PENDING, Baselines


def take(repo: Baselines, tag: str, hosts=("lab1",)) -> None:
    """A snapshot of `hosts` as `tag`: owned files of the shape `snapshot` writes (their content aside)."""
    files = {f"hosts/{h}/baseline.json": json.dumps({"host": h, "tag": tag}).encode() for h in hosts}
    files.update({f"hosts/{h}/unit/k26-engine.service": b"[Service]\nExecStart=/bin/true\n" for h in hosts})
    files["baseline.json"] = json.dumps({"tag": tag, "hosts": {h: {} for h in hosts}}).encode()
    repo.commit_snapshot(files, f"snapshot {tag}", tag, f"baseline {tag}")


@pytest.mark.parametrize("killed_at", ["tag", "update_ref", "checkout"])
def test_the_next_snapshot_finishes_an_interrupted_one(tmp_path, monkeypatch, killed_at):
    repo = Baselines(tmp_path / "baselines")
    take(repo, "first", hosts=("lab1", "lab2"))
    real = git.cmd.Git.__getattr__

    def dies(self, name):
        if name == killed_at:

            def killed(*a, **kw):
                raise KeyboardInterrupt

            return killed
        return real(self, name)

    with monkeypatch.context() as m:
        m.setattr(git.cmd.Git, "__getattr__", dies)
        with pytest.raises(KeyboardInterrupt):
            take(Baselines(tmp_path / "baselines"), "second", hosts=("lab1",))  # lab2 leaves the fleet
    assert (tmp_path / "baselines" / ".git" / PENDING).exists()

    repo = Baselines(tmp_path / "baselines")
    take(repo, "third", hosts=("lab1",))
    g = repo.repo.git
    assert not (tmp_path / "baselines" / ".git" / PENDING).exists()
    assert sorted(repo.tag_names()) == ["first", "second", "third"]
    # one line of history: first <- second <- third, each tag on its own commit
    log = g.log("--format=%s", "main").splitlines()
    assert log == ["snapshot third", "snapshot second", "snapshot first"], log
    assert g.rev_parse("second^{commit}") == g.rev_parse("third^{commit}~1")
    assert repo.dirty_owned() == []
    assert g.status("--porcelain") == ""
    assert not (tmp_path / "baselines" / "hosts" / "lab2").exists()  # the second snapshot dropped lab2
    assert json.loads(repo.read("second", "hosts/lab1/baseline.json"))["tag"] == "second"
