"""The benchmarks run from any checkout (issue 45 item 9): no folder under bench/ shadows a
package a bench script imports (bench/ is the scripts' sys.path[0]: a `bench/ansible/` folder
was imported as a namespace package in place of a missing ansible-core), and a missing
ansible-core is named with the command that installs it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def _imported_top_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_bench_folder_shadows_an_imported_package():
    scripts = {p.stem for p in BENCH.glob("*.py")}
    imported = set().union(*(_imported_top_names(p) for p in BENCH.glob("*.py"))) - scripts
    folders = {d.name for d in BENCH.iterdir() if d.is_dir() and not d.name.startswith((".", "_"))}
    assert not folders & imported, f"bench/ folders named like an imported package: {sorted(folders & imported)}"


def test_converged_bench_says_how_to_install_a_missing_ansible_core():
    code = (
        "import sys, importlib.metadata as m\n"
        "real = m.version\n"
        "def version(name):\n"
        "    if name == 'ansible-core': raise m.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "m.version = version\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import converged\n"
        "converged.ensure_ansible()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "needs ansible-core" in proc.stderr and "pip install 'ansible-core>=2.16'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_module_a_bench_script_imports_is_there():
    """A bench script imports from bench/, the checkout and tests/ (labtools); a module it names that
    is gone fails here, not when someone runs the benchmark (bench/inventory_load.py imported the
    bounds test module by its old top-level name after the tests moved into folders)."""
    import importlib.util

    repo = BENCH.parent
    missing = []
    saved = list(sys.path)
    sys.path[:0] = [str(BENCH), str(repo), str(repo / "tests")]
    try:
        for path in sorted(BENCH.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level
                    else []
                )
                for name in names:
                    try:
                        found = importlib.util.find_spec(name) is not None
                    except ModuleNotFoundError:
                        found = False
                    if not found:
                        missing.append(f"{path.name}:{node.lineno}: {name}")
    finally:
        sys.path[:] = saved
    assert not missing, missing
