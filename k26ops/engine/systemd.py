"""systemd's syntax for what k26ops writes: command lines (systemd.service(5) "Command
lines"), unit values, and EnvironmentFile= lines (systemd.exec(5)), written and read back.
Pure: no host access."""

from __future__ import annotations

import re
from collections.abc import Iterable

from k26ops.errors import UserError

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_ASSIGN = re.compile(r"(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*")

# ---------------------------------------------------------------- escaping


def check_text(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{what}: expected text, got {type(value).__name__} {value!r}")
    bad = [c for c in value if (ord(c) < 32 and c != "\t") or ord(c) == 127]
    if bad:
        raise UserError(f"{what}: control character {bad[0]!r} not allowed in {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{what}: not valid UTF-8: {value!r}") from None
    return value


def systemd_quote(arg: str) -> str:
    """One ExecStart= word that systemd turns back into exactly `arg` at exec time.

    Specifiers (`%`) and environment references (`$`) are doubled; anything
    beyond a plain word is double-quoted with C escapes for `\\` and `"`.
    Newlines and other control characters are refused (tab becomes `\\t`)."""
    check_text(arg, "ExecStart argument")
    word = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE_WORD.fullmatch(arg):
        return word
    word = word.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")
    return f'"{word}"'


def systemd_exec(argv: Iterable[str]) -> str:
    """An ExecStart= value: the executable (absolute path) and its quoted arguments."""
    argv = list(argv)
    if not argv:
        raise UserError("ExecStart: empty command line")
    exe = check_text(argv[0], "ExecStart executable")
    if not exe.startswith("/") or "$" in exe:
        raise UserError(f"ExecStart executable must be an absolute path without '$': {exe!r}")
    return " ".join(systemd_quote(a) for a in argv)


def unit_value(value) -> str:
    """A free-text unit setting (Description=, User=): no control chars, `%` doubled."""
    return check_text(str(value), "unit setting").replace("%", "%%")


def unit_path(value) -> str:
    """A path setting (EnvironmentFile=, WorkingDirectory=): absolute, no whitespace."""
    text = check_text(str(value), "unit path")
    if not text.startswith("/") or any(c.isspace() for c in text):
        raise UserError(f"unit path must be absolute without whitespace: {text!r}")
    return text.replace("%", "%%")


def int_value(value) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"unit setting: expected a non-negative integer, got {value!r}")
    return str(value)


def env_quote(value) -> str:
    """A value for an EnvironmentFile= line: double-quoted; `\\ " $ \\`` escaped.

    systemd.exec(5) and a POSIX shell both read it back as `value`."""
    text = check_text(str(value), "env value")
    for ch in '\\"$`':
        text = text.replace(ch, "\\" + ch)
    return f'"{text}"'


def env_line(key: str, value) -> str:
    if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
        raise UserError(f"env file: invalid variable name {key!r}")
    if value is None or isinstance(value, (dict, list)):
        raise UserError(f"env file: {key} needs a text or number value, got {value!r}")
    if isinstance(value, bool):
        value = "1" if value else "0"
    return f"{key}={env_quote(value)}"


def parse_env(text: str) -> list[tuple[str, str, int, int]]:
    """(key, value, value_start, value_end) for each assignment, read the way
    systemd reads an EnvironmentFile= (comments, quotes, escapes, continuations)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        m = _ENV_ASSIGN.match(text, i)
        if not m:
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        key, start = m.group(1), m.end()
        value, j = _env_value(text, start)
        out.append((key, value, start, j))
        i = j
    return out


def _env_value(text: str, i: int) -> tuple[str, int]:
    """systemd's value state machine: quotes open only where a value (or a
    quoted part) starts; trailing unquoted whitespace is dropped."""
    n, buf, keep, state = len(text), [], 0, "pre"
    while i < n:
        c = text[i]
        if state in ("pre", "value") and c in "\n\r":
            break
        if state == "pre" and c in "'\"":
            state = "single" if c == "'" else "double"
        elif state in ("pre", "value") and c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                buf.append(text[i + 1])
                keep = len(buf)
            i += 1
            state = "value"
        elif state == "pre" and c in " \t":
            pass
        elif state in ("pre", "value"):
            state = "value"
            buf.append(c)
            if c not in " \t":
                keep = len(buf)
        elif state == "single":
            if c == "'":
                state = "pre"
            else:
                buf.append(c)
                keep = len(buf)
        else:  # double
            if c == '"':
                state = "pre"
            elif c == "\\" and i + 1 < n:
                nxt = text[i + 1]
                buf += [] if nxt == "\n" else [nxt] if nxt in '"\\`$' else ["\\", nxt]
                keep = len(buf)
                i += 1
            else:
                buf.append(c)
                keep = len(buf)
        i += 1
    return "".join(buf[:keep]), i
