"""YAML that remembers where things are.

Validation must name the file and line of a bad key, so mappings and lists
carry the line of each key/item. `!vault` (and `!unsafe`) load without error:
k26ops never decrypts or templates, it keeps what was written. Duplicate
mapping keys are refused (YAML itself silently keeps the last one).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from k26ops.errors import UserError


def oneline(text: str) -> str:
    """Escape anything that would break a one-line message (newlines, controls)."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(text))


def show(value, limit: int = 60) -> str:
    """A value as it appears in an error message: quoted, escaped, bounded."""
    text = repr(value) if not isinstance(value, Vault) else "<vault>"
    return text if len(text) <= limit else text[: limit - 4] + "...'"


class Vault:
    """An `!vault` encrypted value: opaque, shown as `<vault>`."""

    def __init__(self, ciphertext: str):
        self.ciphertext = ciphertext

    def __repr__(self) -> str:
        return "<vault>"

    def __eq__(self, other) -> bool:
        return isinstance(other, Vault) and other.ciphertext == self.ciphertext

    def __hash__(self) -> int:
        return hash(self.ciphertext)


def is_jinja(value) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class Map(dict):
    """A mapping with `line` (its own) and `key_lines` (key -> line)."""

    line: int | None = None

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.key_lines: dict = {}

    def line_of(self, key) -> int | None:
        return self.key_lines.get(key, self.line)


class Seq(list):
    """A list with `line` and `item_lines`."""

    line: int | None = None

    def __init__(self, *a):
        super().__init__(*a)
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int | None:
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


def line_of(container, key) -> int | None:
    if isinstance(container, (Map, Seq)):
        return container.line_of(key)
    return None


# Bounded input: a hostile or broken file must fail fast, not eat the control node.
MAX_BYTES = 10 * 1024 * 1024  # a 10,000-host inventory is about 1 MB
MAX_EXPANDED_NODES = 2_000_000  # nodes after expanding every *alias (a 10,000-host file: ~100k)


def expanded_size(root) -> int:
    """Nodes the document has once every alias is expanded (memoised per node, so
    an alias bomb is measured in time linear in its size, without expanding it)."""
    memo: dict[int, int] = {}

    def size(node) -> int:
        key = id(node)
        if key in memo:
            return memo[key]
        memo[key] = 1  # a recursive alias counts once
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(v) for v in node.value)
        else:
            n = 1
        memo[key] = n
        return n

    return size(root)


def _check_size(node):
    if node is not None and expanded_size(node) > MAX_EXPANDED_NODES:
        raise yaml.composer.ComposerError(
            None,
            None,
            f"more than {MAX_EXPANDED_NODES:,} values once its aliases (*name) are expanded: refused (an alias bomb?)",
            node.start_mark,
        )
    return node


class _Loader(yaml.SafeLoader):
    """The pure-Python parser: its error messages name the problem well, so a
    file libyaml refuses is read again with it for the message."""

    def compose_document(self):
        return _check_size(super().compose_document())


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's parser (when PyYAML has it), same constructors: a 10 MB,
    200,000-host file parses in seconds instead of minutes."""

    def get_single_node(self):
        return _check_size(super().get_single_node())


def _construct_map(loader: _Loader, node: yaml.MappingNode):
    data = Map()
    data.line = node.start_mark.line + 1
    yield data
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value, not a list or mapping", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {show(key)} (first at line {seen[key]})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        data[key] = loader.construct_object(value_node, deep=False)
        data.key_lines[key] = key_node.start_mark.line + 1


def _construct_seq(loader: _Loader, node: yaml.SequenceNode):
    data = Seq()
    data.line = node.start_mark.line + 1
    yield data
    for child in node.value:
        data.append(loader.construct_object(child, deep=False))
        data.item_lines.append(child.start_mark.line + 1)


def _construct_vault(loader: _Loader, node):
    return Vault(loader.construct_scalar(node))


def _construct_unsafe(loader: _Loader, node):
    return loader.construct_scalar(node)


for _cls in (_Loader, _FastLoader):
    _cls.add_constructor("tag:yaml.org,2002:map", _construct_map)
    _cls.add_constructor("tag:yaml.org,2002:seq", _construct_seq)
    _cls.add_constructor("!vault", _construct_vault)
    _cls.add_constructor("!vault-encrypted", _construct_vault)
    _cls.add_constructor("!unsafe", _construct_unsafe)


def read(path: Path):
    """Load one inventory file; every failure is a one-line UserError."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise UserError(oneline(f"{path}: inventory is {size:,} bytes, over the {MAX_BYTES:,}-byte limit: refused"))
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UserError(oneline(f"{path}: cannot read inventory: {exc.strerror or exc}")) from None
    if len(raw) > MAX_BYTES:  # a pipe or a file that grew
        raise UserError(oneline(f"{path}: inventory is over the {MAX_BYTES:,}-byte limit: refused"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(oneline(f"{path}: inventory is not UTF-8 text (byte {exc.start})")) from None
    try:
        data = _parse(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else f"{path}"
        what = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and "duplicate" not in exc.problem:
            what = f"{exc.problem} ({exc.context})"
        raise UserError(oneline(f"{where}: YAML error: {what}")) from None
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid YAML"
        raise UserError(oneline(f"{path}: YAML error: {first}")) from None
    except RecursionError:
        raise UserError(oneline(f"{path}: YAML error: nested too deeply")) from None
    if data is None:
        raise UserError(oneline(f"{path}: inventory is empty"))
    if not isinstance(data, dict):
        raise UserError(
            oneline(
                f"{path}:{line_of(data, 0) or 1}: inventory must be a mapping at the top level, got {type_name(data)}"
            )
        )
    if not data:
        raise UserError(oneline(f"{path}: inventory is empty"))
    return data


def _parse(text: str):
    """libyaml first; anything it refuses is parsed again by the Python parser,
    whose error (or result: the two differ on a few edge cases) is the one kept."""
    try:
        return yaml.load(text, Loader=_FastLoader)  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, RecursionError):
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader


def type_name(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, Vault):
        return "a !vault value"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(next((t for t in (dict, list, str, bool, int, float) if isinstance(value, t)), None), type(value).__name__)
