"""Engine flags checked against the installed sglang sources, statically.

Why: flags drift between sglang versions (0.5.23 renamed --cuda-graph-max-bs,
has no DDTREE), and finding out from a crashed service is slow. Reading the
argument definitions with `ast` needs no import, no torch and no GPU, so it
works on the control node against a host's tree or a release's sources.

Two styles are understood: `parser.add_argument("--flag", ...)` calls (older
releases put every flag in srt/server_args.py) and 0.5.23's dataclass fields
`name: A[T, "help"]` / `A[T, Arg(cli_name=..., aliases=..., no_cli=...)]` under
srt/arg_groups/fields/, which become `--name-with-dashes`.

The fields are turned into flags the way 0.5.23's arg_utils.add_cli_args_from_dataclass
does (a custom action as given, with its own nargs default; Literal -> choices;
List[X] -> nargs '+'; bool -> store_true; int/float converted), named choice
lists are evaluated from their modules (arg_groups/choices.py, `Backend.ALL`),
and `validate` hands the command line to a real argparse parser with those
names, aliases, nargs and BooleanOptionalAction `--no-` forms, so it takes the
words the engine's parser takes. Choices extended at run time (an out-of-tree
plugin calling `add_*_choices`) or behind a `type_parser` are not checked.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from k26ops.errors import UserError

SPEC_FLAG = "--speculative-algorithm"
# Known renames: old spelling -> (new spellings, release that renamed it).
RENAMED = {
    "--cuda-graph-max-bs": (("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"), "0.5.23"),
}
_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


@dataclass
class Flag:
    """One option string of the engine's parser, as argparse will treat it.

    `canonical` is the argument's first option string (a field's flag): its
    aliases and its `--no-` form (BooleanOptionalAction) point to it. `kind` is
    "store" (takes `nargs` values), "store_true" (none) or "boolean_optional"
    (none; the `--no-` spelling stores False). `type` is "int"/"float" where the
    engine converts with int()/float(). `where` is file:line of the definition."""

    name: str
    takes_value: bool = True
    choices: tuple | None = None
    nargs: str | int | None = None
    canonical: str = ""
    kind: str = "store"
    type: str | None = None
    where: str = ""

    def __post_init__(self):
        self.canonical = self.canonical or self.name


@dataclass
class EngineFlags:
    """The installed engine's CLI surface."""

    root: Path  # directory holding the `sglang/` package
    version: str | None
    flags: dict[str, Flag] = field(default_factory=dict)
    spec_algorithms: frozenset[str] = frozenset()

    @property
    def has_ddtree(self) -> bool:
        return "DDTREE" in self.spec_algorithms

    def canonical(self, name: str) -> str:
        """The argument an option string belongs to (alias -> its field's flag)."""
        f = self.flags.get(name)
        return f.canonical if f else name

    @property
    def aliases(self) -> dict[str, str]:
        """option string -> canonical flag, for every alias (not the `--no-` forms)."""
        return {
            n: f.canonical
            for n, f in self.flags.items()
            if n != f.canonical and not (f.kind == "boolean_optional" and n.startswith("--no-"))
        }


def _pkg(sources_root) -> Path:
    root = Path(sources_root)
    if (root / "srt").is_dir() and not (root / "sglang").is_dir():
        return root
    return root / "sglang"


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _parse(path: Path) -> ast.AST | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


_UNKNOWN = object()


