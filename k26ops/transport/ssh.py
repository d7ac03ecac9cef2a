"""Connections to hosts: Fabric, but with host keys checked strictly.

Fabric accepts unknown and changed host keys silently (AutoAddPolicy, no
known_hosts loaded). Here every connection, including ProxyJump gateways,
loads ~/.ssh/known_hosts plus the inventory's known_hosts file and refuses an
unknown key (unless trust-on-first-use was asked for, which records it) and
always refuses a changed key, showing its fingerprint.

A `Session` is what steps and facts use: `run(command, stdin=, timeout=)`,
the same for SSH and for `connection: local`. It counts the commands it runs
(the benchmarks report remote round trips).

Become (inventory `become: true`, Ansible's `ansible_become`): hosts reached as
a normal user with passwordless sudo. Every command then runs as
`sudo -n -H -- sh -c '<command>'` (-n: never prompt; a sudo that wants a
password fails at once), and files are written by root: SFTP to a private temp
file of the login user, then root copies it next to the target and renames it
into place. `sudo -n` is tried once right after connecting, so a host whose
sudo needs a password fails before anything runs on it.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import io
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection

from k26ops.errors import BecomeFailed, HostKeyRefused, Unreachable  # noqa: F401 (re-exported)
from k26ops.inventory import Host
from k26ops.shell import q  # noqa: F401 (re-exported)

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 600.0
KEEPALIVE_SECONDS = 15
# The most a command's stdout and stderr together may print before we stop reading: a host
# that prints garbage (or a runaway agent) must not grow the control node's memory without
# bound (300 MB of output once took 936 MB here). Host output k26ops reads is far smaller.
OUTPUT_LIMIT = 64 << 20
USER_KNOWN_HOSTS = Path(os.path.expanduser("~/.ssh/known_hosts"))


class OutputTooLarge(Exception):
    """A command printed more than OUTPUT_LIMIT bytes: we stopped reading and closed its channel."""


class Cancelled(Exception):
    """The caller's cancel event was set while the command ran: its channel was closed."""


BECOME_HINT = "set `become: true` for this host (needs passwordless sudo) or log in as root"


def as_root(command: str) -> str:
    """`command` run by root through sudo: -n never prompts, -H gives root's HOME."""
    return f"sudo -n -H -- sh -c {q(command)}"


def install_as_root(tmp: str, remote_path: str, mode: int) -> str:
    """Shell line (run by the login user) that has root copy `tmp` (the login
    user's upload) to a temp name beside `remote_path`, chmod and rename it into
    place; the temp names are removed whatever happens."""
    inner = (
        f"set -e; t=$(mktemp {q(remote_path + '.k26ops-tmp-XXXXXX')}); "
        f'trap \'rm -f "$t"\' EXIT; cp {q(tmp)} "$t"; chmod {mode:o} "$t"; '
        f'mv -fT "$t" {q(remote_path)}; trap - EXIT'
    )
    return f"{as_root(inner)}; rc=$?; rm -f {q(tmp)}; exit $rc"


