"""The baselines git repository on the control node (GitPython).

Layout of a snapshot commit (the tree is exactly the snapshot's hosts):

    baseline.json                    tag, time, message, per host: release, health, accept length
    hosts/<host>/baseline.json       what rollback and drift compare (release, hashes, unit, env)
    hosts/<host>/manifest.json       the release manifest + package versions from the venv
    hosts/<host>/recipe.yml          the recipe file the release was built from
    hosts/<host>/patches/            the patch series as shipped in the release
    hosts/<host>/unit/<name>         the systemd unit, as installed
    hosts/<host>/env/<name>          the env file, secrets replaced by a marker
    hosts/<host>/engine-cmdline.txt  the running engine's command line
    hosts/<host>/facts.json          GPUs, driver, CUDA toolkit, OS, python
    hosts/<host>/health.json         health and smoke result (latency, spec accept length)
    hosts/<host>/bench.json          engine bench results (`snapshot --bench`): figures per cell, min-max
    hosts/<host>/files/<path>        the patched source files, as they ran

Writing never touches the work tree or index beyond the paths the snapshot
owns (`baseline.json`, `hosts/`): the commit is built in a temporary index,
the branch moves by compare-and-swap, and only then are those paths brought
in line with the new commit. If any of them has uncommitted changes, the
snapshot is refused before anything is written.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k26ops import config
from k26ops.baselines import validate
from k26ops.errors import UserError

OWNED = ("baseline.json", "hosts")
PENDING = "k26ops-snapshot-pending.json"  # in .git: a snapshot between its commit and its work-tree sync
ZERO = "0" * 40
_TAG_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]*")


def _git():
    """GitPython, imported on first use: about 120 ms, which the commands that never
    open the baselines repository (status, deploy without --gate) do not pay."""
    import git  # lazy: GitPython costs about 120 ms at import

    return git


def default_dir() -> Path:
    """$K26OPS_BASELINES, else the config file's `baselines`, else
    ~/.local/share/k26ops/baselines: never the current directory (k26ops.config)."""
    return config.baselines_dir()[0]


def check_tag_name(tag: str) -> str:
    """git check-ref-format's rules for refs/tags/TAG, plus: a plain charset
    (letters, digits, . _ + - /) so a tag is safe in any shell and path."""
    why = None
    if not tag:
        why = "empty"
    elif not _TAG_OK.fullmatch(tag):
        bad = next((c for c in tag if not re.fullmatch(r"[A-Za-z0-9._+/-]", c)), tag[:1])
        why = f"character {bad!r} not allowed (use letters, digits, . _ + - /)"
    elif ".." in tag:
        why = "'..' not allowed"
    elif tag.endswith((".", "/", ".lock")) or "//" in tag:
        why = "may not end with '.', '/' or '.lock', nor contain '//'"
    elif any(part.startswith(".") or part.endswith(".lock") or not part for part in tag.split("/")):
        why = "no path component may start with '.' or end with '.lock'"
    elif tag == "@" or len(tag) > 200:
        why = "not a usable tag name"
    if why is None:
        git = _git()

        try:
            git.Git().check_ref_format(f"refs/tags/{tag}")
        except git.GitCommandError:
            why = "rejected by git check-ref-format"
    if why:
        raise UserError(f"invalid tag name {tag!r}: {why}; nothing was written")
    return tag


@dataclass
class TagInfo:
    name: str
    date: float
    message: str
    commit: str
    index: dict  # baseline.json of the tagged commit ({} if none or unreadable)
    error: str | None = None  # why its baseline.json cannot be read (validate.BaselineCorrupt's line)


class Baselines:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_dir()
        self._repo = None

    # ---------------------------------------------------------------- reading
    def exists(self) -> bool:
        return (self.path / ".git").exists()

    @property
    def repo(self):
        if self._repo is None:
            git = _git()

            if not self.exists():
                raise UserError(f"no baselines repository at {self.path} (take one with `k26ops snapshot --tag TAG`)")
            try:
                self._repo = git.Repo(self.path)
            except git.GitError as exc:
                raise UserError(f"{self.path}: not a usable git repository: {exc}") from None
        return self._repo

    def tag_names(self) -> list[str]:
        if not self.exists():
            return []
        return sorted(t.name for t in self.repo.tags)

    def has_tag(self, tag: str) -> bool:
        return self.exists() and tag in self.tag_names()

    def tags(self) -> list[TagInfo]:
        """Every tag, oldest first, with its snapshot index."""
        out = []
        if not self.exists():
            return out
        for ref in self.repo.tags:
            try:  # a damaged git object spoils only its own tag (TagInfo.error), never the listing
                t = ref.tag
                commit = ref.commit
                date, message, sha = (
                    float(t.tagged_date if t else commit.committed_date),
                    (t.message if t else commit.message).strip(),
                    commit.hexsha,
                )
            except _damage() as exc:
                out.append(TagInfo(ref.name, 0.0, "", "", {}, self._damaged(ref.name, exc)))
                continue
            index, error = {}, None
            try:  # a corrupt index spoils only its own tag (TagInfo.error), never the listing
                index = self._index(commit, ref.name)
            except validate.BaselineCorrupt as exc:
                error = str(exc)
            out.append(TagInfo(ref.name, date, message, sha, index, error))
        return sorted(out, key=lambda t: (t.date, t.name))

    def tag(self, tag: str) -> TagInfo:
        """The tag, its index checked (BaselineCorrupt: exit 2 naming the tag and file)."""
        known = self.tag_names()
        if tag not in known:
            where = f"known tags: {', '.join(known)}" if known else "no tags yet"
            raise UserError(f"unknown baseline tag {tag!r} in {self.path} ({where}); nothing was changed")
        info = next(t for t in self.tags() if t.name == tag)
        if info.error:
            raise validate.BaselineCorrupt(info.error)
        return info

    def releases_by_host(self, without=()) -> dict[str, list[str]]:
        """{host: [release id]} that the tags record (oldest tag first), leaving
        out the tags in `without`: what each host must keep pinned."""
        out: dict[str, list[str]] = {}
        for t in self.tags():
            if t.name in without:
                continue
            if t.error:  # its releases are unknown: unpinning on a guess could free one it needs
                raise validate.BaselineCorrupt(t.error)
            for host, rec in ((t.index or {}).get("hosts") or {}).items():
                rid = (rec or {}).get("release_id")
                if rid and rid not in out.setdefault(host, []):
                    out[host].append(rid)
        return out

    def read(self, tag_or_commit: str, path: str) -> bytes | None:
        try:
            commit = self.repo.commit(tag_or_commit)
            return commit.tree[path].data_stream.read()
        except KeyError:
            return None
        except _damage() as exc:
            raise validate.BaselineCorrupt(self._damaged(self._name(tag_or_commit), exc, path)) from None

    def _damaged(self, tag: str, exc: Exception, path: str | None = None) -> str:
        """One line: which tag (and file) a damaged git object spoils, and how to see more."""
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160]
        return (
            f"baseline tag {tag}" + (f": {path}" if path else "") + f": a git object of {self.path} cannot be "
            f"read ({said}); `git -C {self.path} fsck` names the damage"
        )

    def _index(self, commit, tag: str) -> dict:
        try:
            data = commit.tree["baseline.json"].data_stream.read()
        except KeyError:
            return {}
        except _damage() as exc:
            raise validate.BaselineCorrupt(self._damaged(tag, exc, "baseline.json")) from None
        return validate.index(data, tag)

    def _name(self, tag_or_commit: str) -> str:
        """A tag's name for messages: callers pass a tag or its commit."""
        if tag_or_commit in self.tag_names():
            return tag_or_commit
        try:
            return next((t.name for t in self.repo.tags if t.commit.hexsha == tag_or_commit), tag_or_commit[:12])
        except _damage():  # a tag's commit that does not read: the id is the name then
            return tag_or_commit[:12]

    def host_record(self, tag: str, host: str) -> dict | None:
        """The host's record, checked (validate.host_record), or None when there is none."""
        path = f"hosts/{host}/baseline.json"
        data = self.read(tag, path)
        return validate.host_record(data, self._name(tag), path) if data else None

    def host_bench(self, tag: str, host: str) -> dict | None:
        """The host's stored bench results (`snapshot --bench`), checked, or None."""
        path = f"hosts/{host}/bench.json"
        data = self.read(tag, path)
        return validate.bench(data, self._name(tag), path) if data else None

    def files_under(self, tag: str, prefix: str) -> dict[str, bytes]:
        """{path relative to prefix: bytes} of the tag's files under `prefix/`."""
        try:
            commit = self.repo.commit(tag)
            tree = commit.tree[prefix.rstrip("/")]
            out = {}
            for item in tree.traverse():
                if item.type == "blob":
                    out[item.path[len(prefix.rstrip("/")) + 1 :]] = item.data_stream.read()
        except KeyError:
            return {}
        except _damage() as exc:
            raise validate.BaselineCorrupt(self._damaged(self._name(tag), exc, prefix)) from None
        return out

    # ---------------------------------------------------------------- writing
    def dirty_owned(self) -> list[str]:
        """Paths the snapshot writes that have uncommitted changes (index, work tree, untracked)."""
        if not self.exists():
            if self.path.exists() and any(self.path.iterdir()):
                owned = [p for p in OWNED if (self.path / p).exists()]
                if owned:
                    return owned
            return []
        out = self.repo.git.status("--porcelain=v1", "-z", "--untracked-files=all", "--", *OWNED)
        paths = []
        for entry in filter(None, out.split("\0")):
            if len(entry) > 3 and entry[2] == " ":
                paths.append(entry[3:])
        return paths

    def _ensure(self):
        git = _git()

        if not self.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            self._repo = git.Repo.init(self.path, initial_branch="main")
            (self.path / ".git" / "description").write_text("k26ops baselines: tagged known-good engine states\n")
        return self.repo

    def _identity_env(self) -> dict:
        r = self.repo
        env = {}
        try:
            r.git.config("user.name")
            r.git.config("user.email")
        except Exception:
            name, mail = "k26ops", f"k26ops@{socket.gethostname() or 'control-node'}"
            env = {
                "GIT_AUTHOR_NAME": name,
                "GIT_AUTHOR_EMAIL": mail,
                "GIT_COMMITTER_NAME": name,
                "GIT_COMMITTER_EMAIL": mail,
            }
        return env

    def commit_snapshot(
        self, files: dict[str, bytes], message: str, tag: str, tag_message: str, force: bool = False
    ) -> str:
        """Commit exactly `files` as the owned paths and tag it (annotated); return the commit sha."""
        git = _git()

        try:
            return self._commit_snapshot(files, message, tag, tag_message, force)
        except git.GitCommandError as exc:
            err = (exc.stderr or "").strip().splitlines()
            raise UserError(
                f"{self.path}: git {exc.command[1] if len(exc.command) > 1 else ''} failed: {err[-1] if err else exc}"
            ) from None

    def _commit_snapshot(self, files, message, tag, tag_message, force) -> str:
        git = _git()

        if any(not (p == OWNED[0] or p.startswith(OWNED[1] + "/")) for p in files):
            raise ValueError("snapshot files must live under the owned paths")
        self.finish_interrupted()
        dirty = self.dirty_owned()
        if dirty:
            raise UserError(
                f"{self.path} has uncommitted changes in files a snapshot writes: "
                f"{', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''} "
                "(commit or move them first); nothing was written"
            )
        if self.has_tag(tag) and not force:
            raise UserError(
                f"baseline tag {tag!r} already exists in {self.path} (use --force to move it); nothing was written"
            )
        repo = self._ensure()
        g = repo.git
        try:
            branch = g.symbolic_ref("-q", "HEAD")
        except git.GitCommandError:
            raise UserError(f"{self.path}: HEAD is detached; check out a branch first; nothing was written") from None
        try:
            old = g.rev_parse("--verify", "-q", "HEAD")
        except git.GitCommandError:
            old = None
        env = self._identity_env()
        with tempfile.TemporaryDirectory(prefix="k26ops-baseline-") as tmp:
            ienv = {**env, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if old:
                g.read_tree(old, env=ienv)
                g.rm("-r", "--cached", "-q", "--ignore-unmatch", "--", *OWNED, env=ienv)
            else:
                g.read_tree("--empty", env=ienv)
            lines = []
            for path, data in sorted(files.items()):
                sha = repo.odb.store(_istream(data)).binsha.hex()
                lines.append(f"100644 {sha}\t{path}\n")
            info = Path(tmp) / "index-info"
            info.write_text("".join(lines))
            with open(info, "rb") as fh:
                g.update_index("--add", "--index-info", istream=fh, env=ienv)
            tree = g.write_tree(env=ienv)
            msgf = Path(tmp) / "msg"
            msgf.write_text(message.rstrip() + "\n")
            commit = g.commit_tree(tree, *(["-p", old] if old else []), "-F", str(msgf), env=env)
        # from here to the work tree's sync, an interrupted run is finished by the next one
        pending = {
            "commit": commit,
            "old": old,
            "branch": branch,
            "tag": tag,
            "tag_message": tag_message,
            "force": force,
        }
        _write_atomic(self._pending_file, json.dumps(pending).encode())
        self._finish(pending)
        return commit

    @property
    def _pending_file(self) -> Path:
        return self.path / ".git" / PENDING

    def finish_interrupted(self) -> str | None:
        """A snapshot killed between its commit and the end of its work-tree sync (its
        pending record in .git): finished (tag, branch, owned files and index at the new
        commit) as it would have been; its commit, or None when there was none."""
        try:
            pending = json.loads(self._pending_file.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{self._pending_file}: an interrupted snapshot's record cannot be read ({exc}); "
                "remove it once `git log` and `git tag` look right"
            ) from None
        return self._finish(pending)

    def _finish(self, p: dict) -> str | None:
        """The snapshot's tag, then its branch update, then the owned paths of the work tree
        and the index; each step skipped when already done (a re-run finishes a killed one)."""
        git = _git()
        g, env, commit, old = self.repo.git, self._identity_env(), p["commit"], p["old"]
        try:
            head = g.rev_parse("--verify", "-q", p["branch"])
        except git.GitCommandError:
            head = None
        if head not in (old, commit):  # the branch moved on meanwhile: not ours to finish
            self._pending_file.unlink(missing_ok=True)
            return None
        try:
            tagged = g.rev_parse("--verify", "-q", f"refs/tags/{p['tag']}^{{commit}}")
        except git.GitCommandError:
            tagged = None
        if tagged != commit:
            with tempfile.TemporaryDirectory(prefix="k26ops-baseline-") as tmp:
                tagf = Path(tmp) / "tagmsg"
                tagf.write_text(p["tag_message"].rstrip() + "\n")
                g.tag("-a", *(["-f"] if p["force"] or tagged else []), "-F", str(tagf), "--", p["tag"], commit, env=env)
        if head != commit:
            g.update_ref("-m", f"k26ops snapshot {p['tag']}", p["branch"], commit, old or ZERO, env=env)
        # Bring the owned paths (clean when the snapshot began) in line with the new commit; nothing else.
        new_paths = set(g.ls_tree("-r", "--name-only", commit, "--", *OWNED).splitlines())
        old_paths = set(g.ls_tree("-r", "--name-only", old, "--", *OWNED).splitlines()) if old else set()
        for path in old_paths - new_paths:
            (self.path / path).unlink(missing_ok=True)
            _prune_empty(self.path, (self.path / path).parent)
        if new_paths:
            g.checkout(
                commit, "--", *[o for o in OWNED if any(n == o or n.startswith(o + "/") for n in new_paths)], env=env
            )
        g.reset(
            "-q",
            commit,
            "--",
            *[o for o in OWNED if any(n == o or n.startswith(o + "/") for n in new_paths | old_paths)],
            env=env,
        )
        self._pending_file.unlink(missing_ok=True)
        return commit

    def delete_tags(self, tags: list[str]) -> None:
        """Delete the tags (all known: check with `tag()` first); the commits stay
        in the branch's history, only the names go."""
        git = _git()

        try:
            self.repo.git.tag("-d", "--", *tags)
        except git.GitCommandError as exc:
            err = (exc.stderr or "").strip().splitlines()
            raise UserError(f"{self.path}: git tag -d failed: {err[-1] if err else exc}") from None

    def all_text(self) -> str:
        """Every object's text (history, tags) for secret checks in tests and `doctor`s."""
        g = self.repo.git
        return g.log("-p", "--all", "--format=fuller") + "\n" + g.for_each_ref("--format=%(contents)", "refs/tags")


def _damage() -> tuple:
    """What GitPython raises on a damaged or missing object (a loose object overwritten, a
    pack cut short): ValueError ("could not be resolved"), gitdb's ODBError, git's GitError."""
    git = _git()
    from gitdb.exc import ODBError  # lazy: with GitPython, as _git

    return (ValueError, OSError, ODBError, git.GitError)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _prune_empty(root: Path, d: Path) -> None:
    root = root.resolve()
    d = d.resolve()
    while d != root and root in d.parents:
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


def _istream(data: bytes):
    from gitdb import IStream  # lazy: GitPython's object store, as _git

    return IStream("blob", len(data), io.BytesIO(data))