class _Names:
    """Module-level names of the engine's sources, evaluated statically: the named
    choice lists (`choices=ATTENTION_BACKEND_CHOICES`, `LOAD_FORMAT_CHOICES + [...]`,
    `Backend.ALL`) resolve to their values; anything computed at run time is unknown."""

    def __init__(self, pkg: Path):
        self.pkg, self._mods = pkg, {}

    def module(self, dotted: str) -> dict:
        if dotted in self._mods:
            return self._mods[dotted]
        self._mods[dotted] = env = {}
        parts = dotted.split(".")
        if parts[0] != "sglang":
            return env
        base = self.pkg.joinpath(*parts[1:])
        tree = _parse(base.with_suffix(".py")) or _parse(base / "__init__.py")
        for st in tree.body if tree else ():
            if isinstance(st, ast.Assign):
                for t in st.targets:
                    if isinstance(t, ast.Name):
                        env[t.id] = ("node", st.value, dotted)
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                env[st.target.id] = ("node", st.value, dotted)
            elif isinstance(st, ast.ImportFrom) and st.module and st.level == 0:
                for a in st.names:
                    env[a.asname or a.name] = ("import", st.module, a.name)
            elif isinstance(st, ast.ClassDef):
                env[st.name] = ("class", st, dotted)
            elif (
                isinstance(st, ast.Expr)
                and isinstance(st.value, ast.Call)  # NAME.extend([...]) at import
                and isinstance(st.value.func, ast.Attribute)
                and st.value.func.attr in ("extend", "append")
                and isinstance(st.value.func.value, ast.Name)
            ):
                env.setdefault("__extends__", []).append((st.value.func.value.id, st.value.func.attr, st.value.args))
        return env

    def value(self, node, mod: str, scope: dict | None = None, depth: int = 0):
        if depth > 20:
            return _UNKNOWN
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            vals = [self.value(e, mod, scope, depth + 1) for e in node.elts]
            return _UNKNOWN if any(v is _UNKNOWN for v in vals) else list(vals)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.value(node.left, mod, scope, depth + 1), self.value(node.right, mod, scope, depth + 1)
            return a + b if isinstance(a, list) and isinstance(b, list) else _UNKNOWN
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and len(node.args) == 1
            and node.func.id in ("list", "tuple", "set", "frozenset", "sorted")
            and not node.keywords
        ):
            v = self.value(node.args[0], mod, scope, depth + 1)
            return sorted(v, key=str) if isinstance(v, list) and node.func.id == "sorted" else v
        if isinstance(node, ast.Name):
            if scope and node.id in scope:
                return self.value(scope[node.id], mod, scope, depth + 1)
            return self.name(mod, node.id, depth + 1)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            ent = self.module(mod).get(node.value.id)
            if ent and ent[0] == "import":
                ent = self.module(ent[1]).get(ent[2])
            if ent and ent[0] == "class":
                body = {
                    t.id: st.value
                    for st in ent[1].body
                    if isinstance(st, ast.Assign)
                    for t in st.targets
                    if isinstance(t, ast.Name)
                }
                if node.attr in body:
                    return self.value(body[node.attr], ent[2], body, depth + 1)
        return _UNKNOWN

    def name(self, mod: str, name: str, depth: int = 0):
        ent = self.module(mod).get(name)
        if ent is None:
            return _UNKNOWN
        if ent[0] == "import":
            return self.name(ent[1], ent[2], depth + 1)
        if ent[0] != "node":
            return _UNKNOWN
        v = self.value(ent[1], ent[2], None, depth + 1)
        for target, how, args in self.module(ent[2]).get("__extends__", ()):
            if target == name and isinstance(v, list) and len(args) == 1:
                more = self.value(args[0], ent[2], None, depth + 1)
                if more is _UNKNOWN:
                    return _UNKNOWN
                v = v + (more if how == "extend" else [more])
        return v


def _dotted(path: Path, pkg: Path) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _name_of(node) -> str:
    return getattr(node, "id", None) or getattr(node, "attr", None) or ""


