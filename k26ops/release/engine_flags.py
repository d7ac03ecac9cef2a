"""Engine flags checked against the installed sglang sources, statically.

Why: flags drift between sglang versions (0.5.23 renamed --cuda-graph-max-bs,
has no DDTREE), and finding out from a crashed service is slow. Reading the
argument definitions with `ast` needs no import, no torch and no GPU, so it
works on the control node against a host's tree or a release's sources.

Two styles are understood: `parser.add_argument("--flag", ...)` calls (older
releases put every flag in srt/server_args.py) and 0.5.23's dataclass fields
`name: A[T, "help"]` / `A[T, Arg(cli_name=..., aliases=..., no_cli=...)]` under
srt/arg_groups/fields/, which become `--name-with-dashes`.
"""

from __future__ import annotations

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
_NO_VALUE_ACTIONS = {"store_true", "store_false", "count", "help", "version"}


@dataclass
class Flag:
    name: str
    takes_value: bool = True
    choices: tuple | None = None
    nargs: str | None = None


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


def _add_argument_flags(tree: ast.AST) -> list[Flag]:
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str) and a.value.startswith("-")]
        if not names:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw.get("action")
        action_name = action.value if isinstance(action, ast.Constant) else (
            getattr(action, "id", None) or getattr(action, "attr", None) or "")
        takes = not (action_name in _NO_VALUE_ACTIONS or "StoreTrue" in action_name
                     or "StoreFalse" in action_name)
        if "nargs" in kw and _const(kw["nargs"]) == 0:
            takes = False
        choices = _const(kw["choices"]) if "choices" in kw else None
        choices = tuple(choices) if isinstance(choices, (list, tuple, set, frozenset)) else None
        nargs = _const(kw["nargs"]) if "nargs" in kw else None
        for n in names:
            out.append(Flag(n, takes, choices, nargs if isinstance(nargs, str) else None))
    return out


def _annotated_parts(ann: ast.AST):
    """(type node, meta node) for `A[T, meta]` / `Annotated[T, meta]`, else None."""
    if not isinstance(ann, ast.Subscript):
        return None
    head = ann.value
    name = getattr(head, "id", None) or getattr(head, "attr", None)
    if name not in ("A", "Annotated"):
        return None
    sl = ann.slice
    if not isinstance(sl, ast.Tuple) or len(sl.elts) < 2:
        return None
    return sl.elts[0], sl.elts[1]


def _literal_choices(tp: ast.AST):
    for node in ast.walk(tp):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", getattr(node.value, "attr", None)) == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            vals = [_const(e) for e in elts]
            return tuple(vals)
    return None


def _is_bool(tp: ast.AST) -> bool:
    names = [getattr(n, "id", None) for n in ast.walk(tp) if isinstance(n, ast.Name)]
    names = [n for n in names if n not in ("Optional",)]
    return names == ["bool"]


def _field_flags(tree: ast.AST) -> list[Flag]:
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
            if isinstance(meta, ast.Call) and getattr(meta.func, "id", getattr(meta.func, "attr", None)) == "Arg":
                kw = {k.arg: k.value for k in meta.keywords if k.arg}
            elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and not isinstance(meta, ast.JoinedStr):
                continue
            if _const(kw["no_cli"]) is True if "no_cli" in kw else False:
                continue
            cli = _const(kw["cli_name"]) if "cli_name" in kw else None
            names = [cli or "--" + st.target.id.replace("_", "-")]
            aliases = _const(kw["aliases"]) if "aliases" in kw else None
            names += list(aliases or [])
            choices = _const(kw["choices"]) if "choices" in kw else None
            choices = tuple(choices) if isinstance(choices, (list, tuple)) else _literal_choices(tp)
            takes = "action" in kw or not _is_bool(tp)
            if "action" in kw:
                a = kw["action"]
                an = a.value if isinstance(a, ast.Constant) else getattr(a, "id", getattr(a, "attr", ""))
                takes = not (an in _NO_VALUE_ACTIONS or "StoreTrue" in str(an) or "StoreFalse" in str(an))
            for n in names:
                out.append(Flag(n, takes, choices))
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
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
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
        return d.name[len("sglang-"):-len(".dist-info")]
    return None


