"""The one process-wide "stop now" flag: Ctrl-C (and SIGTERM/SIGHUP, which the CLI
turns into it) sets it; the fleet stops starting hosts, and a running host's next
remote command raises `Interrupted`, so its step restores what it changed."""

from __future__ import annotations

import threading

from k26ops.errors import Interrupted

requested = threading.Event()


def check(what: str = "") -> None:
    """Raise Interrupted when a stop was asked for."""
    if requested.is_set():
        raise Interrupted("interrupted (Ctrl-C, SIGTERM or SIGHUP)" + (f" during {what}" if what else ""))
