"""Ansible host keys: `name:port`, `[v6addr]:port` and ranges such as
`gpu[01:08]`, `node-[a:c]`, `n[1:10:2]` (expanded the way ansible does)."""

from __future__ import annotations

import re
import string

MAX_HOSTS = 10000  # one range may not expand beyond this (a typo, not a fleet)

_BRACKETED = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOSTPORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
_NAME = re.compile(r"^[A-Za-z0-9_:][A-Za-z0-9_.:@%+\-]*$")

NAME_RULE = "letters, digits and . _ - : @ % + (not starting with - or .)"


class PatternError(ValueError):
    pass


def split_port(pattern: str) -> tuple[str, int | None]:
    for regex in (_BRACKETED, _HOSTPORT):
        m = regex.match(pattern)
        if m:
            return m.group(1), int(m.group(2))
    return pattern, None


def expand(pattern: str) -> list[str]:
    """Expand the first [a:b(:step)] range, recursively, like ansible's
    expand_hostname_range."""
    if "[" not in pattern:
        return [pattern]
    if "]" not in pattern.split("[", 1)[1]:
        raise PatternError("unclosed range: '[' without ']'")
    head, rest = pattern.split("[", 1)
    body, tail = rest.split("]", 1)
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise PatternError(f"host range [{body}] must be begin:end or begin:end:step")
    beg, end = bounds[0] or "0", bounds[1]
    if not end:
        raise PatternError(f"host range [{body}] has no end value")
    step_text = bounds[2] if len(bounds) == 3 else "1"
    try:
        step = int(step_text)
    except ValueError:
        raise PatternError(f"host range [{body}] has a step that is not a number") from None
    if step < 1:
        raise PatternError(f"host range [{body}] needs a step of at least 1")
    width = len(beg) if beg[0] == "0" and len(beg) > 1 else 0
    if width and width != len(end):
        raise PatternError(f"host range [{body}]: begin and end must have the same width")
    if beg in string.ascii_letters and end in string.ascii_letters:
        i, j = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if i > j:
            raise PatternError(f"host range [{body}] must have begin <= end")
        seq = list(string.ascii_letters[i : j + 1 : step])
    else:
        try:
            b, e = int(beg), int(end)
        except ValueError:
            raise PatternError(f"host range [{body}] must be numbers or single letters") from None
        if (e - b) // step + 1 > MAX_HOSTS:
            raise PatternError(f"host range [{body}] expands to more than {MAX_HOSTS} hosts")
        seq = [str(x).zfill(width) for x in range(b, e + 1, step)]
    out: list[str] = []
    for item in seq:
        out.extend(expand(f"{head}{item}{tail}"))
        if len(out) > MAX_HOSTS:
            raise PatternError(f"host pattern expands to more than {MAX_HOSTS} hosts")
    return out


def parse(pattern: str) -> tuple[list[str], int | None]:
    """Host names and the port a YAML host key stands for."""
    name, port = split_port(pattern)
    return expand(name), port


def valid_name(name: str) -> bool:
    """Names k26ops accepts: they end up in paths and remote commands, so no
    spaces, quotes, shell metacharacters, slashes or leading dashes."""
    return bool(_NAME.match(name)) and name not in (".", "..") and ".." not in name
