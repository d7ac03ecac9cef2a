"""Where an Ansible inventory's parts live, found as ansible-inventory finds them.

An operator's inventory is rarely one file: it is a directory (`hosts.yml`,
maybe an INI file, `group_vars/`, `host_vars/`), or a `hosts.yml` with those
directories beside it. Reading only the file silently drops every value kept in
`group_vars/` (addresses, become, model paths), so k26ops reads all of it, with
ansible-core's rules (inventory/manager.py parse_source, vars/host_group_vars.py,
parsing/dataloader.py find_vars_files, plugins/inventory/ini.py):

- a directory inventory: every file in it, sorted, recursively, except hidden
  ones, `group_vars`/`host_vars` and the extensions Ansible ignores; `.yml`,
  `.yaml`, `.json` and extension-less files are YAML (an extension-less one
  that is not YAML is INI, as Ansible falls back), anything else INI;
- `group_vars/NAME` (a directory, read recursively in name order, or the first
  of NAME, NAME.yml, NAME.yaml, NAME.json), and `host_vars/NAME` the same, in
  the inventory directory or beside the inventory file, only for groups and
  hosts the inventory defines.

Nothing here decrypts: a vars file encrypted whole with ansible-vault is
refused in one line naming it (its keys cannot even be listed).
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

from k26ops.errors import UserError
from k26ops.inventory.yamlsrc import MAX_BYTES, Map, oneline, read, show

VARS_EXTS = (".yml", ".yaml", ".json")
YAML_EXTS = VARS_EXTS
# ansible-core's defaults: REJECT_EXTS + .orig .cfg .retry, hidden files, backups.
IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
VARS_DIRS = ("group_vars", "host_vars")
MAX_FILES = 10_000  # bounded input: a directory of more files is refused


def inventory_files(path: Path) -> list[Path]:
    """The inventory source files of `path` (itself when a file)."""
    if not path.is_dir():
        return [path]
    out: list[Path] = []
    _walk(path, out)
    if not out:
        raise UserError(oneline(f"{path}: inventory directory holds no inventory file"))
    return out


def _walk(directory: Path, out: list[Path]) -> None:
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError as exc:
        raise UserError(oneline(f"{directory}: cannot read inventory directory: {exc.strerror or exc}")) from None
    for name in names:
        if name.startswith(".") or name.endswith(IGNORED_EXTS) or name in VARS_DIRS:
            continue
        p = directory / name
        if p.is_dir():
            _walk(p, out)
        elif p.is_file():
            out.append(p)
        if len(out) > MAX_FILES:
            raise UserError(oneline(f"{directory}: more than {MAX_FILES:,} inventory files: refused"))


def read_source(path: Path) -> dict:
    """One inventory file as the Ansible YAML shape (INI converted)."""
    if path.suffix in YAML_EXTS:
        return read(path)
    if path.suffix == "":
        if _looks_ini(path):
            return read_ini(path)
        return read(path)
    return read_ini(path)


def _looks_ini(path: Path) -> bool:
    """An extension-less file is INI when its first real line is a [section] or
    a host line (no `key:` mapping), as Ansible's yaml plugin fails and ini reads it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(65536).decode("utf-8", "replace")
    except OSError:
        return False
    for line in head.splitlines():
        s = line.strip()
        if not s or s[0] in "#;" or s == "---":
            continue
        return s.startswith("[") or not re.match(r"^[^\s:]+:(\s|$)", s)
    return False


_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")


