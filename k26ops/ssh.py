"""Connections to hosts: Fabric, but with host keys checked strictly.

Fabric accepts unknown and changed host keys silently (AutoAddPolicy, no
known_hosts loaded). Here every connection, including ProxyJump gateways,
loads ~/.ssh/known_hosts plus the inventory's known_hosts file and refuses an
unknown key (unless trust-on-first-use was asked for, which records it) and
always refuses a changed key, showing its fingerprint.

A `Session` is what steps and facts use: `run(command, stdin=, timeout=)`,
the same for SSH and for `connection: local`. It counts the commands it runs
(the benchmarks report remote round trips).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection

from k26ops.inventory import Host

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 600.0
KEEPALIVE_SECONDS = 15
USER_KNOWN_HOSTS = Path(os.path.expanduser("~/.ssh/known_hosts"))


class HostKeyRefused(Exception):
    """The host's key is unknown or differs from the recorded one."""


class Unreachable(Exception):
    """The host could not be connected to (network, timeout, auth)."""


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
                "verify it, add it to known_hosts or rerun with --accept-new-host-keys")
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
        self._lock = threading.Lock()

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None,
            check: bool = False) -> Result:
        with self._lock:
            self.commands += 1
        res = self._run(command, stdin, timeout or DEFAULT_COMMAND_TIMEOUT)
        if check and not res.ok:
            raise CommandFailed(self.host.name, command, res)
        return res

    def _run(self, command, stdin, timeout) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


class CommandFailed(Exception):
    def __init__(self, host: str, command: str, result: Result):
        self.result = result
        first = command.strip().splitlines()[0] if command.strip() else command
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        super().__init__(f"`{first[:80]}` exited {result.exited}"
                         + (f": {detail[-1][:300]}" if detail else ""))


class SSHSession(Session):
    def __init__(self, host: Host, conn: Connection):
        super().__init__(host)
        self.conn = conn

    def _run(self, command, stdin, timeout) -> Result:
        """One exec channel: send stdin (then EOF), read both streams, bounded by timeout."""
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
            out, err = _drain(chan, timeout)
            return Result(chan.recv_exit_status(), out, err)
        except socket.timeout:
            raise TimeoutError(f"command timed out after {timeout:.0f}s on {self.host.name}") from None
        finally:
            chan.close()

    def put(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write a file atomically: SFTP to a temp name beside it, then rename."""
        sftp = self.conn.sftp()
        tmp = f"{remote_path}.k26ops-tmp-{os.getpid()}"
        with sftp.open(tmp, "wb") as fh:
            fh.write(data)
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, remote_path)

    def put_file(self, local_path, remote_path: str, mode: int = 0o644) -> None:
        """Stream a local file to the host atomically (temp name, then rename)."""
        sftp = self.conn.sftp()
        tmp = f"{remote_path}.k26ops-tmp-{os.getpid()}"
        sftp.put(str(local_path), tmp)
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, remote_path)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def _drain(chan: paramiko.Channel, timeout: float) -> tuple[str, str]:
    """Read stdout and stderr as they come (neither can fill up and stall the
    other) until the command exited; bounded by timeout."""
    out, err = io.BytesIO(), io.BytesIO()
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while True:
        busy = False
        while chan.recv_ready():
            out.write(chan.recv(65536)); busy = True
        while chan.recv_stderr_ready():
            err.write(chan.recv_stderr(65536)); busy = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
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

    def _run(self, command, stdin, timeout) -> Result:
        try:
            proc = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"command timed out after {timeout:.0f}s on {self.host.name}") from None
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def put(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        tmp = f"{remote_path}.k26ops-tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, remote_path)

    def put_file(self, local_path, remote_path: str, mode: int = 0o644) -> None:
        import shutil

        tmp = f"{remote_path}.k26ops-tmp-{os.getpid()}"
        shutil.copyfile(local_path, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, remote_path)


def _strict(conn: Connection, host: Host, accept_new: bool) -> None:
    client = conn.client
    client.load_system_host_keys()  # ~/.ssh/known_hosts
    record_to = USER_KNOWN_HOSTS
    if host.known_hosts:
        path = Path(host.known_hosts).expanduser()
        if path.exists():
            client.load_host_keys(str(path))
        record_to = path
    client.set_missing_host_key_policy(_StrictPolicy(accept_new, record_to))
    gateway = conn.gateway
    while isinstance(gateway, Connection):
        gateway.client.load_system_host_keys()
        if host.known_hosts and Path(host.known_hosts).expanduser().exists():
            gateway.client.load_host_keys(str(Path(host.known_hosts).expanduser()))
        gateway.client.set_missing_host_key_policy(_StrictPolicy(accept_new, record_to))
        gateway = gateway.gateway


def _gateway(spec: str | None, timeout: float):
    """A ProxyJump spec ([user@]host[:port], comma-separated chain) as nested Connections."""
    if not spec:
        return None
    gw = None
    for hop in spec.split(","):
        user, _, rest = hop.rpartition("@")
        hostname, _, port = rest.partition(":")
        gw = Connection(hostname, user=user or None, port=int(port) if port else None,
                        gateway=gw, connect_timeout=timeout)
    return gw


def connect(host: Host, *, accept_new: bool = False,
            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Session:
    """Open the host's one connection for this run. Raises HostKeyRefused or Unreachable."""
    if host.connection == "local":
        return LocalSession(host)
    kwargs = {"banner_timeout": connect_timeout, "auth_timeout": connect_timeout,
              "allow_agent": True}
    if host.identity_file:
        kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
        kwargs["look_for_keys"] = False
        kwargs["allow_agent"] = False
    conn = Connection(host.address, user=host.user or None, port=host.port or None,
                      connect_kwargs=kwargs, connect_timeout=connect_timeout,
                      gateway=_gateway(host.gateway, connect_timeout),
                      config=Config(overrides={"load_ssh_configs": True}))
    _strict(conn, host, accept_new)
    try:
        conn.open()
    except HostKeyRefused:
        conn.close()
        raise
    except paramiko.BadHostKeyException as exc:
        conn.close()
        raise HostKeyRefused(
            f"host key for {exc.hostname} CHANGED: offered {exc.key.get_name()} "
            f"{fingerprint(exc.key)}, known_hosts has {fingerprint(exc.expected_key)}; refusing "
            "(if the host was reinstalled, remove the old key from known_hosts)") from None
    except (socket.timeout, TimeoutError):
        conn.close()
        raise Unreachable(f"connect timed out after {connect_timeout:.0f}s") from None
    except paramiko.AuthenticationException as exc:
        conn.close()
        raise Unreachable(f"authentication failed as {conn.user}: {exc}") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        conn.close()
        msg = str(exc) or exc.__class__.__name__
        if isinstance(exc, paramiko.SSHException) and "banner" in msg.lower():
            msg = f"no SSH banner within {connect_timeout:.0f}s ({msg})"
        elif isinstance(exc, paramiko.SSHException) and "no existing session" in msg.lower():
            # paramiko's words when the transport died before authentication:
            # the peer never completed the SSH handshake.
            msg = f"SSH handshake did not complete within {connect_timeout:.0f}s (connection closed)"
        raise Unreachable(msg) from None
    conn.transport.set_keepalive(KEEPALIVE_SECONDS)
    return SSHSession(host, conn)


def q(value) -> str:
    """Quote any value for a POSIX shell. Every inventory/CLI value goes through this."""
    return shlex.quote(str(value))
