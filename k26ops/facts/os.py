"""Operating-system facts: os-release, python3, systemd, the user commands run as.

Why: the engine wheels need a known distro and a python3 for the host-side
helpers; units need systemd; deploying needs root (directly or through
become). Missing tools give None, not an exception.
"""

from __future__ import annotations

import re
import shlex

from k26ops.facts.base import Fact, command_missing, first_line, safe


@safe
def parse_os_release(stdout: str, rc: int) -> dict:
    """KEY=value lines (shell quoting) -> {"id", "version_id", "pretty_name", "codename", "fields"}."""
    fields = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        try:
            parts = shlex.split(raw)
            value = parts[0] if parts else ""
        except ValueError:
            value = raw.strip("'\"")
        fields[key.strip()] = value
    if not fields:
        return {"error": "no os-release: " + (first_line(stdout)[:200] or f"exit {rc}")}
    return {
        "id": fields.get("ID"),
        "version_id": fields.get("VERSION_ID"),
        "pretty_name": fields.get("PRETTY_NAME"),
        "codename": fields.get("VERSION_CODENAME") or fields.get("UBUNTU_CODENAME"),
        "fields": fields,
        "error": None,
    }


@safe
def parse_python_version(stdout: str, rc: int) -> dict | None:
    """`python3 --version` (2>&1) -> {"version": "3.12.3", "tuple": [3, 12, 3]}; None if absent."""
    if command_missing(stdout, rc):
        return None
    m = re.search(r"Python (\d+)\.(\d+)\.(\d+)(\S*)", stdout)
    if not m:
        return {"error": f"unexpected python3 --version output: {first_line(stdout)[:200]}"}
    return {
        "version": ".".join(m.group(1, 2, 3)) + m.group(4),
        "tuple": [int(m.group(i)) for i in (1, 2, 3)],
        "error": None,
    }


@safe
def parse_systemd_version(stdout: str, rc: int) -> dict | None:
    """`systemctl --version` -> {"version": 255, "full": "255.4-1ubuntu8"}; None if absent."""
    if command_missing(stdout, rc):
        return None
    m = re.search(r"^systemd (\d+)(?: \(([^)]*)\))?", stdout, re.M)
    if not m:
        return {"error": f"unexpected systemctl --version output: {first_line(stdout)[:200]}"}
    feats = stdout.splitlines()[1].split() if len(stdout.splitlines()) > 1 else []
    return {
        "version": int(m.group(1)),
        "full": m.group(2) or m.group(1),
        "features": [f for f in feats if f[:1] in "+-"],
        "error": None,
    }


@safe
def parse_user(stdout: str, rc: int) -> dict:
    """`id -u; id -un` -> {"uid": 1000, "name": "k26"}: who k26ops' commands run as."""
    lines = stdout.split()
    if rc != 0 or len(lines) != 2 or not lines[0].isdigit():
        return {"error": f"unexpected id output: {first_line(stdout)[:200] or f'exit {rc}'}"}
    return {"uid": int(lines[0]), "name": lines[1], "error": None}


FACTS = {
    # the gather agent reads /etc/os-release itself (no sh, no cat); the command where it cannot
    "os_release": Fact(
        "os_release",
        "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>&1",
        parse_os_release,
        own="os_release",
    ),
    # the gather agent runs in this python3: it answers from sys.version, no second python3 start
    "python3": Fact("python3", "python3 --version 2>&1", parse_python_version, own="python_version"),
    "systemd": Fact("systemd", "systemctl --version 2>&1", parse_systemd_version),
    "user": Fact("user", "id -u && id -un", parse_user),
}
