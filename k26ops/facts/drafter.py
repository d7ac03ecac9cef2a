"""The drafter fact: is the speculative drafter where the engine will look, and
what block size does its config say?

Why: DFlash/DDTree reads its verify window (block size) from the drafter's
config.json when no flag sets it, and a drafter of another block size than the
profile's makes the engine refuse to start (or verify the wrong width). Checked
before a deploy, not discovered in a restart loop.
"""

from __future__ import annotations

import json
import shlex

from k26ops.facts.base import Fact, first_line, safe

_MARK = "== k26ops-drafter "


def drafter_command(path: str) -> str:
    p = shlex.quote(str(path))
    return (
        f'if [ -r {p}/config.json ]; then echo "{_MARK}config"; head -c 1000000 {p}/config.json; '
        f'elif [ -d {p} ]; then echo "{_MARK}noconfig"; ls -1 {p} 2>&1 | head -5; '
        f'elif [ -e {p} ]; then echo "{_MARK}notdir"; else echo "{_MARK}missing"; fi'
    )


def block_size_of(config: dict) -> int | None:
    """As sglang's parse_dflash_draft_config reads it: dflash_config.block_size, else top-level block_size."""
    dcfg = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    raw = dcfg.get("block_size", config.get("block_size"))
    return int(raw) if isinstance(raw, (int, str)) and str(raw).isdigit() else None


@safe
def parse_drafter(stdout: str, rc: int) -> dict:
    """{"state": config|noconfig|notdir|missing, "block_size", "architectures", "error"}."""
    head, _, rest = stdout.partition("\n")
    if not head.startswith(_MARK):
        return {"state": None, "error": first_line(stdout)[:200] or f"no output (exit {rc})"}
    state = head[len(_MARK) :].strip()
    if state != "config":
        why = {
            "noconfig": "has no readable config.json",
            "notdir": "is not a directory",
            "missing": "does not exist",
        }.get(state, state)
        return {"state": state, "block_size": None, "error": why}
    try:
        cfg = json.loads(rest)
    except ValueError as exc:
        return {"state": "badconfig", "block_size": None, "error": f"config.json is not JSON ({exc})"}
    if not isinstance(cfg, dict):
        return {"state": "badconfig", "block_size": None, "error": "config.json is not a JSON object"}
    return {
        "state": "config",
        "block_size": block_size_of(cfg),
        "architectures": cfg.get("architectures"),
        "error": None,
    }


def drafter_fact(path: str) -> Fact:
    return Fact("drafter", drafter_command(path), parse_drafter, own="drafter", own_args=(str(path), _MARK))
