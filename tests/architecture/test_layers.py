"""The layer table: every k26ops import points down (or within its layer), and no
import cycle exists, function-level imports included. README's "How it is built"
diagram is printed from the same table, so the two cannot drift.

Host agents (k26ops/agents/*.py but its __init__) and lab fixtures run on hosts as
single files and import nothing from k26ops; tests/transport/test_agents.py holds them to that.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from labtools.source import parsed

ROOT = Path(__file__).resolve().parent.parent.parent
PKG = ROOT / "k26ops"

# Bottom first. A module belongs to the layer of its longest matching prefix; "=name"
# matches that module alone (a package's __init__ whose submodules sit lower).
LAYERS: list[tuple[str, str, list[str]]] = [
    (
        "base",
        "errors, where files live, shell quoting, the interrupt flag, config, declared inventory variables, typed run state",
        [
            "k26ops.errors",
            "k26ops.layout",
            "k26ops.shell",
            "k26ops.interrupt",
            "k26ops.resources",
            "k26ops.config",
            "k26ops.hostvars",
            "k26ops.runstate",
            "k26ops.safefiles",
        ],
    ),
    (
        "data",
        "inventory, recipes, locks' data, units, flag tables, parsers, crash signatures",
        [
            "k26ops.inventory",
            "=k26ops.engine",
            "k26ops.engine.profile_table",
            "k26ops.engine.launch",
            "k26ops.engine.systemd",
            "k26ops.engine.secret_policy",
            "k26ops.engine.units",
            "k26ops.release.recipe",
            "k26ops.release.inputs",
            "k26ops.release.engine_flags",
            "k26ops.release.launch_rules",
            "k26ops.release.patchset",
            "=k26ops.release",
            "k26ops.engine.multinode",
            "k26ops.diagnose.chains",
            "k26ops.diagnose.signatures",
            "k26ops.diagnose.details",
            "k26ops.diagnose.classify",
            "k26ops.diagnose.logtext",
            "k26ops.diagnose.logread",
            "=k26ops.diagnose",
            "k26ops.facts",
            "k26ops.steps.driver_plan",
            "k26ops.engine.state",
            "k26ops.baselines.validate",
            "k26ops.weights.manifest",
            "k26ops.weights.plan",
        ],
    ),
    (
        "transport",
        "ssh sessions, the agent protocol, the fleet runner",
        ["k26ops.transport", "k26ops.agents", "k26ops.traffic.gateway"],
    ),
    (
        "host",
        "one host: engine layout and profile, facts gathered, preflight, lock, ownership, release I/O",
        [
            "=k26ops.facts",
            "k26ops.engine.host",
            "k26ops.engine.profile",
            "k26ops.host",
            "k26ops.release.wheelhouse",
            "k26ops.release.wheelsource",
            "k26ops.release.engine_source",
            "k26ops.release.prepcache",
            "k26ops.release.enginelock",
            "k26ops.release.installer",
            "k26ops.baselines.repo",
            "k26ops.baselines.hostscript",
            "k26ops.diagnose.journal",
            "k26ops.traffic",
            "k26ops.weights",
        ],
    ),
    (
        "steps",
        "idempotent steps (plan/apply), the engine bench, the None-field probe",
        [
            "k26ops.steps",
            "k26ops.rehearsal.plan",
            "k26ops.enginebench.run",
            "k26ops.enginebench.figures",
            "k26ops.enginebench.accept",
            "k26ops.diagnose.probe",
        ],
    ),
    (
        "orchestration",
        "playbooks, rollouts (canary, batches), provisioning",
        ["k26ops.orchestrate", "k26ops.weights.sync"],
    ),
    (
        "features",
        "baselines, rehearsal, bench gate, self-test, the lab, report, monitoring",
        [
            "k26ops.baselines",
            "k26ops.rehearsal",
            "k26ops.enginebench",
            "k26ops.selftest",
            "k26ops.lab",
            "k26ops.report",
            "k26ops.monitoring",
        ],
    ),
    ("cli", "the only layer that prints or exits", ["k26ops.cli", "k26ops.__main__", "=k26ops"]),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT)
        if ("agents" in rel.parts and p.name != "__init__.py") or "fixtures" in rel.parts:
            continue
        if rel.as_posix() == "k26ops/_version.py":  # setuptools-scm writes it at install (git-ignored; CI's
            continue  # `pip install -e` makes it): generated, imports nothing
        name = ".".join(rel.with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


MODS = _modules()


def layer_of(mod: str) -> int | None:
    best = None
    for i, (_name, _why, entries) in enumerate(LAYERS):
        for e in entries:
            exact = e.startswith("=")
            p = e.lstrip("=")
            if mod == p or (not exact and mod.startswith(p + ".")):
                if best is None or (len(p), exact) > best[1]:  # "=name" wins over its own prefix
                    best = (i, (len(p), exact))
    return best[0] if best else None


def _targets(cur: str, node) -> list[str]:
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name.split(".")[0] == "k26ops"]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = cur.split(".") if MODS[cur].name == "__init__.py" else cur.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            m = ".".join(base + ([node.module] if node.module else []))
        else:
            m = node.module or ""
        if m.split(".")[0] == "k26ops":
            subs = [f"{m}.{a.name}" for a in node.names if f"{m}.{a.name}" in MODS]
            names = subs + ([m] if len(subs) < len(node.names) else [])
    out = []
    for m in names:
        while m not in MODS and "." in m:
            m = m.rsplit(".", 1)[0]
        if m in MODS and m != cur:
            out.append(m)
    return out


def imports() -> dict[str, dict[str, int]]:
    """module -> {imported module: line}, function-level imports included (a fresh copy:
    a test may change it; the tree is parsed once per run)."""
    return {name: dict(deps) for name, deps in _parsed_imports().items()}


@functools.cache
def _parsed_imports() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODS.items():
        deps = graph.setdefault(name, {})
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(name, node):
                    deps.setdefault(t, node.lineno)
    return graph


def test_every_module_has_a_layer():
    assert [m for m in MODS if layer_of(m) is None] == []


def upward(graph) -> list[str]:
    return [
        f"{a} (line {line}, {LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, deps in sorted(graph.items())
        for b, line in sorted(deps.items())
        if layer_of(b) > layer_of(a)
    ]


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down():
    assert upward(imports()) == []


def test_no_import_cycle():
    assert cycles(imports()) == []


def test_the_rules_catch_an_upward_import_and_a_cycle():
    """The checks themselves, on a graph with one upward edge that closes a cycle."""
    graph = imports()
    graph["k26ops.errors"] = {**graph["k26ops.errors"], "k26ops.steps": 1}
    assert upward(graph) == ["k26ops.errors (line 1, base) imports k26ops.steps (steps)"]
    assert any("k26ops.errors" in c and "k26ops.steps" in c for c in cycles(graph))


# A function-level import says why it is not at the top, on its line or the comment line
# above its block of imports: `# lazy: git costs 60 ms at CLI start`, `# host: runs where
# torch is`, `# cycle: ...` (none should be left).
REASON = re.compile(r"#\s*(?!noqa\b|type:)[a-z][a-z -]*:\s*\S")


def unexplained_function_imports(text: str, name: str) -> list[str]:
    """`name:line: import` for each import inside a function with no reason beside it."""
    lines = text.splitlines()
    out = []
    for fn in ast.walk(ast.parse(text, filename=name)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if any(REASON.search(lines[i - 1]) for i in range(node.lineno, node.end_lineno + 1)):
                continue
            i = node.lineno - 1  # up over the block of imports (and blank lines) to its comment
            while i > 0 and (
                not lines[i - 1].strip()
                or re.match(r"\s*(from \S+ )?import ", lines[i - 1])
                or lines[i - 1].strip().startswith(")")
            ):
                i -= 1
            if i > 0 and REASON.search(lines[i - 1]) and lines[i - 1].strip().startswith("#"):
                continue
            out.append(f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(set(out))


def test_function_level_imports_say_why():
    """Imports sit at module top unless a reason is written beside them."""
    assert [
        u for p in MODS.values() for u in unexplained_function_imports(p.read_text(), str(p.relative_to(ROOT)))
    ] == []


def test_the_reason_rule_catches_a_bare_function_import():
    text = (
        "def f():\n    import json\n\n\ndef g():\n    # lazy: costs 1 s\n    import json\n\n"
        "    from os import path\n\n\ndef h():\n    import json  # cycle: a -> b\n    # no reason\n"
        "    import os\n\n\ndef k():\n    import re  # noqa: F401\n"
    )
    assert unexplained_function_imports(text, "m.py") == [
        "m.py:15: import os",
        "m.py:19: import re  # noqa: F401",
        "m.py:2: import json",
    ]


def diagram() -> str:
    """README's layer diagram, top layer first."""
    import textwrap

    width = max(len(name) for name, _w, _e in LAYERS)
    rows = []
    for name, why, entries in reversed(LAYERS):
        mods = sorted(
            (e.lstrip("=").removeprefix("k26ops.").removeprefix("k26ops") or "k26ops")
            + (" (package)" if e.startswith("=") and e != "=k26ops" else "")
            for e in entries
        )
        body = textwrap.wrap(f"{why}: {', '.join(mods)}", 88 - width - 2)
        rows.append("\n".join(f"{name if i == 0 else '':<{width}}  {line}" for i, line in enumerate(body)))
    return "\n  |  imports only from below\n".join(rows)


def commands_importing_commands(graph) -> list[str]:
    return [
        f"{a} (line {line}) imports {b}"
        for a, deps in sorted(graph.items())
        if a.startswith("k26ops.cli.commands.")
        for b, line in sorted(deps.items())
        if b.startswith("k26ops.cli.commands.")
    ]


def test_a_command_imports_no_other_command():
    """Options and renderers two commands share live in k26ops.cli (benchopts, changes,
    rehearseopts, batchopts, tables ...), never in one command's module for another to import."""
    graph = imports()
    assert commands_importing_commands(graph) == []
    graph["k26ops.cli.commands.deploy"]["k26ops.cli.commands.bench"] = 1  # the rule catches one
    assert commands_importing_commands(graph) == [
        "k26ops.cli.commands.deploy (line 1) imports k26ops.cli.commands.bench"
    ]


def test_readme_diagram_is_the_layer_table():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- layers: made by tests/architecture/test_layers.py -->\n```\n(.*?)\n```", text, re.S)
    assert m, "README.md lacks the layer diagram block"
    assert m.group(1) == diagram(), "README's layer diagram differs; paste:\n" + diagram()


if __name__ == "__main__":  # print the diagram for README.md
    print(diagram())
