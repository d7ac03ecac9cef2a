"""The library returns results; only k26ops/cli/ talks to people.

Nothing under k26ops/ outside cli/ may import click or rich, call print(),
or exit (sys.exit, raise SystemExit): a command's output and exit code are
the CLI's. Host-side Python kept in a string literal is read as code too.
The only exceptions are host-side scripts whose stdout is their protocol,
each listed with why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labtools.source import parsed

PKG = Path(__file__).resolve().parent.parent.parent / "k26ops"

EXEMPT = {
    "agents/": "host agents: run on the hosts, their stdout is the protocol",
    "selftest/payload.py": "copied to the hosts and run there; prints its JSON report",
    "lab/fixtures/": "lab stand-ins for what needs a GPU (nvidia-smi, the engine server)",
}
# release/patchset.py: only its command-line main (run on the hosts from the release; `_main` and
# its `if __name__ == "__main__"`) prints and exits.
EXEMPT_FUNCTIONS = {"release/patchset.py": {"_main"}}


def _exempt(rel: str) -> bool:
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in EXEMPT)


class _Finder(ast.NodeVisitor):
    def __init__(self, rel: str, skip_functions=()):
        self.rel, self.skip, self.found = rel, set(skip_functions), []

    def _say(self, node, what):
        self.found.append(f"k26ops/{self.rel}:{node.lineno}: {what}")

    def visit_FunctionDef(self, node):
        if node.name not in self.skip:
            self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):  # `if __name__ == "__main__":` belongs to an exempt main
        t = node.test
        main = (
            isinstance(t, ast.Compare)
            and isinstance(t.left, ast.Name)
            and t.left.id == "__name__"
            and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__"
        )
        if main and self.skip:
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node):
        for a in node.names:
            if a.name.split(".")[0] in ("click", "rich"):
                self._say(node, f"imports {a.name}")

    def visit_ImportFrom(self, node):
        if (node.module or "").split(".")[0] in ("click", "rich") and not node.level:
            self._say(node, f"imports from {node.module}")

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("print", "exit", "quit"):
            self._say(node, f"calls {f.id}()")
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("exit", "_exit")
            and isinstance(f.value, ast.Name)
            and f.value.id in ("sys", "os")
        ):
            self._say(node, f"calls {f.value.id}.{f.attr}()")
        self.generic_visit(node)

    def visit_Raise(self, node):
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id == "SystemExit":
            self._say(node, "raises SystemExit")
        self.generic_visit(node)

    def visit_Constant(self, node):
        # host-side Python in a string (python3 -c SCRIPT): the same rules
        if isinstance(node.value, str) and "\n" in node.value and "import " in node.value:
            try:
                tree = ast.parse(node.value)
            except (SyntaxError, ValueError):
                return
            inner = _Finder(self.rel)
            inner.visit(tree)
            self.found += [f"{m} (in the string at line {node.lineno})" for m in inner.found]


def offences(root: Path = PKG) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("cli/") or _exempt(rel):
            continue
        finder = _Finder(rel, EXEMPT_FUNCTIONS.get(rel, ()))
        finder.visit(parsed(path))
        found += finder.found
    return found


def test_only_the_cli_prints_exits_or_imports_click_and_rich():
    assert offences() == []


def test_every_exemption_still_names_a_file():
    for rel in [*EXEMPT, *EXEMPT_FUNCTIONS]:
        assert (PKG / rel).exists(), f"{rel}: exempt but gone: drop it from the list"


@pytest.mark.parametrize(
    "code, what",
    [
        ("import click\n", "imports click"),
        ("from rich.console import Console\n", "imports from rich.console"),
        ("def f():\n    print('x')\n", "calls print()"),
        ("import sys\nsys.exit(1)\n", "calls sys.exit()"),
        ("raise SystemExit(2)\n", "raises SystemExit"),
        ("S = '''\nimport json\nprint(json.dumps({}))\n'''\n", "calls print() (in the string at line 1)"),
    ],
)
def test_each_kind_of_offence_is_found(tmp_path, code, what):
    (tmp_path / "lib.py").write_text(code)
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "ok.py").write_text("import click\nprint('fine here')\n")
    assert [m.split(": ", 1)[1] for m in offences(tmp_path)] == [what]