def sudo_problem(user: str, res: "Result") -> str | None:
    """None if `sudo -n id -u` said 0, else the one-line reason."""
    if res.ok and res.stdout.strip() == "0":
        return None
    if res.exited == 127:
        why = "sudo is not installed"
    else:
        lines = [ln.strip() for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
        why = lines[-1].removeprefix("sudo: ") if lines else f"exit {res.exited}"
        if res.ok:
            why = f"commands ran as uid {res.stdout.strip()!r}, not root"
    return f"sudo -n failed for user {user}: {why} (become needs passwordless sudo for this user)"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _known_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse, or with trust-on-first-use record it and accept."""

    def __init__(self, accept_new: bool, record_to: Path | None):
        self.accept_new = accept_new
        self.record_to = record_to

    def missing_host_key(self, client, hostname, key):
        if not self.accept_new:
            raise HostKeyRefused(
                f"unknown host key {key.get_name()} {fingerprint(key)} for {hostname}: "
                "verify it, add it to known_hosts or rerun with --accept-new-host-keys"
            )
        if self.record_to is not None:
            self.record_to.parent.mkdir(parents=True, exist_ok=True)
            with open(self.record_to, "a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


@dataclass
class Result:
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


class Session:
    """One host's connection for a whole run, shared by every step."""

    def __init__(self, host: Host):
        self.host = host
        self.commands = 0
        self.hub = None  # k26ops.transport.agenthub.Hub while a playbook runs: agents.run asks it first
        self.relay = None  # k26ops.release.wheelsource.Batch of the rollout batch this host runs in, if any
        self.uploaded = 0  # bytes of file contents sent to this host (put, put_file)
        self._lock = threading.Lock()

    def run(
        self,
        command: str,
        *,
        stdin: str | None = None,
        timeout: float | None = None,
        check: bool = False,
        cancel: threading.Event | None = None,
    ) -> Result:
        """`cancel`: an event that, once set, ends the command at once (its channel is
        closed: a command made with steps.tied_to_channel dies with it) with Cancelled."""
        self.count_command()
        res = self._run(self.wrap(command), stdin, timeout or DEFAULT_COMMAND_TIMEOUT, cancel)
        if check and not res.ok:
            raise CommandFailed(self.host.name, command, res)
        return res

    def wrap(self, command: str) -> str:
        """The command line that runs `command` as this host's root (sudo if become)."""
        return as_root(command) if self.host.become else command

    def check_become(self, user: str) -> None:
        """With become: one `sudo -n` round trip; raises BecomeFailed if it cannot."""
        if not self.host.become:
            return
        res = self._raw(as_root("id -u"))
        problem = sudo_problem(user, res)
        if problem:
            raise BecomeFailed(problem)

    def count_command(self) -> None:
        """One more remote command (exec channel) for the report: every channel a run opens
        counts, also those opened outside `run` (the host lock's, the agent hub's)."""
        with self._lock:
            self.commands += 1

    def _count_upload(self, size: int) -> None:
        with self._lock:
            self.uploaded += size

    def _raw(self, command: str, timeout: float = 60.0) -> Result:
        """A command of k26ops' own, as the login user (never through sudo)."""
        self.count_command()
        return self._run(command, None, timeout, None)

    def _run(self, command, stdin, timeout, cancel) -> Result:  # pragma: no cover - abstract
        """Run `command` exactly as given (no sudo), as the login user."""
        raise NotImplementedError

    def _install(self, tmp: str, remote_path: str, mode: int) -> None:
        """Become: root puts the login user's temp file `tmp` in place (and it is removed)."""
        res = self._raw(install_as_root(tmp, remote_path, mode), DEFAULT_COMMAND_TIMEOUT)
        if not res.ok:
            raise CommandFailed(self.host.name, f"install {remote_path} as root", res)

    def close(self) -> None:
        pass


class CommandFailed(Exception):
    def __init__(self, host: str, command: str, result: Result):
        self.result = result
        first = command.strip().splitlines()[0] if command.strip() else command
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        super().__init__(f"`{first[:80]}` exited {result.exited}" + (f": {detail[-1][:300]}" if detail else ""))


class SSHSession(Session):
    def __init__(self, host: Host, conn: Connection):
        super().__init__(host)
        self.conn = conn

    def _run(self, command, stdin, timeout, cancel) -> Result:
        """One exec channel: send stdin (then EOF), read both streams, bounded by timeout,
        OUTPUT_LIMIT and `cancel`."""
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise Unreachable(f"connection to {self.host.name} is closed")
        chan = transport.open_session(timeout=DEFAULT_CONNECT_TIMEOUT)
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            out, err = _drain(chan, timeout, cancel)
            return Result(chan.recv_exit_status(), out, err)
        except socket.timeout:
            raise TimeoutError(f"command timed out after {timeout:.0f}s on {self.host.name}") from None
        except OutputTooLarge as exc:
            raise OutputTooLarge(f"{self.host.name}: {exc}") from None
        finally:
            chan.close()

    def put(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write a file atomically: SFTP to a temp name beside it, then rename."""
        self._count_upload(len(data))

        def upload(sftp, tmp):
            with sftp.open(tmp, "wb") as fh:
                fh.write(data)

        self._put(upload, remote_path, mode)

    def put_file(self, local_path, remote_path: str, mode: int = 0o644) -> None:
        """Stream a local file to the host atomically (temp name, then rename)."""
        self._count_upload(os.path.getsize(local_path))
        self._put(lambda sftp, tmp: sftp.put(str(local_path), tmp), remote_path, mode)

    def _put(self, upload, remote_path: str, mode: int) -> None:
        sftp = self.conn.sftp()
        if not self.host.become:
            tmp = f"{remote_path}.k26ops-tmp-{os.getpid()}"
            upload(sftp, tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, remote_path)
            return
        # The login user cannot write there: upload to its own private temp
        # file (mktemp: mode 600), then root installs it (see install_as_root).
        res = self._raw('umask 077; mktemp "${TMPDIR:-/tmp}/k26ops-put.XXXXXXXX"')
        tmp = res.stdout.strip()
        if not res.ok or not tmp.startswith("/"):
            raise CommandFailed(self.host.name, "mktemp (upload temp file)", res)
        try:
            upload(sftp, tmp)
        except BaseException:
            try:
                self._raw(f"rm -f {q(tmp)}")
            except Exception:
                pass  # the connection is gone: the temp file is the login user's, in its tmp
            raise
        self._install(tmp, remote_path, mode)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def _too_much() -> OutputTooLarge:
    return OutputTooLarge(f"the command printed more than {OUTPUT_LIMIT >> 20} MiB: stopped reading it")


def _drain(chan: paramiko.Channel, timeout: float, cancel: threading.Event | None = None) -> tuple[str, str]:
    """Read stdout and stderr as they come (neither can fill up and stall the
    other) until the command exited; bounded by timeout, by OUTPUT_LIMIT bytes
    (OutputTooLarge) and by `cancel` (Cancelled)."""
    out, err = io.BytesIO(), io.BytesIO()
    deadline = time.monotonic() + timeout
    pause = 0.0005
    exited = 0.0
    while True:
        busy = False
        while chan.recv_ready():
            out.write(chan.recv(65536))
            busy = True
        while chan.recv_stderr_ready():
            err.write(chan.recv_stderr(65536))
            busy = True
        if out.tell() + err.tell() > OUTPUT_LIMIT:
            raise _too_much()
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled")
        # Done when the command exited AND the channel's EOF came: sshd may send the exit
        # status before the last output it still had in the pipe (seen: a converged deploy
        # lost the last line of a 3-line answer about 1 run in 50). EOF waits at most 2 s more.
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            if chan.eof_received or chan.closed:
                break
            exited = exited or time.monotonic()
            if time.monotonic() - exited > 2.0:
                break
        if time.monotonic() > deadline:
            raise socket.timeout()
        if busy:
            pause = 0.0005
        else:
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
    return out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


class LocalSession(Session):
    """`connection: local`: run on this machine, no SSH (e.g. on a GPU host itself)."""

    def _run(self, command, stdin, timeout, cancel) -> Result:
        """Like SSHSession._run: both pipes read as they come, bounded by timeout,
        OUTPUT_LIMIT and `cancel`; on any of these our ends of the pipes close first
        (as a channel would: a steps.tied_to_channel command ends its work), then
        its process group is killed."""
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            if stdin is not None:
                proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        bufs = {proc.stdout: io.BytesIO(), proc.stderr: io.BytesIO()}
        deadline = time.monotonic() + timeout
        why, reading = None, [proc.stdout, proc.stderr]
        while reading and not why:
            for f in select.select(reading, [], [], 0.05)[0]:
                data = os.read(f.fileno(), 65536)
                if data:
                    bufs[f].write(data)
                else:
                    reading.remove(f)
            why = (
                "output"
                if sum(b.tell() for b in bufs.values()) > OUTPUT_LIMIT
                else "cancel"
                if cancel is not None and cancel.is_set()
                else "timeout"
                if time.monotonic() > deadline
                else None
            )
        if not why:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = "timeout"
        proc.stdout.close()
        proc.stderr.close()
        if why:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            _kill_group(proc)
        if why == "output":
            raise OutputTooLarge(f"{self.host.name}: {_too_much()}")
        if why == "cancel":
            raise Cancelled("cancelled")
        if why == "timeout":
            raise TimeoutError(f"command timed out after {timeout:.0f}s on {self.host.name}")
        out, err = (bufs[f].getvalue().decode(errors="replace") for f in (proc.stdout, proc.stderr))
        return Result(proc.returncode, out, err)

    def put(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        def write(tmp):
            with open(tmp, "wb") as fh:
                fh.write(data)

        self._put(write, remote_path, mode)

    def put_file(self, local_path, remote_path: str, mode: int = 0o644) -> None:
        self._put(lambda tmp: shutil.copyfile(local_path, tmp), remote_path, mode)

    def _put(self, write, remote_path: str, mode: int) -> None:
        if not self.host.become:
            tmp = f"{remote_path}.k26ops-tmp-{os.getpid()}"
            write(tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, remote_path)
            return
        fd, tmp = tempfile.mkstemp(prefix="k26ops-put.")  # mode 600, ours
        os.close(fd)
        try:
            write(tmp)
        except BaseException:
            os.unlink(tmp)
            raise
        self._install(tmp, remote_path, mode)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        pass
    proc.wait()


# known_hosts files parsed in this process: path -> (sha256 of the bytes parsed, HostKeys).
# paramiko's HostKeys.load is quadratic (each line checked against all before it): a
# 1000-entry ~/.ssh/known_hosts costs ~0.1 CPU-s, under the GIL, and every connection
# (each host, each bastion hop) parsed the user's file and the inventory's again.
_KNOWN: dict[str, tuple[str, paramiko.HostKeys]] = {}
_KNOWN_LOCK = threading.Lock()


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _known_hosts(path: Path) -> paramiko.HostKeys | None:
    """The file as paramiko parses it, once per content (an appended or edited file is parsed
    again); None when it cannot be read (paramiko's load_system_host_keys ignores that too)."""
    with _KNOWN_LOCK:
        digest = _digest(path)
        hit = _KNOWN.get(str(path))
        if digest is None or (hit and hit[0] == digest):
            return hit[1] if digest and hit else None
        keys = paramiko.HostKeys()
        try:
            keys.load(str(path))
        except OSError:
            return None
        if _digest(path) == digest:  # unchanged while parsed: what was hashed is what was parsed
            _KNOWN[str(path)] = (digest, keys)
        return keys


def _trust(client: paramiko.SSHClient, hostname: str, port: int, files: list[Path]) -> None:
    """Give `client` the known keys of this one host, by paramiko's own rule: the first file
    (the user's ~/.ssh/known_hosts, paramiko's "system" keys) that has any key for the host
    decides, the next (the inventory's) only if it has none. Nothing else differs from loading
    both files into the client: the same keys are checked, an unknown or changed key refused."""
    name = _known_name(hostname, port)
    for path in files:
        keys = _known_hosts(path)
        found = keys.lookup(name) if keys is not None else None
        if found:
            known = client.get_host_keys()
            for keytype in dict.fromkeys(found.keys()):  # per type, the file's first key (as paramiko reads it)
                known.add(name, keytype, found[keytype])
            return


def _strict(conn: Connection, host: Host, accept_new: bool) -> None:
    files = [Path(os.path.expanduser("~/.ssh/known_hosts"))]
    record_to = USER_KNOWN_HOSTS
    if host.known_hosts:
        record_to = Path(host.known_hosts).expanduser()
        files.append(record_to)
    hop = conn
    while isinstance(hop, Connection):  # the host, then each bastion of its ProxyJump chain
        _trust(hop.client, hop.host, hop.port, files)
        hop.client.set_missing_host_key_policy(_StrictPolicy(accept_new, record_to))
        hop = hop.gateway


def _gateway(spec: str | None, timeout: float):
    """A ProxyJump spec ([user@]host[:port], comma-separated chain) as nested Connections."""
    if not spec:
        return None
    gw = None
    for hop in spec.split(","):
        user, _, rest = hop.rpartition("@")
        hostname, _, port = rest.partition(":")
        gw = Connection(
            hostname,
            user=user or None,
            port=int(port) if port else None,
            gateway=gw,
            connect_timeout=timeout,
            connect_kwargs={"banner_timeout": timeout, "auth_timeout": timeout},
        )
    return gw


def _hops(conn: Connection) -> list[Connection]:
    """The connection's ProxyJump chain, outermost bastion first, then conn itself."""
    chain = [conn]
    while isinstance(chain[0].gateway, Connection):
        chain.insert(0, chain[0].gateway)
    return chain


def _hop_name(c: Connection) -> str:
    return f"{c.user + '@' if c.user else ''}{c.host}:{c.port}"


def failure(exc: BaseException, hop: Connection, timeout: float, via_bastion: bool = False) -> str | None:
    """What failed on one hop, in an operator's words: DNS, refused, timeout,
    authentication, handshake; None for what is not a connection failure."""
    if isinstance(exc, socket.gaierror):
        return f"DNS: cannot resolve {hop.host!r} ({exc.strerror or exc})"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        causes = list(exc.errors.values())
        if causes and all(isinstance(c, ConnectionRefusedError) for c in causes):
            return f"connection refused on port {hop.port} (no sshd listening?)"
        return f"cannot connect to port {hop.port}: {'; '.join(str(c) for c in causes) or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused on port {hop.port} (no sshd listening?)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"timeout: no answer within {timeout:.0f}s"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed as {hop.user}: {exc}"
    if isinstance(exc, paramiko.ChannelException):
        return (
            f"the bastion could not open a connection to port {hop.port} "
            f"(refused, unreachable or name unknown from the bastion: {exc})"
        )
    if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
        msg = str(exc) or exc.__class__.__name__
        if "banner" in msg.lower():
            return f"timeout: no SSH banner within {timeout:.0f}s ({msg})"
        if "no existing session" in msg.lower():
            # paramiko's words when the transport died before authentication
            return f"timeout: SSH handshake did not complete within {timeout:.0f}s (connection closed)"
        return msg
    return None


def connect(host: Host, *, accept_new: bool = False, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Session:
    """Open the host's one connection for this run. Raises HostKeyRefused or Unreachable."""
    if host.connection == "local":
        return _checked(LocalSession(host), getpass.getuser())
    kwargs = {"banner_timeout": connect_timeout, "auth_timeout": connect_timeout, "allow_agent": True}
    if host.identity_file:
        kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
        kwargs["look_for_keys"] = False
        kwargs["allow_agent"] = False
    conn = Connection(
        host.address,
        user=host.user or None,
        port=host.port or None,
        connect_kwargs=kwargs,
        connect_timeout=connect_timeout,
        gateway=_gateway(host.gateway, connect_timeout),
        config=Config(overrides={"load_ssh_configs": True}),
    )
    _strict(conn, host, accept_new)
    hops = _hops(conn)
    for i, hop in enumerate(hops):  # bastions first, so a failure names its hop
        what = (
            f"bastion {_hop_name(hop)}"
            if hop is not conn
            else f"host {_hop_name(hop)}" + (f" (via bastion {_hop_name(hops[i - 1])})" if i else "")
        )
        try:
            hop.open()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, HostKeyRefused):
                raise HostKeyRefused(f"{what}: {exc}") from None
            if isinstance(exc, paramiko.BadHostKeyException):
                raise HostKeyRefused(
                    f"{what}: host key for {exc.hostname} CHANGED: offered {exc.key.get_name()} "
                    f"{fingerprint(exc.key)}, known_hosts has {fingerprint(exc.expected_key)}; refusing "
                    "(if the host was reinstalled, remove the old key from known_hosts)"
                ) from None
            why = failure(exc, hop, connect_timeout, via_bastion=bool(i))
            if why is None:
                raise
            raise Unreachable(f"{what}: {why}") from None
    conn.transport.set_keepalive(KEEPALIVE_SECONDS)
    return _checked(SSHSession(host, conn), conn.user)


def _checked(session: Session, user: str) -> Session:
    """The session, once become (if set) is known to work; closed if not."""
    try:
        session.check_become(user)
    except BaseException:
        session.close()
        raise
    return session
