"""Files k26ops writes on the control node into a directory a user named
(`rehearse --save-log DIR`), written so that nobody else can aim the write:
k26ops often runs as root, and DIR may be under /tmp where any user could have
made it first.

- The directory is opened once (`O_NOFOLLOW`: a symlink as DIR is refused) and
  every file is written through that handle, so swapping DIR afterwards changes
  nothing. A missing DIR is made fresh, mode 0700.
- DIR and every directory above it must belong to this user or root (a sticky
  directory such as /tmp excepted for what is above DIR): one owned by another
  user is refused in one line naming the owner, before any host is touched.
- A file is written to a fresh name (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600)
  and renamed over the old one: a planted symlink `DIR/host.log -> /etc/shadow`
  is replaced, never written through.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import UserError


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _check_above(path: Path, what: str) -> None:
    """Every existing directory above `path` is ours, root's, or sticky (like /tmp)."""
    me = os.geteuid()
    for parent in reversed(path.parents):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            break
        if st.st_uid not in (0, me) and not st.st_mode & stat.S_ISVTX:
            raise UserError(
                f"{what} {path}: {parent} belongs to user {_owner(st.st_uid)}, who could redirect "
                "what k26ops writes there; choose a directory of your own; nothing was written"
            )


@dataclass
class OutDir:
    """A private output directory, held open: `write(name, text)` writes DIR/name safely."""

    path: Path
    fd: int

    @classmethod
    def open(cls, path: str | os.PathLike, what: str = "output directory") -> "OutDir":
        p = Path(os.path.abspath(path))
        _check_above(p, what)
        if os.path.islink(p):
            raise UserError(
                f"{what} {p} is a symlink (to {os.readlink(p)}); refusing to write through it; nothing was written"
            )
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(p, 0o700)
            except FileExistsError:
                pass
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise UserError(f"{what} {p}: {exc.strerror or exc}; nothing was written") from None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise UserError(
                f"{what} {p} belongs to user {_owner(st.st_uid)}, not to you; refusing to write "
                "into it; nothing was written"
            )
        return cls(p, fd)

    def write(self, name: str, text: str) -> Path:
        """DIR/name replaced by `text` (mode 0600); a symlink there is replaced, not followed."""
        if "/" in name or name in ("", ".", ".."):
            raise UserError(f"not a file name: {name!r}")
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise
        return self.path / name
