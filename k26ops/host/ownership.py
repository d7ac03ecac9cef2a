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

from k26ops.shell import q
from k26ops.transport import agents

MARKER = ".k26ops-owned"
RELEASE_MARKER = ".k26ops-release"
# What k26ops itself makes under k26ops_root (a directory holding only these is ours).
ROOT_ENTRIES = {
    "state",
    "releases",
    "wheelhouse",
    "toolchain",
    "lab",
    "store",
    "tools",
    "engine-cache",
    "gateway",
    MARKER,
}


def _call(session, d: str | None, kind: str | None, op: str, *names: str, **req):
    """One operation of agents/ownership.py on the host (the markers travel with the request)."""
    return agents.run(
        session,
        "ownership",
        op,
        what="ownership agent",
        dir=d,
        kind=kind,
        names=list(names),
        marker=MARKER,
        release_marker=RELEASE_MARKER,
        root_entries=sorted(ROOT_ENTRIES),
        **req,
    )


def refusal(d: str, kind: str, st: dict) -> str | None:
    """One line when `d` is not k26ops's to write into; None when it is (or can be)."""
    what = {"root": "k26ops_root", "releases": "releases_root"}[kind]
    if st["state"] == "notdir":
        return f"{what} {d} is not a directory"
    if st["state"] == "foreign":
        shown = ", ".join(st["foreign"]) + (" ..." if st["count"] > len(st["foreign"]) else "")
        return (
            f"{what} {d} holds {st['count']} entr{'y' if st['count'] == 1 else 'ies'} k26ops did not make "
            f"({shown}): choose an empty directory or one k26ops owns (k26ops deletes old releases there)"
        )
    return None


def state(session, d: str, kind: str) -> dict:
    return _call(session, d, kind, "state")


def states(session, dirs: list[tuple[str, str]]) -> list[dict]:
    """`state` of each (dir, kind), in one remote call."""
    return _call(session, None, None, "states", dirs=[list(x) for x in dirs])


def claim(session, d: str) -> None:
    """Mark `d` as k26ops's own (after `state` said empty, ours or absent)."""
    session.run(
        f"mkdir -p {q(d)} && printf '%s\\n' 'made and owned by k26ops: old releases here are deleted' "
        f"> {q(d + '/' + MARKER)}",
        check=True,
    )


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
