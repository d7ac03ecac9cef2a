"""Baseline files checked on read (issue 35.5): a baselines repository is a git
repository anyone can edit, merge or break. One corrupt file must give one line
naming the tag and the file (exit 2) for the command that needs that tag, never
a traceback, and must never pass as data: a NaN median once let the canary gate
pass a 44%-slower engine. Pure functions over the file's bytes.
"""

from __future__ import annotations

import json
import math

from k26ops.errors import UserError


class BaselineCorrupt(UserError):
    """A baseline file that cannot be trusted: the message names the tag and the file."""


def _fail(tag: str, path: str, why: str):
    raise BaselineCorrupt(f"baseline {tag!r}: {path}: {why}")


def _parse(data: bytes, tag: str, path: str, numbers_only: bool = False) -> dict:
    """The JSON object in `data`; numbers_only: NaN/Infinity (Python writes them, JSON has none) refused."""
    constant = (lambda c: _fail(tag, path, f"{c} is not a number")) if numbers_only else None
    try:
        doc = json.loads(data, parse_constant=constant)
    except UnicodeDecodeError:
        _fail(tag, path, "not UTF-8 text")
    except json.JSONDecodeError as exc:
        _fail(tag, path, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
    except RecursionError:
        _fail(tag, path, "invalid JSON: nested too deeply")
    if not isinstance(doc, dict):
        _fail(tag, path, f"expected a JSON object, found {type(doc).__name__}")
    return doc


def _check(ok: bool, tag: str, path: str, why: str) -> None:
    if not ok:
        _fail(tag, path, why)


def _str_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def index(data: bytes, tag: str) -> dict:
    """baseline.json of a tag: {"hosts": {name: {...}}, ...}."""
    path = "baseline.json"
    doc = _parse(data, tag, path)
    hosts = doc.get("hosts", {})
    _check(
        isinstance(hosts, dict) and all(isinstance(h, str) and isinstance(v, dict) for h, v in hosts.items()),
        tag,
        path,
        "`hosts` is not a mapping of host name to record",
    )
    for h, v in hosts.items():  # what `baselines delete`/`repin` keep pinned
        _check(
            isinstance(v.get("release_id"), str) and v["release_id"] != "",
            tag,
            path,
            f"host {h}: `release_id` is missing or not a string",
        )
    return doc


def host_record(data: bytes, tag: str, path: str) -> dict:
    """hosts/<host>/baseline.json: what rollback and drift compare."""
    rec = _parse(data, tag, path)
    _check(
        isinstance(rec.get("release_id"), str) and rec["release_id"].strip() != "",
        tag,
        path,
        "`release_id` is missing or not a string",
    )
    _check(_str_map(rec.get("patched_files")), tag, path, "`patched_files` is not a mapping of path to hash")
    for key, fields in (("unit", ("name", "file", "path")), ("env", ("file", "path"))):
        part = rec.get(key)
        _check(
            isinstance(part, dict) and all(isinstance(part.get(f), str) and part[f] for f in fields),
            tag,
            path,
            f"`{key}` lacks {', '.join(fields)}",
        )
    for key in ("shipped_series", "cmdline", "engine_argv"):
        v = rec.get(key)
        _check(
            v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
            tag,
            path,
            f"`{key}` is not a list of strings",
        )
    patches = rec.get("patches")
    _check(
        patches is None
        or (isinstance(patches, list) and all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in patches)),
        tag,
        path,
        "`patches` is not a list of named patches",
    )
    _check(rec.get("engine") is None or isinstance(rec["engine"], dict), tag, path, "`engine` is not a mapping")
    return rec


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def bench(data: bytes, tag: str, path: str) -> dict:
    """hosts/<host>/bench.json: every figure a finite number (what the gate and
    `bench --compare` read), each cell with its concurrency and temperature."""
    b = _parse(data, tag, path, numbers_only=True)
    _check(isinstance(b.get("spec"), dict), tag, path, "`spec` (the bench settings) is missing")
    cells = b.get("cells")
    _check(isinstance(cells, list) and cells != [], tag, path, "`cells` is missing or empty")
    for i, cell in enumerate(cells, 1):
        _check(
            isinstance(cell, dict)
            and isinstance(cell.get("concurrency"), int)
            and not isinstance(cell.get("concurrency"), bool)
            and _finite(cell.get("temperature")),
            tag,
            path,
            f"cell {i}: no concurrency or temperature",
        )
        figs = cell.get("figures")
        _check(isinstance(figs, dict), tag, path, f"cell {i}: `figures` is not a mapping")
        for name, stat in figs.items():
            where = f"figure {name}@c{cell['concurrency']}/t{cell['temperature']:g}"
            _check(isinstance(stat, dict), tag, path, f"{where}: not a mapping")
            for k in ("median", "min", "max"):
                _check(
                    _finite(stat.get(k)) and stat[k] >= 0,
                    tag,
                    path,
                    f"{where}: {k} is {stat.get(k)!r}, not a finite number >= 0",
                )
    return b
