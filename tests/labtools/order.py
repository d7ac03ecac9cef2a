"""The order xdist hands files out in (conftest.py, `make test`): the longest files first."""

from __future__ import annotations

LAB_FILE_GUESS = 60.0  # seconds assumed for a lab file with no record (most take 30 s to 5 min)


def file_order(nodeids: list[str], lab: set[str], seconds: dict[str, float]) -> list[int]:
    """The tests' indexes in run order: the files that took longest last time (`seconds`,
    per file) first, a lab file with no record counted as LAB_FILE_GUESS (so a fresh
    checkout starts with the lab files) and any other as 0. The quick files then fill the
    workers' last minutes, instead of one worker starting a 5-minute lab file while the
    other has run out of work. A file's tests keep their order; ties keep collection order."""
    paths = [n.split("::")[0] for n in nodeids]
    first = {}
    for i, path in enumerate(paths):
        first.setdefault(path, i)

    def key(i):
        path = paths[i]
        return (-seconds.get(path, LAB_FILE_GUESS if path in lab else 0.0), path not in lab, first[path])

    return sorted(range(len(paths)), key=key)  # stable: a file's tests stay in order


def whole_file_seconds(run: dict[str, float], args: list[str], selected: bool) -> dict[str, float]:
    """What a run may keep for file_order: each file's seconds, for whole files only. Nothing
    after a -k or -m selection (`selected`: parts of files ran), and no file named as
    FILE::TEST on the command line."""
    if selected:
        return {}
    parts = {arg.split("::")[0] for arg in args if "::" in arg}
    return {
        path: round(sec, 1)
        for path, sec in run.items()
        if not any(path == p or p.endswith("/" + path) or path.endswith(p) for p in parts)
    }