def _action_defaults(names: _Names, mod: str, action: ast.AST) -> dict:
    """A custom argparse.Action's own defaults (its __init__'s nargs=0 and the like)."""
    ent = names.module(mod).get(_name_of(action)) if isinstance(action, ast.Name) else None
    if ent and ent[0] == "import":
        ent = names.module(ent[1]).get(ent[2])
    if not (ent and ent[0] == "class"):
        return {}
    for st in ent[1].body:
        if isinstance(st, ast.FunctionDef) and st.name == "__init__":
            a = st.args
            pos = a.args[len(a.args) - len(a.defaults) :]
            out = {p.arg: _const(d) for p, d in zip(pos, a.defaults)}
            out.update({p.arg: _const(d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
            return out
    return {}


def _flags_for(
    names_: list[str], kw: dict, names: _Names, mod: str, where: str, type_name: str | None = None
) -> list[Flag]:
    """The option strings one add_argument(*names_, **kw) call makes, as argparse makes them."""
    action = kw.get("action")
    action_name = action.value if isinstance(action, ast.Constant) else _name_of(action)
    defaults = _action_defaults(names, mod, action) if action is not None else {}
    nargs = _const(kw["nargs"]) if "nargs" in kw else defaults.get("nargs")
    choices = names.value(kw["choices"], mod) if "choices" in kw else None
    choices = tuple(choices) if isinstance(choices, list) else None
    if isinstance(action, ast.Constant) and action_name == "store":
        action_name = ""
    if action_name == "BooleanOptionalAction":
        out = [Flag(n, False, None, 0, names_[0], "boolean_optional", None, where) for n in names_]
        out += [
            Flag("--no-" + n[2:], False, None, 0, names_[0], "boolean_optional", None, where)
            for n in names_
            if n.startswith("--")
        ]
        return out
    if action_name in _NO_VALUE_ACTIONS or "StoreTrue" in action_name or "StoreFalse" in action_name or nargs == 0:
        return [Flag(n, False, None, 0, names_[0], "store_true", None, where) for n in names_]
    return [
        Flag(n, True, choices, nargs if isinstance(nargs, (str, int)) else None, names_[0], "store", type_name, where)
        for n in names_
    ]


def _add_argument_flags(tree: ast.AST, names: _Names, mod: str, path: Path) -> list[Flag]:
    out = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        opts = [
            a.value
            for a in node.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        ]
        if not opts:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        tp = _name_of(kw.get("type")) if "type" in kw else None
        out += _flags_for(opts, kw, names, mod, f"{path.name}:{node.lineno}", tp if tp in ("int", "float") else None)
    return out


def _annotated_parts(ann: ast.AST):
    """(type node, meta node) for `A[T, meta]` / `Annotated[T, meta]`, else None."""
    if not isinstance(ann, ast.Subscript):
        return None
    if _name_of(ann.value) not in ("A", "Annotated"):
        return None
    sl = ann.slice
    if not isinstance(sl, ast.Tuple) or len(sl.elts) < 2:
        return None
    return sl.elts[0], sl.elts[1]


def _unwrap_optional(tp: ast.AST) -> ast.AST:
    """Optional[X] / Union[X, None] / X | None -> X (as arg_utils._unwrap_optional)."""
    if isinstance(tp, ast.Subscript) and _name_of(tp.value) == "Optional":
        return tp.slice
    if isinstance(tp, ast.Subscript) and _name_of(tp.value) == "Union" and isinstance(tp.slice, ast.Tuple):
        rest = [e for e in tp.slice.elts if not (isinstance(e, ast.Constant) and e.value is None)]
        return rest[0] if len(rest) == 1 else tp
    if isinstance(tp, ast.BinOp) and isinstance(tp.op, ast.BitOr):
        sides = [s for s in (tp.left, tp.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        return sides[0] if len(sides) == 1 else tp
    return tp


def _field_flags(tree: ast.AST, names: _Names, mod: str, path: Path) -> list[Flag]:
    """0.5.23's dataclass fields, turned into flags the way arg_utils.add_cli_args_from_dataclass
    does: a custom action as given; Literal[...] -> choices; List[X] -> nargs '+' (or Arg.nargs);
    bool -> store_true; else one value (Arg.choices, Arg.nargs)."""
    out = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            parts = _annotated_parts(st.annotation)
            if parts is None:
                continue
            tp, meta = parts
            kw = {}
            if isinstance(meta, ast.Call) and _name_of(meta.func) == "Arg":
                kw = {k.arg: k.value for k in meta.keywords if k.arg}
            elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and not isinstance(
                meta, ast.JoinedStr
            ):
                continue
            if "no_cli" in kw and _const(kw["no_cli"]) is True:
                continue
            cli = _const(kw["cli_name"]) if "cli_name" in kw else None
            opts = [cli or "--" + st.target.id.replace("_", "-")]
            opts += list(_const(kw["aliases"]) or []) if "aliases" in kw else []
            where = f"{path.parent.name}/{path.name}:{st.lineno}"
            if "action" in kw:
                akw = {"action": kw["action"]}
                extra = kw.get("action_kwargs")
                if isinstance(extra, ast.Dict):
                    akw.update({_const(k): v for k, v in zip(extra.keys, extra.values) if k is not None})
                out += _flags_for(opts, akw, names, mod, where)
                continue
            inner = _unwrap_optional(tp)
            head = _name_of(inner.value) if isinstance(inner, ast.Subscript) else _name_of(inner)
            parser_given = "type_parser" in kw
            if head == "Literal":
                elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
                lits = [_const(e) for e in elts]
                choices = kw.get("choices") or ast.List([ast.Constant(v) for v in lits])
                t = type(lits[0]).__name__ if lits else "str"
                # a type_parser converts before argparse compares with the choices: not checked here
                out += _flags_for(
                    opts,
                    {} if parser_given else {"choices": choices},
                    names,
                    mod,
                    where,
                    t if t in ("int", "float") and not parser_given else None,
                )
            elif head in ("List", "list") and not parser_given:
                elem = _name_of(inner.slice) if isinstance(inner, ast.Subscript) else "str"
                akw = {"nargs": kw.get("nargs") or ast.Constant("+")}
                if "choices" in kw:
                    akw["choices"] = kw["choices"]
                out += _flags_for(opts, akw, names, mod, where, elem if elem in ("int", "float") else None)
            elif head == "bool":
                out += _flags_for(opts, {"action": ast.Constant("store_true")}, names, mod, where)
            else:
                akw = {k: kw[k] for k in ("choices", "nargs") if k in kw and not (k == "choices" and parser_given)}
                out += _flags_for(
                    opts, akw, names, mod, where, head if head in ("int", "float") and not parser_given else None
                )
    return out


def _spec_algorithms(pkg: Path, flags: dict[str, Flag]) -> frozenset[str]:
    if flags.get(SPEC_FLAG) and flags[SPEC_FLAG].choices:
        return frozenset(str(c).upper() for c in flags[SPEC_FLAG].choices)
    names: set[str] = set()
    spec = pkg / "srt/speculative"
    tree = _parse(spec / "spec_info.py")
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
            for st in node.body:
                if isinstance(st, ast.Assign):
                    names |= {t.id for t in st.targets if isinstance(t, ast.Name) and t.id.isupper()}
    for path in (spec / "spec_registry.py", spec / "spec_info.py"):
        tree = _parse(path)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_RESERVED_ALIASES" for t in node.targets):
                names |= {
                    c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    names.discard("NONE")
    return frozenset(names)


def _version(pkg: Path) -> str | None:
    for p in (pkg / "_version.py", pkg / "version.py"):
        try:
            m = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", p.read_text(), re.M)
        except OSError:
            continue
        if m:
            return m.group(1)
    for d in sorted(pkg.parent.glob("sglang-*.dist-info")):
        return d.name[len("sglang-") : -len(".dist-info")]
    return None


def read_flags(sources_root) -> EngineFlags:
    """Every CLI flag of the sglang tree under sources_root (site-packages or the package dir)."""
    pkg = _pkg(sources_root)
    sa = pkg / "srt/server_args.py"
    if not sa.is_file():
        raise UserError(f"{sa}: not found: is sglang installed under {sources_root}?")
    files = [sa] + sorted((pkg / "srt/arg_groups").rglob("*.py"))
    names = _Names(pkg)
    flags: dict[str, Flag] = {}
    for path in files:
        tree = _parse(path)
        if tree is None:
            if path == sa:
                raise UserError(f"{sa}: cannot be parsed as Python")
            continue
        mod = _dotted(path, pkg)
        for f in _add_argument_flags(tree, names, mod, path) + _field_flags(tree, names, mod, path):
            flags.setdefault(f.name, f)
    return EngineFlags(pkg.parent, _version(pkg), flags, _spec_algorithms(pkg, flags))


def _normalize(flags) -> list[str]:
    if isinstance(flags, dict):
        argv = []
        for k, v in flags.items():
            name = "--" + str(k).lstrip("-").replace("_", "-")
            if v is None or v is False:
                continue
            argv.append(name)
            if v is not True:
                argv += [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]
        return argv
    return [str(x) for x in flags]


def _ddtree_missing(ef: EngineFlags) -> UserError:
    return UserError(
        f"the DDTree source is missing: sglang {ef.version or '(unknown version)'} has no DDTREE; "
        f"build the engine from a git source pinned to a DDTree commit (recipe engine.source) (sources: {ef.root})"
    )


def _unknown(name: str, ef: EngineFlags) -> UserError:
    where = f"the installed sglang {ef.version or '(unknown version)'}"
    if name in RENAMED:
        new, release = RENAMED[name]
        present = [n for n in new if n in ef.flags]
        if present:
            return UserError(
                f"engine flag {name} is not accepted by {where}: sglang {release} renamed it to {' and '.join(present)}"
            )
    if name.startswith("--speculative-ddtree") and not ef.has_ddtree:
        return _ddtree_missing(ef)
    close = difflib.get_close_matches(name, list(ef.flags), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return UserError(f"engine flag {name} is not accepted by {where}{hint}")


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit 2
        raise _ParseError(message)


class _Seen(argparse.Action):
    """Records (option string as written, canonical flag, values) in command-line order."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.seen.append((option_string, self.option_strings[0], values))


class _SeenBool(argparse.BooleanOptionalAction):
    def __call__(self, parser, namespace, values, option_string=None):
        namespace.seen.append((option_string, self.option_strings[0], not option_string.startswith("--no-")))


def parser_for(ef: EngineFlags) -> argparse.ArgumentParser:
    """An argparse parser with the engine's arguments (names, aliases, nargs, actions,
    `--no-` forms) but recording actions: argparse itself decides how many words each
    flag takes, exactly as the engine's parser will."""
    cached = getattr(ef, "_parser", None)
    if cached is not None:
        return cached
    p = _Parser(prog="sglang", add_help=False, allow_abbrev=False)
    groups: dict[str, list[Flag]] = {}
    for f in ef.flags.values():
        groups.setdefault(f.canonical, []).append(f)
    for canon, fs in groups.items():
        kind = fs[0].kind
        opts = [
            f.name for f in fs if not (kind == "boolean_optional" and f.name.startswith("--no-") and f.name != canon)
        ]
        opts = [canon] + [o for o in opts if o != canon]
        dest = "f_" + canon.lstrip("-").replace("-", "_")
        try:
            if kind == "boolean_optional":
                p.add_argument(*opts, action=_SeenBool, dest=dest)
            elif kind == "store_true":
                p.add_argument(*opts, action=_Seen, nargs=0, dest=dest)
            else:
                p.add_argument(*opts, action=_Seen, nargs=fs[0].nargs, dest=dest)
        except (argparse.ArgumentError, ValueError):
            continue  # a name argparse itself refuses (a conflict): left unchecked
    ef._parser = p
    return p


def _is_option(tok: str) -> bool:
    """As argparse reads a word: an option unless it is '-', '--' or a negative number."""
    return tok.startswith("-") and tok not in ("-", "--") and not re.fullmatch(r"-\d+|-\d*\.\d+", tok)


def _convert(value: str, typ: str | None):
    if typ == "int":
        return int(value)
    if typ == "float":
        return float(value)
    return value


def validate(flags, sources_root, engine: EngineFlags | None = None) -> None:
    """Raise a one-line UserError for what the engine's parser would refuse (an unknown
    flag, a missing or extra value, a value not of the flag's type or choices) or a
    missing DDTree; accept what it accepts (aliases, `--no-` forms, list flags)."""
    ef = engine or read_flags(sources_root)
    argv = _normalize(flags)
    names = [(i, tok.partition("=")[0]) for i, tok in enumerate(argv) if _is_option(tok)]
    # the DDTree question first: it explains other unknown flags too
    for i, name in names:
        val = argv[i].partition("=")[2] if "=" in argv[i] else (argv[i + 1] if i + 1 < len(argv) else "")
        if ef.canonical(name) == SPEC_FLAG and val.upper() == "DDTREE" and not ef.has_ddtree:
            raise _ddtree_missing(ef)
    if argv and not _is_option(argv[0]):
        raise UserError(f"engine flags: unexpected argument {argv[0]!r} (flags start with --)")
    for _, name in names:
        if name not in ef.flags:
            raise _unknown(name, ef)
    ns = argparse.Namespace(seen=[])
    try:
        parser_for(ef).parse_args(argv, ns)
    except _ParseError as exc:
        raise UserError(f"engine flags: {exc} (the parser of sglang {ef.version or '(unknown version)'})") from None
    for opt, canon, values in ns.seen:
        info = ef.flags[opt]
        if info.kind != "store" or values is None:
            continue
        vals = values if isinstance(values, list) else [values]
        if canon == SPEC_FLAG:
            if vals and ef.spec_algorithms and str(vals[0]).upper() not in ef.spec_algorithms:
                raise UserError(
                    f"engine flag {SPEC_FLAG} {vals[0]}: not an algorithm of sglang {ef.version}; "
                    f"known: {', '.join(sorted(ef.spec_algorithms))}"
                )
            continue
        for v in vals:
            try:
                got = _convert(v, info.type)
            except ValueError:
                raise UserError(
                    f"engine flag {opt} {v}: not an {info.type} (sglang {ef.version}, {info.where})"
                ) from None
            if info.choices and got not in info.choices and str(got) not in {str(c) for c in info.choices}:
                raise UserError(
                    f"engine flag {opt} {v}: not one of {', '.join(map(str, info.choices))} "
                    f"(sglang {ef.version}, {info.where})"
                )
