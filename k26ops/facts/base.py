"""The Fact type and helpers shared by the fact modules.

A fact is a shell command run on the host plus a pure parser of its output,
pyinfra style: gathering is one remote call for all commands, parsing happens
on the control node and is tested on recorded real outputs. Parsers never
raise on odd output: errors become values ({"error": ...}, None, []).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NOT_FOUND_RC = 127


@dataclass(frozen=True)
class Fact:
    name: str
    command: str  # run with /bin/sh on the host; stderr is merged where the parser needs it
    parse: Callable[[str, int], Any]  # (stdout, rc) -> value; pure, never raises
    timeout: float = 30.0
    # An output agents/gather.py gives itself, byte for byte the command's, when it runs under the
    # interpreter the command names (no process started): its key in gather.py's OWN answers.
    own: str | None = None
    own_args: tuple = ()  # the arguments of that answer (paths and marks the command has too)


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def command_missing(stdout: str, rc: int) -> bool:
    """rc 127, or the shell's 'not found' text (dash: 'sh: 1: x: not found')."""
    return rc == NOT_FOUND_RC or bool(re.search(r"(command not found|: not found)\s*$", stdout, re.M))


def safe(parser: Callable[[str, int], Any]) -> Callable[[str, int], Any]:
    """Wrap a parser so a surprise in the output becomes an error value."""

    def wrapped(stdout: str, rc: int) -> Any:
        try:
            return parser(stdout, rc)
        except Exception as e:  # noqa: BLE001 - a fact must never raise
            return {"error": f"unparsable output ({type(e).__name__}: {e}): {first_line(stdout)[:200]}"}

    wrapped.__name__ = getattr(parser, "__name__", "parse")
    wrapped.__doc__ = parser.__doc__
    return wrapped


def split_marked(stdout: str, marker: str, first: str) -> dict[str, str]:
    """Output of several commands separated by `<marker><name>` lines -> {name: text};
    the text before the first marker is `first`."""
    out, name, buf = {}, first, []
    for line in stdout.splitlines(keepends=True):
        if line.startswith(marker):
            out[name] = "".join(buf)
            name, buf = line[len(marker) :].strip(), []
        else:
            buf.append(line)
    out[name] = "".join(buf)
    return out
