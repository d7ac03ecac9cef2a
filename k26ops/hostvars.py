"""Inventory variables, declared by the code that reads them.

A module that reads an inventory variable from a host's vars declares it beside
that code: its type, the default the code really uses (the same constant, not a
copy as text) and what it means. The declarations register here, in the base
layer, so a reader of any layer can declare without importing upward;
k26ops.inventory.variables checks an inventory's keys against them and
docs/reference/inventory.md is generated from them.

The registry holds what the imported modules declared. The CLI makes it whole
(`complete_with`): k26ops.cli.readers imports every declaring module the first time
the registry is asked, i.e. when an inventory is loaded or the table printed (a
test holds that list to the modules that call `declare`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Var:
    name: str
    type: str
    default: object  # what the reading code uses when the variable is unset (None: unset means not used)
    meaning: str
    default_text: str = ""  # the default for people when it is not one value ("the recipe's")
    informational: bool = False  # declared, read by nothing: for people (or Ansible) only
    module: str = ""  # the declaring module (set by `declare`)
    topic: str = ""  # the declaring module's heading for its variables (set by `declare`)

    @property
    def shown_default(self) -> str:
        if self.default_text:
            return self.default_text
        d = self.default
        if d is None:
            return "-"
        if isinstance(d, bool):
            return str(d).lower()
        if isinstance(d, (list, tuple)):
            return "[" + ", ".join(str(x) for x in d) + "]"
        return str(d)

    def to_json(self) -> dict:
        """`inventory vars --json`: the default as people read it (a JSON value cannot say "the recipe's")."""
        return {
            "name": self.name,
            "type": self.type,
            "default": self.shown_default,
            "used": self.module,
            "meaning": self.meaning,
            "informational": self.informational,
            "topic": self.topic,
        }


_DECLARED: dict[str, Var] = {}
_LOADERS: list = []  # what imports every declaring module, run before the registry first answers


def complete_with(load) -> None:
    """`load()` imports every module that declares variables (the CLI's k26ops.cli.readers):
    run once, when the registry is first asked, so a command that reads no inventory
    (`--help`) does not import them."""
    _LOADERS.append(load)


def _whole() -> None:
    while _LOADERS:
        _LOADERS.pop()()


def declare(module: str, topic: str, *variables: Var) -> dict[str, Var]:
    """Register `variables` as read by `module` (its `__name__`); returns them by name.

    A name declared by two modules is a programming error: one reader owns each
    variable and the others use its declaration."""
    out = {}
    for v in variables:
        v = replace(v, module=module, topic=topic)
        old = _DECLARED.get(v.name)
        if old is not None and old.module != module:
            raise ValueError(f"inventory variable {v.name} declared by {old.module} and {module}")
        _DECLARED[v.name] = out[v.name] = v
    return out


def is_declared(name: str) -> bool:
    if _LOADERS:
        _whole()
    return name in _DECLARED


def declared() -> tuple[Var, ...]:
    """Every variable declared so far, by declaring module, then in declaration order."""
    _whole()
    order = {name: i for i, name in enumerate(_DECLARED)}
    return tuple(sorted(_DECLARED.values(), key=lambda v: (v.module, order[v.name])))
