"""Hostile path values: each would run `touch` if it reached a shell unquoted."""

from __future__ import annotations

HOSTILE = [
    "/tmp/a b",
    "/tmp/it's",
    '/tmp/"q"',
    "/tmp/$(touch /tmp/PWNED1)",
    "/tmp/x; touch /tmp/PWNED2",
    "/tmp/`touch /tmp/PWNED3`",
    "/tmp/line\ntouch /tmp/PWNED4",
    "/tmp/$HOME|touch /tmp/PWNED5",
]
