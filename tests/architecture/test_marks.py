"""The marks conftest.py applies by rule: a test that uses an outer-loop fixture
(`real_index`, `full_size`) is marked `outer` and `lab`, so `pytest -m "not lab"` (the
inner loop) leaves it out and the full suite still runs it."""

from __future__ import annotations

import subprocess
import sys

from labtools import REPO
from labtools.order import file_order, whole_file_seconds


def _collected(*args: str) -> list[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/inventory/test_inventory_bounds.py",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [ln.split("::")[1] for ln in proc.stdout.splitlines() if "::" in ln]


def test_an_outer_fixture_keeps_a_test_out_of_the_inner_loop():
    """(One collection, not four: this test is in the inner loop itself.)"""
    inner = set(_collected("-m", "not lab"))
    assert "test_ten_thousand_hosts_load" in inner and "test_alias_bomb_is_refused_in_under_a_second" in inner
    assert not inner & {
        "test_aliases_just_under_the_value_limit_list_and_show_in_seconds",
        "test_hosts_just_under_the_size_limit_list_in_seconds",
    }


def test_no_test_module_imports_conftest_or_another_test_module():
    """Shared helpers live in tests/labtools/ (issue 32 item 6): a test module that imports
    conftest.py or another test module runs that module's top level twice, under two names
    (pytest loads conftest and test modules itself), and hides where a helper lives."""
    import ast  # lazy: this test only

    tests = REPO / "tests"
    found = []
    for path in sorted(p for p in tests.rglob("*.py") if "data" not in p.relative_to(tests).parts):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{path.relative_to(tests)}:{node.lineno}: {n}"
                for n in names
                if any(part == "conftest" or part.startswith("test_") for part in n.split("."))
            ]
    assert not found, "import a helper from labtools instead:\n" + "\n".join(found)


def test_the_longest_files_go_first_and_a_file_keeps_its_order():
    ids = [
        "tests/a.py::t1",
        "tests/a.py::t2",
        "tests/lab_new.py::t1",
        "tests/b.py::t1",
        "tests/lab_old.py::t1",
        "tests/lab_old.py::t2",
        "tests/c.py::t1",
        "tests/lab_new.py::t2",
    ]
    lab = {"tests/lab_new.py", "tests/lab_old.py"}
    seconds = {"tests/a.py": 2.0, "tests/b.py": 90.0, "tests/lab_old.py": 30.0}
    order = [ids[i] for i in file_order(ids, lab, seconds)]
    assert order == [
        "tests/b.py::t1",  # 90 s recorded
        "tests/lab_new.py::t1",
        "tests/lab_new.py::t2",  # a lab file with no record: 60 s
        "tests/lab_old.py::t1",
        "tests/lab_old.py::t2",  # 30 s
        "tests/a.py::t1",
        "tests/a.py::t2",  # 2 s
        "tests/c.py::t1",
    ]  # no record, no lab test: last
    # a fresh checkout: the lab files first, each in collection order
    assert [ids[i] for i in file_order(ids, lab, {})][:4] == [
        "tests/lab_new.py::t1",
        "tests/lab_new.py::t2",
        "tests/lab_old.py::t1",
        "tests/lab_old.py::t2",
    ]


def test_only_whole_files_are_recorded():
    run = {"tests/test_a.py": 1.234, "tests/test_b.py": 50.0}
    assert whole_file_seconds(run, ["tests"], selected=False) == {"tests/test_a.py": 1.2, "tests/test_b.py": 50.0}
    assert whole_file_seconds(run, ["tests"], selected=True) == {}  # -k or -m: parts of files
    assert whole_file_seconds(run, ["tests/test_b.py::test_x", "tests/test_a.py"], selected=False) == {
        "tests/test_a.py": 1.2
    }
    assert whole_file_seconds(run, ["/work/main/tests/test_b.py::test_x"], selected=False) == {"tests/test_a.py": 1.2}
