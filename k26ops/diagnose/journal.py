"""`k26ops diagnose service`: the engine's last crash on each host, named.

On the host one agent (k26ops/agents/journal.py) reads the unit's journal (JSON, bounded),
groups the engine's output by invocation and finds the newest invocation that
ended in a failure (systemd's "Main process exited, code=..., status=..." /
"Failed with result" for that invocation, not a clean stop); only that
invocation's text comes back. The control node classifies it (secrets
redacted first).
"""

from __future__ import annotations

from k26ops.transport import agents


def last_crash(session, unit: str, lines: int = 20000, keep: int = 5000) -> dict:
    """The unit's newest failed invocation on the host (agents/journal.py), unclassified."""
    try:
        return agents.run(
            session, "journal", "last_crash", 180, what="journal agent", unit=unit, lines=lines, keep=keep
        )
    except agents.AgentFailed as exc:
        raise RuntimeError(f"reading the journal of {unit} failed: {exc}") from None
