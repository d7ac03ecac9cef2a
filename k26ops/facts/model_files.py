"""The model files fact: every file under the model path with its size, mtime, ctime and
inode (no byte read), and the host's record of its last verify.

Why: `check` and a deploy's preflight compare it with the recipe's model manifest
(k26ops/weights/manifest.py `compare`): a missing, truncated or extra shard is refused
before anything changes, in the same one fact-gathering call as the other facts. A file
whose (size, mtime, ctime, inode) differ from the record was changed since its last
sha256 check: a deploy refuses it until `k26ops model verify --full` hashed it again.
"""

from __future__ import annotations

import json
import shlex

from k26ops.facts.base import Fact, first_line, safe
from k26ops.weights.manifest import PARTIAL_DIR, Stat

_MARK = "== k26ops-model-files "
MAX_FILES = 20000


def model_files_command(path: str, record: str) -> str:
    p, r = shlex.quote(str(path)), shlex.quote(str(record))
    return (
        f'if [ -d {p} ]; then echo "{_MARK}dir"; cd {p} && '
        f"find . -path ./{PARTIAL_DIR} -prune -o -type f -print0 | head -zn {MAX_FILES} | "
        "xargs -0r stat -c '%s %.9Y %.9Z %i %n'; "
        f'echo "{_MARK}record"; cat {r} 2>/dev/null; '
        f'elif [ -e {p} ]; then echo "{_MARK}notdir"; else echo "{_MARK}missing"; fi'
    )


@safe
def parse_model_files(stdout: str, rc: int) -> dict:
    """{"state": dir|notdir|missing, "files": {path: Stat}, "record": dict or None, "error"}."""
    head, _, rest = stdout.partition("\n")
    if not head.startswith(_MARK):
        return {
            "state": None,
            "files": {},
            "record": None,
            "error": first_line(stdout)[:200] or f"no output (exit {rc})",
        }
    state = head[len(_MARK) :].strip()
    if state != "dir":
        return {
            "state": state,
            "files": {},
            "record": None,
            "error": {"notdir": "is not a directory", "missing": "does not exist"}.get(state, state),
        }
    listing, _, record_text = rest.partition(_MARK + "record\n")
    files = {}
    for line in listing.splitlines():
        size, mtime, ctime, ino, name = line.split(" ", 4)
        files[name[2:] if name.startswith("./") else name] = Stat(int(size), mtime, ctime, int(ino))
    try:
        record = json.loads(record_text) if record_text.strip() else None
    except ValueError:
        record = None  # a torn record vouches for nothing: every file counts as changed
    return {"state": "dir", "files": files, "record": record if isinstance(record, dict) else None, "error": None}


def model_files_fact(path: str, record: str) -> Fact:
    return Fact("model_files", model_files_command(path, record), parse_model_files, timeout=60.0)
