"""`k26ops logs` for people: k26ops' own requests hidden, the host named once.

k26ops' health probes and smoke requests carry `from=k26ops` in their query
string (k26ops/agents/engine.py), so the engine's access log shows them
as `"GET /health?from=k26ops HTTP/1.1"`; those lines are hidden unless --all.
The journal's own hostname column is dropped: the inventory name is the one
shown (prefixed when several hosts are listed).
"""

from __future__ import annotations

import re

from k26ops.errors import UserError

# `logs -n N` asks the journal again for up to this many lines when hidden lines left fewer than N.
MAX_LINES_ASKED = 200000
_OWN_REQUEST = re.compile(r'"[A-Z]+ /\S*[?&]from=k26ops(?:[&\s"]|$)')
_SHORT_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\S+) \S+ (.*)$")


def own_request(line: str) -> bool:
    """An access-log line of a request k26ops itself made (health, smoke)."""
    return bool(_OWN_REQUEST.search(line))


def drop_hostname(line: str) -> str:
    """`2026-12-01T10:00:00+0000 gpu1 python[7]: msg` -> `2026-12-01T10:00:00+0000 python[7]: msg`."""
    m = _SHORT_ISO.match(line)
    return f"{m.group(1)} {m.group(2)}" if m else line


def grep(pattern: str | None):
    """--grep's test (a regular expression; a bad one is one line, exit 2)."""
    if pattern is None:
        return lambda line: True
    try:
        return re.compile(pattern).search
    except re.error as exc:
        raise UserError(f"--grep {pattern!r}: bad regular expression: {exc}") from None


def check_since(since: str | None, results) -> None:
    """--since that journalctl cannot read as a time is the user's typo, not a
    host failure: one line, exit 2 (the hosts' journals say so, not a guess here)."""
    if not since:
        return
    bad = [r for r in results if r.error and "Failed to parse timestamp" in r.error]
    if bad and len(bad) == len([r for r in results if r.error]):
        raise UserError(
            f"--since {since!r}: not a time journalctl understands (on {bad[0].host}); "
            "e.g. '1h ago', 'today', 'yesterday', '2026-12-01 10:00'"
        )
