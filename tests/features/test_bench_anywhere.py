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