def read_ini(path: Path) -> Map:
    """An INI inventory, converted to the YAML shape (lines kept) for ansible.parse."""
    try:
        raw = path.read_bytes()[: MAX_BYTES + 1]
    except OSError as exc:
        raise UserError(oneline(f"{path}: cannot read inventory: {exc.strerror or exc}")) from None
    if len(raw) > MAX_BYTES:
        raise UserError(oneline(f"{path}: inventory is over the {MAX_BYTES:,}-byte limit: refused"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(oneline(f"{path}: inventory is not UTF-8 text (byte {exc.start})")) from None
    top = Map()
    top.line = 1
    declared: dict[str, int] = {"all": 0, "ungrouped": 0}  # group -> line of its first [section]
    pending: dict[str, int] = {}  # child named in [x:children] before any section of its own
    group, state = "ungrouped", "hosts"

    def body(name: str, line: int) -> Map:
        if name not in top:
            top[name] = Map()
            top[name].line = line
            top.key_lines[name] = line
        return top[name]

    def section(g: Map, key: str, line: int) -> Map:
        if key not in g:
            g[key] = Map()
            g[key].line = line
            g.key_lines[key] = line
        return g[key]

    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        m = _SECTION.match(s)
        if m:
            group, state = m.group(1), m.group(2) or "hosts"
            if state not in ("hosts", "children", "vars"):
                raise UserError(oneline(f"{path}:{n}: section [{group}:{state}] has unknown type {state!r}"))
            if state == "vars" and group not in declared:
                pending.setdefault(group, n)
            else:
                declared.setdefault(group, n)
                pending.pop(group, None)
            body(group, n)
            continue
        if s.startswith("[") and s.endswith("]"):
            raise UserError(oneline(f"{path}:{n}: invalid section {show(s)} (no spaces inside [...])"))
        g = body(group, n)
        if state == "vars":
            if "=" not in s:
                raise UserError(oneline(f"{path}:{n}: expected key=value, got {show(s)}"))
            k, v = (e.strip() for e in s.split("=", 1))
            _put(section(g, "vars", n), k, _value(v), n)
        elif state == "children":
            child = s.split("#", 1)[0].strip()
            if not child or any(c.isspace() for c in child):
                raise UserError(oneline(f"{path}:{n}: expected a group name, got {show(s)}"))
            _put(section(g, "children", n), child, None, n)
            if child not in declared:
                pending.setdefault(child, n)
        else:
            try:
                words = shlex.split(s, comments=True)
            except ValueError as exc:
                raise UserError(oneline(f"{path}:{n}: cannot split host line ({exc}): {show(s)}")) from None
            if s.endswith(":") or words[0].endswith(":"):
                raise UserError(oneline(f"{path}:{n}: host {show(words[0])} ends in ':' (a port must follow)"))
            hv = Map()
            hv.line = n
            for w in words[1:]:
                if "=" not in w:
                    raise UserError(oneline(f"{path}:{n}: expected key=value after the host, got {show(w)}"))
                k, v = w.split("=", 1)
                _put(hv, k, _value(v), n)
            hosts = section(g, "hosts", n)
            old = hosts.get(words[0])
            if isinstance(old, Map):
                for k, v in hv.items():
                    _put(old, k, v, n)
            else:
                _put(hosts, words[0], hv, n)
    for name, n in pending.items():
        if name not in declared:
            raise UserError(
                oneline(f"{path}:{n}: group {show(name)} is used here but never defined (no [{name}] section)")
            )
    return top


def _put(m: Map, key, value, line: int) -> None:
    m[key] = value
    m.key_lines[key] = line


def _value(text: str):
    """As Ansible's INI plugin: a Python literal when it is one (8, True, [1, 2],
    'quoted'), else the text as written."""
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if v is ... or isinstance(v, complex):
        return text
    if isinstance(v, (set, tuple)):
        return list(v)
    return v


def vars_files(base: Path, subdir: str, name: str) -> list[Path]:
    """group_vars/NAME or host_vars/NAME: Ansible's find_vars_files (the first of
    NAME, NAME.yml, NAME.yaml, NAME.json; a directory is read whole, in name order)."""
    root = base / subdir
    if not root.is_dir():
        return []
    for ext in ("",) + VARS_EXTS:
        p = root / (name + ext)
        if p.exists():
            if p.is_dir():
                out: list[Path] = []
                _vars_dir(p, out)
                return out
            return [p]
    return []


def _vars_dir(directory: Path, out: list[Path]) -> None:
    for name in sorted(x.name for x in directory.iterdir()):
        if name.startswith(".") or name.endswith("~"):
            continue
        p = directory / name
        ext = p.suffix
        if p.is_dir() and not ext:
            _vars_dir(p, out)
        elif p.is_file() and (not ext or ext in VARS_EXTS):
            out.append(p)


def read_vars_file(path: Path) -> Map | None:
    """One group_vars/host_vars file: a mapping of variables (None when empty)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise UserError(oneline(f"{path}: cannot read: {exc.strerror or exc}")) from None
    if head.startswith(b"$ANSIBLE_VAULT;"):
        raise UserError(
            oneline(
                f"{path}: encrypted whole with ansible-vault: k26ops does not decrypt vault files; "
                f"keep secrets as single !vault values (shown as <vault>, never sent) or pass them "
                f"through the environment (e.g. HF_TOKEN)"
            )
        )
    try:
        data = read(path)
    except UserError as exc:
        if "inventory is empty" in str(exc):
            return None
        raise
    return data
