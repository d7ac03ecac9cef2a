"""The marks conftest.py applies by rule: a test that uses an outer-loop fixture
(`real_index`, `full_size`) is marked `outer` and `lab`, so `pytest -m "not lab"` (the
inner loop) leaves it out and the full suite still runs it."""

from __future__ import annotations

import subprocess
import sys

from labtools import REPO


def _collected(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/test_inventory_bounds.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [ln.split("::")[1] for ln in proc.stdout.splitlines() if "::" in ln]


def test_an_outer_fixture_keeps_a_test_out_of_the_inner_loop():
    """(One collection, not four: this test is in the inner loop itself.)"""
    inner = set(_collected("-m", "not lab"))
    assert "test_ten_thousand_hosts_load" in inner and "test_alias_bomb_is_refused_in_under_a_second" in inner
    assert not inner & {"test_aliases_just_under_the_value_limit_list_and_show_in_seconds",
                        "test_hosts_just_under_the_size_limit_list_in_seconds"}
