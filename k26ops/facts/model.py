"""The model fact: is the model the engine will load where the unit points, with
its config.json and its weights?

Why: a `model_path` that does not exist (or holds half a download) passes every
other check, is rendered into the unit and restarted; on a TP8 host that is a
ten-minute load that fails, then a ten-minute rollback. Read in the deploy's one
fact-gathering call, so a deploy refuses it before it touches the host.

The weights are checked without reading them: the safetensors files named
`NAME-00001-of-00064.safetensors` (as Hugging Face shards them) must all be there,
and a sharded model needs its `model.safetensors.index.json`. The index itself is
not read (several MB for a 1T model); the shard names say how many there are.
"""

from __future__ import annotations

import json
import re
import shlex

from k26ops.facts.base import Fact, first_line, safe

_MARK = "== k26ops-model "
INDEX = "model.safetensors.index.json"
SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d+)-of-(?P<n>\d+)\.safetensors$")
MAX_FILES = 5000


def model_command(path: str) -> str:
    """The state of `path`, its config.json (first MB) and its weight file names."""
    p = shlex.quote(str(path))
    return (
        f'if [ -d {p} ]; then echo "{_MARK}dir"; '
        f'if [ -r {p}/config.json ]; then echo "{_MARK}config"; head -c 1000000 {p}/config.json; echo; fi; '
        f'echo "{_MARK}files"; ls -1 {p} 2>&1 | grep -E "\\.safetensors(\\.index\\.json)?$" | head -{MAX_FILES}; '
        f'elif [ -e {p} ]; then echo "{_MARK}notdir"; else echo "{_MARK}missing"; fi'
    )


def weights_problem(files: list[str]) -> tuple[str | None, int]:
    """(what is wrong with the weight files or None, how many safetensors files there are)."""
    shards = [f for f in files if f.endswith(".safetensors")]
    if not shards:
        return (f"has no weights (no *.safetensors{', only ' + INDEX if INDEX in files else ''})", 0)
    sets: dict[tuple[str, str], set[int]] = {}  # (stem, "00064" as written) -> shard numbers present
    for f in shards:
        m = SHARD.match(f)
        if m:
            sets.setdefault((m["stem"], m["n"]), set()).add(int(m["i"]))
    for (stem, n), have in sorted(sets.items()):
        gone = [i for i in range(1, int(n) + 1) if i not in have]
        if gone:
            names = ", ".join(f"{stem}-{i:0{len(n)}d}-of-{n}.safetensors" for i in gone[:3])
            more = f" and {len(gone) - 3} more" if len(gone) > 3 else ""
            return f"is missing {len(gone)} of {int(n)} weight shards ({names}{more})", len(shards)
    if sets and INDEX not in files and len(shards) > 1:
        return f"has {len(shards)} weight shards but no {INDEX}", len(shards)
    return None, len(shards)


@safe
def parse_model(stdout: str, rc: int) -> dict:
    """{"state": dir|notdir|missing, "config": bool, "architectures", "model_type",
    "shards": n, "index": bool, "error": one phrase or None}."""
    head, _, rest = stdout.partition("\n")
    if not head.startswith(_MARK):
        return {"state": None, "error": first_line(stdout)[:200] or f"no output (exit {rc})"}
    state = head[len(_MARK) :].strip()
    if state != "dir":
        return {
            "state": state,
            "error": {"notdir": "is not a directory", "missing": "does not exist"}.get(state, state),
        }
    config_text, files_text = None, rest
    if rest.startswith(_MARK + "config\n"):
        config_text, _, files_text = rest[len(_MARK + "config\n") :].rpartition("\n" + _MARK + "files\n")
    else:
        files_text = rest.partition(_MARK + "files\n")[2]
    files = [line.strip() for line in files_text.splitlines() if line.strip()]
    out = {
        "state": "dir",
        "config": False,
        "architectures": None,
        "model_type": None,
        "shards": 0,
        "index": INDEX in files,
        "error": None,
    }
    if config_text is None:
        out["error"] = "has no readable config.json"
        return out
    try:
        cfg = json.loads(config_text)
    except ValueError as exc:
        out["error"] = f"config.json is not JSON ({exc})"
        return out
    if not isinstance(cfg, dict):
        out["error"] = "config.json is not a JSON object"
        return out
    out.update(config=True, architectures=cfg.get("architectures"), model_type=cfg.get("model_type"))
    out["error"], out["shards"] = weights_problem(files)
    return out


def model_fact(path: str) -> Fact:
    return Fact("model", model_command(path), parse_model, own="model", own_args=(str(path), _MARK, MAX_FILES))
