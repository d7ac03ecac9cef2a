"""One python3 on the host for a run's agent calls: agents/hub.py kept on one channel.

Why: a converged deploy asks the host four things in turn (ownership, the
lock, facts, the engine's read + health + smoke), each after the answer
before it. As separate agents.run calls that is one SSH exec channel and one
python3 start each; through a Hub the agents' questions are lines on one
channel to one python3 (issue 31: 2 remote commands, the lock's and this).

`agents.run` asks the session's hub (session.hub, set by playbook.run_on_host)
when it serves that agent's op: short reads only (`ops`), never a long or
`tied` operation, since a call that times out ends the hub (its channel is
closed) and the next call of that kind runs as its own command again. The hub
starts at its first call, counts as one command, and is closed (EOF: it
exits) at the end of the run or when the run dies (the channel closes).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import tempfile
import threading
import time

from k26ops.transport import agents, ssh

ANSWER = "k26ops-hub-answer "  # agents/hub.py's answer prefix (tests/transport/test_agents.py checks they agree)


class Hub:
    def __init__(self, session, ops: set[tuple[str, str]]):
        self.session = session
        self.ops = set(ops)
        self.proc = None  # _SSHChannel or _LocalProcess once started
        self.sent: set[str] = set()  # agents whose source the hub has
        self.closed = False
        self.calls = 0
        self._one_at_a_time = threading.Lock()

    def serves(self, name: str, op: str, interpreter: str, tied: bool) -> bool:
        return not self.closed and not tied and interpreter == "python3" and (name, op) in self.ops

    def call(self, name: str, op: str, timeout: float, what: str, req: dict) -> dict:
        with self._one_at_a_time:  # one request in flight on the channel
            return self._call(name, op, timeout, what, req)

    def _call(self, name: str, op: str, timeout: float, what: str, req: dict) -> dict:
        host = getattr(self.session.host, "name", "the host")
        if self.proc is None:
            self.session.count_command()
            self.proc = _start(self.session, agents.command("hub"))
        line = {"agent": name, "op": op, **req}
        if name not in self.sent:
            line["source"] = agents.source(name)
        try:
            self.proc.send((json.dumps(line) + "\n").encode())
            text = self.proc.answer(time.monotonic() + timeout)
        except (OSError, EOFError, TimeoutError, ssh.OutputTooLarge) as exc:
            err = self.proc.stderr_tail()
            self.close(stop=True)
            why = {
                TimeoutError: f"no answer within {timeout:g}s",
                ssh.OutputTooLarge: f"printed more than {ssh.OUTPUT_LIMIT >> 20} MiB",
            }.get(type(exc)) or (err or f"the hub ended ({type(exc).__name__})")
            raise agents.AgentFailed(f"{what} ({op}) on {host} through the agent hub: {why}") from None
        self.sent.add(name)
        self.calls += 1
        try:
            res = json.loads(text)
        except ValueError:
            self.close(stop=True)
            raise agents.AgentFailed(f"{what} ({op}) on {host} answered no JSON: {text[:200]!r}") from None
        if isinstance(res, dict) and set(res) == {"hub_error"}:
            raise agents.AgentFailed(f"{what} ({op}) failed: {res['hub_error'][:300]}")
        return res

    def close(self, stop: bool = False) -> None:
        """EOF to the hub (it exits when its operation ends); `stop`: after a failed call, at once."""
        self.closed = True
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.close(stop)


def _start(session, command: str):
    cmd = session.wrap(command)
    return _LocalProcess(cmd) if isinstance(session, ssh.LocalSession) else _SSHChannel(session, cmd)


class _Lines:
    """The answer line out of what the hub prints: bounded (ssh.OUTPUT_LIMIT), by a deadline."""

    def __init__(self):
        self.buf = b""

    def answer(self, deadline: float) -> str:
        while True:
            start = self.buf.find(b"\n" + ANSWER.encode())
            if start >= 0:
                end = self.buf.find(b"\n", start + 1)
                if end >= 0:
                    text = self.buf[start + 1 + len(ANSWER) : end].decode()
                    self.buf = self.buf[end:]
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            data = self.recv(min(left, 5.0))
            if data == b"":
                raise EOFError
            if data:
                self.buf += data
                if len(self.buf) > ssh.OUTPUT_LIMIT:
                    raise ssh.OutputTooLarge


class _SSHChannel(_Lines):
    def __init__(self, session, cmd: str):
        super().__init__()
        transport = session.conn.transport
        if transport is None or not transport.is_active():
            raise ssh.Unreachable(f"connection to {session.host.name} is closed")
        self.chan = transport.open_session(timeout=ssh.DEFAULT_CONNECT_TIMEOUT)
        self.chan.exec_command(cmd)
        self.err = b""

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def recv(self, wait: float) -> bytes | None:
        while self.chan.recv_stderr_ready():
            self.err = (self.err + self.chan.recv_stderr(65536))[-4096:]
        self.chan.settimeout(wait)
        try:
            return self.chan.recv(65536)
        except socket.timeout:
            return None

    def stderr_tail(self) -> str:
        lines = self.err.decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    def close(self, stop: bool) -> None:
        try:
            self.chan.shutdown_write()
        except (OSError, EOFError):
            pass
        self.chan.close()


class _LocalProcess(_Lines):
    """`connection: local`: the hub as a child process, its stderr in a temp file."""

    def __init__(self, cmd: str):
        super().__init__()
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(
            ["/bin/sh", "-c", cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            start_new_session=True,
        )

    def send(self, data: bytes) -> None:
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def recv(self, wait: float) -> bytes | None:
        fd = self.p.stdout.fileno()
        return os.read(fd, 65536) if select.select([fd], [], [], wait)[0] else None

    def stderr_tail(self) -> str:
        self.err.seek(0)
        lines = self.err.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    def close(self, stop: bool) -> None:
        try:
            self.p.stdin.close()
            self.p.wait(timeout=0 if stop else 5)
        except (OSError, subprocess.TimeoutExpired):
            ssh._kill_group(self.p)
        self.p.stdout.close()
        self.err.close()
