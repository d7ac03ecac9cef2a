"""One k26ops run per host at a time: a host-side lock tied to our SSH session.

The lock is `flock` held by a process on the host whose stdin is our open
channel: when this run ends, or dies (killed, network lost), the channel
closes, the process exits and the lock is free. A killed run therefore never
leaves a lock that blocks the next one; what it leaves is an owner file,
reported as stale (and overwritten) by the next run. A clean release says
`released` on the channel before closing it, and only then is the owner file
removed. A second concurrent run
is refused with the owner: who, which control node, pid, since when.

The owner file is written (temp file, then rename) by the lock process before
it says LOCKED; when it cannot be (disk full: `df` says so before the write, or
the write fails), the temp file is removed and the lock process exits, so the
lock is never held without its owner record and never blocks the next run.

Only root may take it: every run that takes the lock changes system files, so
a login as a normal user without `become` is refused here, before anything
changed, with a line saying to set `become: true`. With become the lock
process runs under sudo, still reading our channel.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import time
from datetime import datetime, timezone

from k26ops.shell import q
from k26ops.transport.ssh import BECOME_HINT, Session, SSHSession

LOCK_BUSY = 75
NOT_ROOT = 77
NO_ROOM = 28  # ENOSPC: the owner file could not be written
RELEASED = "released"


class HostLocked(Exception):
    """Another k26ops run holds this host."""


class NotRoot(HostLocked):
    """Logged in as a normal user without become: the run could change nothing."""


class OwnerNotWritten(HostLocked):
    """The owner file could not be written (disk full): the lock was let go at once."""


def lock_script(state_dir: str, lock: str, owner_file: str, me: str, need: int) -> str:
    """The lock's shell script: holds the flock while our channel's stdin is open;
    prints LOCKED once held (and the previous owner record, to tell a stale one),
    or exits LOCK_BUSY. No room for the owner record (df, or the write fails):
    NOSPACE/NOWRITE, the temp file removed, and the lock let go by exiting.

    Why it looks like this: it runs at every run's start, so it starts as few
    processes as it can (issue 31: a converged deploy's host CPU). The login
    shell itself holds the lock (`flock` on its fd 9, no `sh -c` under flock),
    reads the previous owner and waits for EOF with builtins (`read`, not `cat`),
    and parses df without awk; what is left: id (skipped where the shell has
    $EUID), flock, df, cat (the owner write: dash's printf says "I/O error" on a
    full disk, cat says "No space left"), mv, and rm on a clean release."""
    tmp = q(owner_file + ".tmp")
    NL = "\n"  # noqa: N806 (${err##*NL}: the error's last line, as `tail -n 1` gave)
    owner = q(owner_file)
    # bash (root's usual login shell) has a read-only $EUID; sh (dash, under sudo) does not: id then.
    uid = "case ${BASH_VERSION:+b} in b) u=$EUID;; *) u=$(id -u);; esac; "
    return (
        uid + f'[ "$u" = 0 ] || {{ echo "NOTROOT $(id -un)"; exit {NOT_ROOT}; }}; '
        f"{{ [ -d {q(state_dir)} ] || mkdir -p {q(state_dir)}; }} && exec 9>>{q(lock)} || exit 1; "
        f"flock -n -E {LOCK_BUSY} 9 || exit $?; "
        f"prev=; [ -f {owner} ] && IFS= read -r prev < {owner}; "
        # POSIX df -P: a header of 7 words, then device, blocks, used, available, ...
        f"set -f; set -- $(df -Pk {q(state_dir)} 2>/dev/null); set +f; avail=${{11:-}}; "
        "case \"$avail\" in ''|*[!0-9]*) ;; *) "
        f'if [ $((avail * 1024)) -lt {need} ]; then echo "NOSPACE $((avail * 1024))"; '
        f"exit {NO_ROOM}; fi;; esac; "
        f"if ! err=$( {{ printf '%s\\n' {q(me)} | cat > {tmp} && mv -f {tmp} {owner}; }} 2>&1 ); then "
        f'rm -f {tmp}; echo "NOWRITE ${{err##*{NL}}}"; exit {NO_ROOM}; fi; '
        'echo "LOCKED $prev"; IFS= read -r bye; while IFS= read -r rest; do :; done; '
        # Only a clean release says goodbye: a run that died (EOF
        # without it) leaves its owner record, reported as stale.
        f'if [ "$bye" = {RELEASED} ]; then rm -f {owner}; fi'
    )


class HostLock:
    def __init__(self, session: Session, state_dir: str, purpose: str):
        self.session = session
        self.state_dir = state_dir
        self.purpose = purpose
        self.chan = None
        self.stale: dict | None = None
        self.need = 0  # bytes of the owner record, set by acquire

    @property
    def owner_file(self) -> str:
        return f"{self.state_dir}/lock.owner"

    def owner(self) -> dict:
        return {
            "user": getpass.getuser(),
            "control_node": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "purpose": self.purpose,
        }

    def acquire(self) -> None:
        lock = f"{self.state_dir}/lock"
        me = json.dumps(self.owner())
        self.need = len(me.encode()) + 1
        script = lock_script(self.state_dir, lock, self.owner_file, me, self.need)
        script = self.session.wrap(script)
        self.session.count_command()  # the lock's channel is a remote command like any other
        if not isinstance(self.session, SSHSession):
            return self._acquire_local(script)
        chan = self.session.conn.transport.open_session(timeout=10)
        chan.exec_command(script)
        buf = b""
        deadline = time.monotonic() + 30
        while b"\n" not in buf:
            if chan.exit_status_ready() and not chan.recv_ready():
                break
            if chan.recv_ready():
                buf += chan.recv(4096)
            elif time.monotonic() > deadline:
                chan.close()
                raise HostLocked(f"could not take the host lock {lock} within 30s")
            else:
                time.sleep(0.01)
        if buf.startswith(b"LOCKED"):
            self.chan = chan
            prev = buf.decode().split(" ", 1)[1].strip() if b" " in buf else ""
            self.stale = json.loads(prev) if prev.startswith("{") else None
            return
        rc = chan.recv_exit_status()
        err = b""
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(4096)
        chan.close()
        if rc == NOT_ROOT and buf.startswith(b"NOTROOT"):
            raise NotRoot(self._not_root(buf))
        if rc == NO_ROOM and buf.startswith((b"NOSPACE", b"NOWRITE")):
            raise OwnerNotWritten(self._not_written(buf))
        if rc == LOCK_BUSY:
            raise HostLocked(self._describe_holder())
        said = (buf or err).decode(errors="replace").strip().splitlines()
        raise HostLocked(
            f"could not take the host lock {lock} (exit {rc}): " + (said[-1] if said else "flock missing?")
        )

    def _acquire_local(self, script: str) -> None:
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = proc.stdout.readline()
        if not line.startswith(b"LOCKED"):
            proc.wait()
            if proc.returncode == NOT_ROOT and line.startswith(b"NOTROOT"):
                raise NotRoot(self._not_root(line))
            if proc.returncode == NO_ROOM and line.startswith((b"NOSPACE", b"NOWRITE")):
                raise OwnerNotWritten(self._not_written(line))
            raise HostLocked(
                self._describe_holder()
                if proc.returncode == LOCK_BUSY
                else f"could not take the host lock (exit {proc.returncode})"
            )
        self.chan = proc

    @staticmethod
    def _not_root(line: bytes) -> str:
        user = line.decode(errors="replace").split(" ", 1)[1].strip() if b" " in line else "?"
        return f"logged in as {user}, not root: k26ops changes system files as root; {BECOME_HINT}"

    def _not_written(self, line: bytes) -> str:
        """One line: the owner file's directory and, on a full disk, the bytes needed."""
        kind, _, said = line.decode(errors="replace").strip().partition(" ")
        where = f"cannot write the host lock's owner file in {self.state_dir}"
        if kind == "NOSPACE":
            return f"{where}: disk full (needs {self.need} bytes, {said} bytes free)"
        if "No space left" in said:
            return f"{where}: disk full (needs {self.need} bytes)"
        return f"{where}: {said or 'write failed'}"

    def _describe_holder(self) -> str:
        res = self.session.run(f"cat {q(self.owner_file)} 2>/dev/null")
        try:
            o = json.loads(res.stdout)
            return (
                f"host is locked by another k26ops run: {o.get('user')}@{o.get('control_node')} "
                f"pid {o.get('pid')} since {o.get('since')} ({o.get('purpose')})"
            )
        except ValueError:
            return "host is locked by another k26ops run (owner unknown)"

    def release(self) -> None:
        chan, self.chan = self.chan, None
        if chan is None:
            return
        if hasattr(chan, "shutdown_write"):
            try:
                try:
                    chan.sendall(f"{RELEASED}\n".encode())
                except OSError:
                    pass
                chan.shutdown_write()
                deadline = time.monotonic() + 5
                while not chan.exit_status_ready() and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                chan.close()
        else:
            try:
                chan.stdin.write(f"{RELEASED}\n".encode())
                chan.stdin.flush()
            except OSError:
                pass
            chan.stdin.close()
            chan.wait(timeout=5)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
