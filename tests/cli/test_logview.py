"""`k26ops logs` helpers: which lines are k26ops' own requests, the journal's
hostname column, --grep. Lines are in the shapes the engine (uvicorn's access
log, as the lab stand-in prints it) and `journalctl -o short-iso` write."""

from __future__ import annotations

import pytest

from k26ops.cli import logview
from k26ops.errors import UserError

OWN = [
    'INFO:     127.0.0.1:51234 - "GET /health?from=k26ops HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:51236 - "GET /health_generate?from=k26ops HTTP/1.1" 200 OK',
    '2026-12-01T10:00:00+0000 gpu1 python3[812]: INFO:     127.0.0.1:40022 - "POST /generate?from=k26ops HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:51237 - "GET /v1/models?x=1&from=k26ops HTTP/1.1" 200 OK',
]
OTHERS = [
    'INFO:     10.0.0.7:40022 - "POST /generate HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK',  # someone else's probe: shown
    'INFO:     10.0.0.7:40022 - "POST /generate?from=k26opsx HTTP/1.1" 200 OK',
    "[2026-12-01 10:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 7, from=k26ops in a message",
]


@pytest.mark.parametrize("line", OWN)
def test_own_requests_are_recognised(line):
    assert logview.own_request(line)


@pytest.mark.parametrize("line", OTHERS)
def test_other_lines_are_kept(line):
    assert not logview.own_request(line)


def test_journal_hostname_is_dropped_once():
    line = "2026-12-01T10:00:00+0000 gpu1 python3[812]: [2026-12-01 10:00:00] Load weight begin."
    assert (
        logview.drop_hostname(line) == "2026-12-01T10:00:00+0000 python3[812]: [2026-12-01 10:00:00] Load weight begin."
    )
    assert logview.drop_hostname("-- Boot 1234 --") == "-- Boot 1234 --"


def test_grep_and_a_bad_grep():
    assert logview.grep("weight (begin|end)")("Load weight end.") and not logview.grep("x")("y")
    with pytest.raises(UserError, match=r"--grep '\(': bad regular expression"):
        logview.grep("(")
