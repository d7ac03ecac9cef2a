"""The platform fact: the host's C library and machine, what a wheel's platform tag needs.

Why: an engine lock is made for one wheel platform (`manylinux_2_35 x86_64`: glibc 2.35 or
newer on x86_64). A host with an older glibc or another machine cannot install its wheels;
`check` says so before a deploy gets as far as the host's installer.
"""

from __future__ import annotations

import re

from k26ops.facts.base import Fact, first_line, safe

COMMAND = "getconf GNU_LIBC_VERSION 2>&1; uname -m"


@safe
def parse_platform(stdout: str, rc: int) -> dict:
    """`getconf GNU_LIBC_VERSION; uname -m` -> {"libc": "glibc", "version": [2, 36], "machine": "x86_64"}."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    m = re.fullmatch(r"glibc (\d+)\.(\d+)(?:\.\d+)?", lines[0]) if lines else None
    machine = lines[-1] if len(lines) >= 2 and re.fullmatch(r"[\w-]+", lines[-1]) else None
    if not m:  # musl (Alpine) has no GNU_LIBC_VERSION: manylinux wheels do not install there
        return {
            "libc": None,
            "version": None,
            "machine": machine,
            "error": f"no glibc: {first_line(stdout)[:200] or f'exit {rc}'}",
        }
    return {"libc": "glibc", "version": [int(m.group(1)), int(m.group(2))], "machine": machine, "error": None}


def platform_fact() -> Fact:
    return Fact("platform", COMMAND, parse_platform)


def wheel_platform_problem(fact: dict | None, platform_line: str) -> str | None:
    """Why this host cannot install wheels for a lock's `# platform:` line (`cp311 manylinux_2_35
    x86_64`), or None. An older lock's `manylinux x86_64` names no glibc: only the machine is compared."""
    if not isinstance(fact, dict):
        return "platform not measured"
    words = platform_line.split()
    arch = words[-1] if words else None
    ml = next((re.fullmatch(r"manylinux_(\d+)_(\d+)", w) for w in words if w.startswith("manylinux_")), None)
    if ml and fact.get("error"):
        return f"the lock's wheels are {ml.group(0)} (glibc {ml.group(1)}.{ml.group(2)}+): {fact['error']}"
    if ml and fact.get("version") and tuple(fact["version"]) < (int(ml.group(1)), int(ml.group(2))):
        have = ".".join(map(str, fact["version"]))
        return f"the lock's wheels are {ml.group(0)} (glibc {ml.group(1)}.{ml.group(2)}+), this host has glibc {have}"
    if arch and fact.get("machine") and fact["machine"] != arch:
        return f"the lock's wheels are for {arch}, this host is {fact['machine']}"
    return None
