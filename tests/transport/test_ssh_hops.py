"""An unreachable host's error names the hop that failed (bastion or host) and
what failed there (refused, timeout, handshake, DNS), on loopback only."""

from __future__ import annotations

import json
import socket
import threading

import paramiko
import pytest
from click.testing import CliRunner
from fabric import Connection

from k26ops.cli import cli
from k26ops.transport import ssh


@pytest.fixture
def silent_port():
    """A TCP port that accepts and never speaks (no SSH banner)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _error(tmp_path, text) -> str:
    inv = tmp_path / "inv.yml"
    inv.write_text(text)
    res = CliRunner().invoke(cli, ["-i", str(inv), "--connect-timeout", "0.3", "status", "--json"])
    return json.loads(res.stdout)["hosts"]["a"]["error"]


def test_refused_host_is_named(tmp_path):
    err = _error(tmp_path, "hosts:\n  a: {address: 127.0.0.1, port: 1, user: u}\n")
    assert err == "host u@127.0.0.1:1: connection refused on port 1 (no sshd listening?)"


def test_refused_bastion_is_named_not_the_host(tmp_path):
    err = _error(tmp_path, "hosts:\n  a: {address: 127.0.0.2, port: 22, user: u, gateway: 'ops@127.0.0.1:1'}\n")
    assert err == "bastion ops@127.0.0.1:1: connection refused on port 1 (no sshd listening?)"


def test_silent_bastion_is_a_timeout_of_the_bastion(tmp_path, silent_port):
    err = _error(
        tmp_path, f"hosts:\n  a: {{address: 127.0.0.2, port: 22, user: u, gateway: 'ops@127.0.0.1:{silent_port}'}}\n"
    )
    assert err.startswith(f"bastion ops@127.0.0.1:{silent_port}: timeout: ")


def test_silent_host_is_a_timeout_of_the_host(tmp_path, silent_port):
    err = _error(tmp_path, f"hosts:\n  a: {{address: 127.0.0.1, port: {silent_port}, user: u}}\n")
    assert err.startswith(f"host u@127.0.0.1:{silent_port}: timeout: ")


def test_failure_words_for_each_kind():
    hop = Connection("bastion.example.internal", user="ops", port=22)
    dns = socket.gaierror(socket.EAI_NONAME, "Name or service not known")  # as getaddrinfo raises it
    assert ssh.failure(dns, hop, 10) == "DNS: cannot resolve 'bastion.example.internal' (Name or service not known)"
    assert ssh.failure(paramiko.AuthenticationException("no key"), hop, 10) == "authentication failed as ops: no key"
    assert ssh.failure(socket.timeout(), hop, 10) == "timeout: no answer within 10s"
    assert "could not open a connection" in ssh.failure(paramiko.ChannelException(2, "Connect failed"), hop, 10)
    assert ssh.failure(ValueError("x"), hop, 10) is None
