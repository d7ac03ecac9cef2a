"""Host agents: the Python that k26ops runs on a host, one real file each.

Each module here runs under the host's own `python3` (standard library only),
shipped with the command (`python3 -c <source>`): nothing is installed on the
host and nothing is left behind. One protocol for all of them: one JSON
request on stdin ({"op": NAME, ...}), one JSON answer as the last line of
stdout. `run` is the one caller; the modules are linted and unit-tested here
like the rest of k26ops (tests/test_agents.py), never imported at run time.
"""

from __future__ import annotations

import json
from pathlib import Path

from k26ops.ssh import q
from k26ops.steps import StepFailed

DIR = Path(__file__).resolve().parent


class AgentFailed(StepFailed):
    """The agent could not run or gave no answer (not an answer that says no)."""


def source(name: str) -> str:
    """The agent's source text (`engine` -> agents/engine.py)."""
    return (DIR / f"{name}.py").read_text()


def command(name: str, python: str = "python3") -> str:
    """The one remote command that runs agent `name`."""
    return f"{q(python)} -c {q(source(name))}"


def run(session, name: str, op: str, timeout: float = 120.0, *, what: str | None = None, **req) -> dict:
    """Run one operation of agent `name` on the host: one remote command, the
    request as JSON on stdin, the answer the last JSON line of stdout."""
    what = what or f"{name} agent"
    res = session.run(command(name), stdin=json.dumps({"op": op, **req}), timeout=timeout)
    lines = res.stdout.strip().splitlines()
    if res.exited != 0 or not lines:
        why = (res.stderr or res.stdout or "").strip().splitlines()
        raise AgentFailed(f"{what} ({op}) exited {res.exited}: {why[-1][:300] if why else 'no output'}")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise AgentFailed(f"{what} ({op}) printed no JSON: {lines[-1][:200]!r}") from None
