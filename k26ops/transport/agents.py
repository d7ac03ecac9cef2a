"""Running host agents (k26ops/agents/*.py, one real file each; what they are and the Python
they may use: k26ops/agents/__init__.py) from the control node: `run` sends one agent's source
as `python3 -S -c <source>` with one JSON request on stdin and reads its answer, the last JSON
line of stdout, through the run's hub when it serves that operation (k26ops/transport/agenthub.py).
`run` is the one caller of the host agents."""

from __future__ import annotations

import json
from pathlib import Path

from k26ops import interrupt
from k26ops.errors import Interrupted, StepFailed
from k26ops.shell import q, tied_to_channel
from k26ops.transport import ssh
from k26ops.transport.ssh import Cancelled, OutputTooLarge

DIR = Path(__file__).resolve().parent.parent / "agents"
OLDEST_PYTHON = (3, 10)


class AgentFailed(StepFailed):
    """The agent could not run or gave no answer (not an answer that says no)."""


def source(name: str) -> str:
    """The agent's source text (`engine` -> agents/engine.py)."""
    return (DIR / f"{name}.py").read_text()


def command(name: str, python: str = "python3", tied: bool = False) -> str:
    """The one remote command that runs agent `name`; `tied`: killed with our
    SSH channel (steps.tied_to_channel), its stdin still the request.
    `-S`: no `site` (the host's .pth files, sitecustomize): an agent uses the
    standard library only, and site's work was ~2 ms of a lab host's CPU per start."""
    cmd = f"{q(python)} -S -c {q(source(name))}"
    return tied_to_channel(cmd, stdin=True) if tied else cmd


def run(
    session,
    name: str,
    op: str,
    timeout: float = 120.0,
    *,
    what: str | None = None,
    interpreter: str = "python3",
    tied: bool = False,
    **req,
) -> dict:
    """Run one operation of agent `name` on the host: one remote command, the
    request as JSON on stdin, the answer the last JSON line of stdout.
    `session`: anything with .run(command, stdin=, timeout=) giving .exited,
    .stdout, .stderr (an SSH session, or a local runner in tests).
    `tied` (a long operation): the agent dies when our channel closes, and
    Ctrl-C (interrupt.requested) closes it at once: Interrupted.
    What the agent prints is bounded (ssh.OUTPUT_LIMIT): more is AgentFailed."""
    what = what or f"{name} agent"
    hub = getattr(session, "hub", None)  # one python3 for the run's short reads (k26ops.transport.agenthub)
    if hub is not None and hub.serves(name, op, interpreter, tied):
        return hub.call(name, op, timeout, what, req)
    host = getattr(getattr(session, "host", None), "name", "the host")
    kw: dict = {}
    if tied:
        kw["cancel"] = interrupt.requested
    try:
        res = session.run(command(name, interpreter, tied), stdin=json.dumps({"op": op, **req}), timeout=timeout, **kw)
    except OutputTooLarge:
        raise AgentFailed(
            f"{what} ({op}) on {host} printed more than {ssh.OUTPUT_LIMIT >> 20} MiB: stopped reading "
            "(an agent answers in one JSON line; is python3 on the host a wrapper that prints?)"
        ) from None
    except Cancelled:
        raise Interrupted(f"interrupted (Ctrl-C, SIGTERM or SIGHUP) during the {what} on {host}") from None
    lines = res.stdout.strip().splitlines()
    if res.exited != 0 or not lines:
        why = (res.stderr.replace("\0", "") or res.stdout or "").strip().splitlines()
        raise AgentFailed(f"{what} ({op}) exited {res.exited}: {why[-1][:300] if why else 'no output'}")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise AgentFailed(
            f"{what} ({op}) on {host} printed no JSON answer as its last line: {lines[-1][:200]!r}"
        ) from None
