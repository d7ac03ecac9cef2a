"""Values reaching a POSIX shell: every inventory/CLI value goes through `q`."""

from __future__ import annotations

import shlex


def q(value) -> str:
    """Quote any value for a POSIX shell."""
    return shlex.quote(str(value))


# The watchdog of tied_to_channel: how often it probes the channel (also how long a
# finished script's return can lag), and how long a TERMed group has before KILL.
# Read at each call: tests of local tied commands make them short (same shell code).
WATCHDOG_PERIOD = 1.0
WATCHDOG_GRACE = 2.0


def tied_to_channel(script: str, stdin: bool = False) -> str:
    """`script` in its own process group, killed when our SSH channel goes away.

    sshd sends no signal to a non-tty command when the client dies (killed
    control node, Ctrl-C, lost network): a build or install would go on, unowned,
    and race the next run's rebuild of the same directory. A watchdog writes one
    NUL byte to the channel's stderr every second; once the channel is gone the
    write fails (EPIPE) and it kills the build's process group.
    `stdin`: the script reads our channel's stdin (a background job's is
    /dev/null otherwise), e.g. an agent's request.
    """
    start = (
        "exec 3<&0; setsid sh -c " + q(script) + " <&3 3<&- & b=$!; exec 3<&-; "
        if stdin
        else "setsid sh -c " + q(script) + " & b=$!; "
    )
    return (
        start + f"trap '' PIPE; while kill -0 $b 2>/dev/null; do sleep {WATCHDOG_PERIOD:g}; "
        f"printf '\\0' >&2 || {{ kill -TERM -$b 2>/dev/null; sleep {WATCHDOG_GRACE:g}; "
        "kill -KILL -$b 2>/dev/null; exit 143; }; done; wait $b"
    )