def read_flags(sources_root) -> EngineFlags:
    """Every CLI flag of the sglang tree under sources_root (site-packages or the package dir)."""
    pkg = _pkg(sources_root)
    sa = pkg / "srt/server_args.py"
    if not sa.is_file():
        raise UserError(f"{sa}: not found: is sglang installed under {sources_root}?")
    files = [sa] + sorted((pkg / "srt/arg_groups").rglob("*.py"))
    flags: dict[str, Flag] = {}
    for path in files:
        tree = _parse(path)
        if tree is None:
            if path == sa:
                raise UserError(f"{sa}: cannot be parsed as Python")
            continue
        for f in _add_argument_flags(tree) + _field_flags(tree):
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
    return UserError(f"the DDTree source is missing: sglang {ef.version or '(unknown version)'} has no DDTREE; "
                     f"build the engine from a git source pinned to a DDTree commit (recipe engine.source) (sources: {ef.root})")


def _unknown(name: str, ef: EngineFlags) -> UserError:
    where = f"the installed sglang {ef.version or '(unknown version)'}"
    if name in RENAMED:
        new, release = RENAMED[name]
        present = [n for n in new if n in ef.flags]
        if present:
            return UserError(f"engine flag {name} is not accepted by {where}: sglang {release} renamed it to "
                             f"{' and '.join(present)}")
    if name.startswith("--speculative-ddtree") and not ef.has_ddtree:
        return _ddtree_missing(ef)
    close = difflib.get_close_matches(name, list(ef.flags), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return UserError(f"engine flag {name} is not accepted by {where}{hint}")


def validate(flags, sources_root, engine: EngineFlags | None = None) -> None:
    """Raise a one-line UserError for an unknown flag, a bad choice or a missing DDTree."""
    ef = engine or read_flags(sources_root)
    argv = _normalize(flags)
    i = 0
    seen: list[tuple[str, list[str]]] = []
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-") or tok in ("-", "--"):
            raise UserError(f"engine flags: unexpected argument {tok!r} (flags start with --)")
        name, eq, val = tok.partition("=")
        i += 1
        info = ef.flags.get(name)
        values: list[str] = [val] if eq else []
        if info is not None and info.takes_value and not eq:
            if info.nargs in ("+", "*"):
                while i < len(argv) and not argv[i].startswith("--"):
                    values.append(argv[i])
                    i += 1
            elif info.nargs != "?" or (i < len(argv) and not argv[i].startswith("--")):
                if i >= len(argv):
                    raise UserError(f"engine flag {name} needs a value")
                values.append(argv[i])
                i += 1
        elif info is None and not eq and i < len(argv) and not argv[i].startswith("-"):
            values.append(argv[i])  # an unknown flag's value, most likely
            i += 1
        seen.append((name, values))
    # the DDTree question first: it explains other unknown flags too
    for name, values in seen:
        if name == SPEC_FLAG and values and values[0].upper() == "DDTREE" and not ef.has_ddtree:
            raise _ddtree_missing(ef)
    for name, values in seen:
        info = ef.flags.get(name)
        if info is None:
            raise _unknown(name, ef)
        if name == SPEC_FLAG and values and ef.spec_algorithms and values[0].upper() not in ef.spec_algorithms:
            raise UserError(f"engine flag {SPEC_FLAG} {values[0]}: not an algorithm of sglang {ef.version}; "
                            f"known: {', '.join(sorted(ef.spec_algorithms))}")
        if info.choices and name != SPEC_FLAG:
            bad = [v for v in values if v not in {str(c) for c in info.choices}]
            if bad:
                raise UserError(f"engine flag {name} {bad[0]}: not one of {', '.join(map(str, info.choices))}")
