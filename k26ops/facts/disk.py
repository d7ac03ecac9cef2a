"""Free-disk fact at given directories (`df -P -B1`).

Why: the model (about 590 GB) and releases must fit before anything is
downloaded. A directory that does not exist yet is measured at its nearest
existing parent, which is where it will be created.
"""

from __future__ import annotations

import shlex

from k26ops.facts.base import Fact, first_line, safe

DEFAULT_PATHS = ("/",)


def disk_command(paths) -> str:
    """One '== <asked>\\t<measured>' marker line plus `df -P -B1` output per path."""
    quoted = " ".join(shlex.quote(str(p)) for p in paths)
    return (
        "for p in " + quoted + '; do d="$p"; '
        'while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); done; '
        'printf "== %s\\t%s\\n" "$p" "$d"; df -P -B1 -- "$d" 2>&1; done'
    )


def _parse_df_table(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[0] == "Filesystem" or not parts[1].isdigit():
            continue
        rows.append(
            {
                "filesystem": parts[0],
                "size": int(parts[1]),
                "used": int(parts[2]),
                "available": int(parts[3]),
                "capacity": parts[4],
                "mounted_on": parts[5],
            }
        )
    return rows


@safe
def parse_disk_free(stdout: str, rc: int) -> dict:
    """{asked_path: {"path", "available", "size", "used", "mounted_on", ...} | {"error"}}.

    Plain `df -P -B1 a b` output (no markers) gives {mount_point: row}.
    """
    if "== " not in stdout:
        rows = _parse_df_table(stdout)
        if not rows:
            return {"error": "no df output: " + (first_line(stdout)[:200] or f"exit {rc}")}
        return {r["mounted_on"]: {**r, "path": r["mounted_on"], "error": None} for r in rows}
    out = {}
    for block in stdout.split("== ")[1:]:
        head, _, rest = block.partition("\n")
        asked, _, measured = head.partition("\t")
        rows = _parse_df_table(rest)
        out[asked] = (
            {**rows[0], "path": measured or asked, "error": None}
            if rows
            else {"path": measured or asked, "error": first_line(rest)[:200] or "no df output"}
        )
    return out


def disk_free_fact(paths=DEFAULT_PATHS) -> Fact:
    """The disk_free fact for these directories (model dir, releases root...)."""
    return Fact("disk_free", disk_command(paths), parse_disk_free)


FACTS = {"disk_free": disk_free_fact()}
