"""The operator's defaults: ~/.config/k26ops/config.toml (or $K26OPS_CONFIG).

    inventory = "~/fleet/inventory.yml"   # default --inventory
    baselines = "~/fleet/baselines"       # baselines repository (a git repo)
    recipes = "~/fleet/recipes"           # your recipes and locks: a recipe NAME is looked for here first
    forks = 32                            # default --forks
    deadline = 7200                       # default --deadline, seconds
    connect_timeout = 15                  # default --connect-timeout, seconds
    targets = "gpu"                       # host pattern commands act on (a playbook's hosts:)
    batch = "1"                           # default --batch of deploy and rollback (N, P% or 1,2,25%)

Precedence: command-line flag > environment variable (K26OPS_INVENTORY,
K26OPS_BASELINES, K26OPS_RECIPES) > this file > built-in default. Paths may start with ~;
relative ones are relative to the file's own directory, never the current
one, so cron and another shell find the same baselines.
`k26ops config show` prints the effective settings and where each came from.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import UserError


@dataclass(frozen=True)
class Key:
    name: str
    kind: type
    low: float | None = None
    high: float | None = None


KEYS = {
    k.name: k
    for k in (
        Key("inventory", Path),
        Key("baselines", Path),
        Key("recipes", Path),
        Key("forks", int, 1, 512),
        Key("deadline", float, 1),
        Key("connect_timeout", float, 0.1),
        Key("targets", str),
        Key("batch", str),
    )
}


def config_path() -> Path:
    """$K26OPS_CONFIG, else $XDG_CONFIG_HOME/k26ops/config.toml (~/.config by default)."""
    if os.environ.get("K26OPS_CONFIG"):
        return Path(os.environ["K26OPS_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "k26ops" / "config.toml"


def default_baselines() -> Path:
    """Where baselines live when nothing says otherwise: a fixed place, not the current directory."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")
    return Path(base) / "k26ops" / "baselines"


BYPASS = "; to run without the file: K26OPS_CONFIG=/dev/null k26ops ..."


def load(path: Path | None = None) -> dict:
    """The file's settings ({} when there is none); any problem is one line naming
    the file and line (`PATH:LINE: ...`) and how to run without it, exit 2 (a broken file
    stops every command, `config show` and `lab status` too)."""
    try:
        return _load(path)
    except UserError as exc:
        raise UserError(f"{exc}{BYPASS}") from None


def _load(path: Path | None) -> dict:
    path = path or config_path()
    explicit = bool(os.environ.get("K26OPS_CONFIG"))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise UserError(f"K26OPS_CONFIG: no such file: {path}") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    # lazy: tomllib (4 ms of every start) only when there is a file to read; most runs have none
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)|\(at end of document\)", str(exc))
        line = at.group(1) if at and at.group(1) else str(max(1, len(text.splitlines()))) if at else ""
        raise UserError(f"{path}:{line}: not valid TOML: {exc}" if line else f"{path}: not valid TOML: {exc}") from None
    out = {}
    for name, value in data.items():
        key = KEYS.get(name)
        where = f"{path}:{_line(text, name)}"
        if key is None:
            near = difflib.get_close_matches(name, KEYS, n=1)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(KEYS)}"
            raise UserError(f"{where}: unknown setting {name!r} ({hint})")
        out[name] = _value(where, path, key, value)
    return out


def _line(text: str, name: str) -> int:
    """The line that sets top-level `name` (the first `name =` or `[name]`); 1 if not found."""
    pat = re.compile(
        rf"""\s*(?:{re.escape(name)}|"{re.escape(name)}"|'{re.escape(name)}')\s*=|\s*\[+\s*{re.escape(name)}\b"""
    )
    return next((i for i, ln in enumerate(text.splitlines(), 1) if pat.match(ln)), 1)


def _value(where: str, path: Path, key: Key, value):
    where = f"{where}: {key.name}"
    if key.name == "batch" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # batch = 1: a count (the CLI parses it as --batch does)
    if key.kind is str:
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{where} must be a non-empty string (a host pattern), got {value!r}")
        return value.strip()
    if key.kind is Path:
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{where} must be a path string, got {value!r}")
        p = Path(value).expanduser()
        return p if p.is_absolute() else (path.parent / p)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (key.kind is int and not isinstance(value, int))
    ):
        raise UserError(f"{where} must be {'an integer' if key.kind is int else 'a number'}, got {value!r}")
    if (
        not math.isfinite(value)
        or (key.low is not None and value < key.low)
        or (key.high is not None and value > key.high)
    ):
        bounds = f"{key.low}..{key.high}" if key.high is not None else f">= {key.low}"
        raise UserError(f"{where} must be {bounds}, got {value!r}")
    return key.kind(value)


def baselines_dir() -> tuple[Path, str]:
    """The baselines repository and where that came from."""
    if os.environ.get("K26OPS_BASELINES"):
        return Path(os.environ["K26OPS_BASELINES"]).expanduser(), "env K26OPS_BASELINES"
    conf = load()
    if "baselines" in conf:
        return conf["baselines"], f"config {config_path()}"
    return default_baselines(), "default"


def recipes_dir() -> tuple[Path, str]:
    """The operator's recipes and locks (a recipe NAME is looked for here before the shipped
    ones; `engine lock` of a shipped recipe writes here) and where that came from."""
    if os.environ.get("K26OPS_RECIPES"):
        return Path(os.environ["K26OPS_RECIPES"]).expanduser(), "env K26OPS_RECIPES"
    conf = load()
    if "recipes" in conf:
        return conf["recipes"], f"config {config_path()}"
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "k26ops" / "recipes", "default"
