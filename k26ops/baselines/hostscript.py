"""The control side of snapshot, rollback and drift's host agent
(k26ops/agents/baseline.py): `snapshot` reads, in one round trip, everything a
baseline records about a host; `probe` is the cheap part (release, hashes of
its patched files, unit and env text) for rollback and drift.
"""

from __future__ import annotations

from k26ops.transport import agents

HostScriptFailed = agents.AgentFailed  # the agent could not run or answered no JSON


def call(session, op: str, timeout: float = 300.0, **req) -> dict:
    """One remote command: agents/baseline.py with `op`, the request on stdin."""
    return agents.run(session, "baseline", op, timeout, what="baseline host script", **req)
