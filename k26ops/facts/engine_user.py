"""The engine user fact: does the unit's `User=` exist on the host, and can it read what the
engine starts from (the model, the drafter, the releases)?

Why: a unit whose User= is missing fails at every start with systemd's 217/USER, and one
that cannot read the model or the release's venv fails with 203/EXEC or a Python error,
each only after the deploy has replaced the unit. Checked before a deploy changes anything.
"""

from __future__ import annotations

import shlex

from k26ops.facts.base import Fact, first_line, safe

_MARK = "== k26ops-engine-user "


def engine_user_command(user: str, paths: list[str]) -> str:
    """`id` for the user, then per path whether that user can read it (a directory: list and
    enter it), tried as the user with runuser (util-linux, on every systemd host)."""
    u = shlex.quote(user)
    checks = "; ".join(
        f'if runuser -u {u} -- sh -c \'if [ -d "$1" ]; then [ -r "$1" ] && [ -x "$1" ]; '
        f"else [ -r \"$1\" ]; fi' sh {shlex.quote(p)} 2>/dev/null; then printf 'ok %s\\n' {shlex.quote(p)}; "
        f"elif [ -e {shlex.quote(p)} ]; then printf 'denied %s\\n' {shlex.quote(p)}; "
        f"else printf 'absent %s\\n' {shlex.quote(p)}; fi"
        for p in paths
    )
    return (
        f'if id -u {u} >/dev/null 2>&1; then echo "{_MARK}uid $(id -u {u})"; {checks}; else echo "{_MARK}missing"; fi'
    )


@safe
def parse_engine_user(stdout: str, rc: int) -> dict:
    """{"exists": bool, "uid", "readable": [path], "denied": [path], "absent": [path], "error"}."""
    lines = stdout.splitlines()
    if not lines or not lines[0].startswith(_MARK):
        return {"exists": None, "error": first_line(stdout)[:200] or f"no output (exit {rc})"}
    head = lines[0][len(_MARK) :].split()
    if head[0] == "missing":
        return {"exists": False, "uid": None, "readable": [], "denied": [], "absent": [], "error": None}
    out = {"exists": True, "uid": int(head[1]), "readable": [], "denied": [], "absent": [], "error": None}
    for line in lines[1:]:
        word, _, path = line.partition(" ")
        key = {"ok": "readable", "denied": "denied", "absent": "absent"}.get(word)
        if key:
            out[key].append(path)
    return out


def engine_user_fact(user: str, paths: list[str]) -> Fact:
    return Fact("engine_user", engine_user_command(user, paths), parse_engine_user)
