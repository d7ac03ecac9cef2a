"""What k26ops may delete: only what it made.

Why: `releases_root` or `k26ops_root` pointed at a shared directory (say
/srv/data, beside the model weights) must never lose an entry k26ops did not
create. So a directory k26ops keeps releases in is k26ops's own only when it
carries the marker `.k26ops-owned`, written when k26ops first uses it, and
only if it was empty then or held nothing but what k26ops makes. A release
directory is k26ops's when it carries `.k26ops-release` (written first, by the
build) or a manifest.json naming it. Prune removes nothing else, and says what
it will remove in `--check` and in the report.
"""

from __future__ import annotations

import json

from k26ops.ssh import q

MARKER = ".k26ops-owned"
RELEASE_MARKER = ".k26ops-release"
# What k26ops itself makes under k26ops_root (a directory holding only these is ours).
ROOT_ENTRIES = {"state", "releases", "wheelhouse", "toolchain", "lab", MARKER}

# Runs on the host with its python3: argv = dir, kind (root|releases) [, names to delete].
_SCRIPT = r'''
import json, os, shutil, sys
d, kind, op = sys.argv[1], sys.argv[2], sys.argv[3]
M, R = %(marker)r, %(release)r
ROOT = set(%(root_entries)r)
def is_release(name):
    p = os.path.join(d, name)
    if os.path.islink(p) or not os.path.isdir(p):
        return False
    if os.path.exists(os.path.join(p, R)):
        return True
    try:
        with open(os.path.join(p, "manifest.json")) as fh:
            return json.load(fh).get("release_id") == name
    except (OSError, ValueError, AttributeError):
        return False
def state():
    if not os.path.exists(d):
        return {"state": "absent"}
    if not os.path.isdir(d):
        return {"state": "notdir"}
    names = sorted(os.listdir(d))
    if M in names:
        return {"state": "owned"}
    if kind == "root":
        foreign = [n for n in names if n not in ROOT]
    else:
        foreign = [n for n in names if n not in ("current", ".current.tmp") and not is_release(n)]
    return {"state": "foreign" if foreign else ("empty" if not names else "ours"), "foreign": foreign[:5],
            "count": len(foreign)}
if op == "state":
    print(json.dumps(state()))
elif op == "releases":
    rels = [n for n in os.listdir(d) if not n.startswith(".") and is_release(n)] if os.path.isdir(d) else []
    rels.sort(key=lambda n: os.stat(os.path.join(d, n)).st_mtime, reverse=True)
    print(json.dumps(rels))
elif op == "delete":
    gone = []
    for name in sys.argv[4:]:
        if "/" not in name and not name.startswith(".") and is_release(name):
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)
            gone.append(name)
    print(json.dumps(gone))
''' % {"marker": MARKER, "release": RELEASE_MARKER, "root_entries": sorted(ROOT_ENTRIES)}


def _call(session, d: str, kind: str, op: str, *names: str, check: bool = True):
    cmd = f"python3 -c {q(_SCRIPT)} {q(d)} {q(kind)} {q(op)}" + "".join(" " + q(n) for n in names)
    res = session.run(cmd, check=check)
    lines = res.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def refusal(d: str, kind: str, st: dict) -> str | None:
    """One line when `d` is not k26ops's to write into; None when it is (or can be)."""
    what = {"root": "k26ops_root", "releases": "releases_root"}[kind]
    if st["state"] == "notdir":
        return f"{what} {d} is not a directory"
    if st["state"] == "foreign":
        shown = ", ".join(st["foreign"]) + (" ..." if st["count"] > len(st["foreign"]) else "")
        return (f"{what} {d} holds {st['count']} entr{'y' if st['count'] == 1 else 'ies'} k26ops did not make "
                f"({shown}): choose an empty directory or one k26ops owns (k26ops deletes old releases there)")
    return None


def state(session, d: str, kind: str) -> dict:
    return _call(session, d, kind, "state")


def claim(session, d: str) -> None:
    """Mark `d` as k26ops's own (after `state` said empty, ours or absent)."""
    session.run(f"mkdir -p {q(d)} && printf '%s\\n' 'made and owned by k26ops: old releases here are deleted' "
                f"> {q(d + '/' + MARKER)}", check=True)


def releases(session, d: str) -> list[str]:
    """k26ops's release directories under `d`, newest first."""
    return _call(session, d, "releases", "releases") or []


def delete(session, d: str, names: list[str]) -> list[str]:
    """Delete those of `names` that are k26ops releases (checked again on the host)."""
    return _call(session, d, "releases", "delete", *names) if names else []


def prune_plan(existing: list[str], new: str, keep: int, pinned: set[str]) -> list[str]:
    """Releases to delete once `new` is current: beyond the newest `keep` (new counts,
    it is the newest), never `new`, never a pinned one."""
    order = [new] + [r for r in existing if r != new]
    return [r for r in order[keep:] if r != new and r not in pinned]
