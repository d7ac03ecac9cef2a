"""Values from a recipe, an inventory or the command line that reach git, pip
or a path on the control node are data, never options or commands.

Why: `git fetch URL` takes a URL that starts with `-` as an option
(`--upload-pack=CMD` runs CMD), `ext::` URLs run commands, and a path joined
onto a directory with `/abs` or `../..` leaves it. Each check here returns the
problem as words (None when the value is fine); callers name the value and
where it came from in one line (exit 2).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

SHA = re.compile(r"[0-9a-f]{40}")
# git transports k26ops fetches engine sources over; no ext::, fd::, or helper schemes
_URL = re.compile(
    r"(?:(?:https?|ssh|git|file)://(?P<auth>[^/\s]*)\S*"  # scheme://[user@]host/...
    r"|(?P<scp>[\w.][\w.-]*@[\w.][\w.-]*):\S+"  # user@host:path (scp-like ssh)
    r"|/\S*)"
)  # a local path
_REF = re.compile(r"[\w./-]+")


def _common(value, what: str) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{what} must be a non-empty string"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value) or any(ch.isspace() for ch in value):
        return f"{what} must not contain spaces or control characters"
    if value.startswith("-"):
        return f"{what} must not start with '-' (it would be read as an option)"
    return None


def git_url_problem(url) -> str | None:
    """A git URL k26ops may fetch: http(s)://, ssh://, git://, file://, user@host:path or /path."""
    why = _common(url, "a git URL")
    if why:
        return why
    m = _URL.fullmatch(url)
    if not m:
        return "a git URL must be http(s)://, ssh://, git://, file://, user@host:path or an absolute path"
    host = (m.group("auth") or "").rsplit("@", 1)[-1]
    if host.startswith("-") or (m.group("scp") or "").split("@", 1)[-1].startswith("-"):
        return "a git URL's host must not start with '-'"
    return None


def ref_problem(ref) -> str | None:
    """A branch/PR ref name as `git fetch` takes it (refs/pull/29907/head, main)."""
    why = _common(ref, "a ref")
    if why:
        return why
    if not _REF.fullmatch(ref) or ".." in ref or "//" in ref or ref.startswith("/") or ref.endswith((".", "/")):
        return "a ref must be a plain ref name like refs/heads/main (letters, digits, _ . / -; no '..')"
    return None


def commit_problem(commit) -> str | None:
    if not isinstance(commit, str) or not SHA.fullmatch(commit):
        return "a commit must be a full 40-hex sha (lower case)"
    return None


def inside_problem(rel, what: str) -> str | None:
    """A relative path that stays inside the directory it is joined to."""
    why = _common(rel, what)
    if why:
        return why
    p = PurePosixPath(rel)
    if p.is_absolute() or Path(rel).is_absolute():
        return f"{what} must be a relative path (inside its directory), not absolute"
    if ".." in p.parts:
        return f"{what} must not contain '..' (it must stay inside its directory)"
    return None


def is_inside(path: Path, root: Path) -> bool:
    """`path` (symlinks resolved) is `root` or below it."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
