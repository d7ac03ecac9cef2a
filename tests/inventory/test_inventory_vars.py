"""Every inventory setting is known: the variables each reading module declares
(k26ops.hostvars) cover what the code reads, docs/reference/inventory.md is generated from
them, and a key nothing reads is a warning naming the nearest known one (an error
with --strict)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from k26ops.cli import cli, hoist_global_flags
from k26ops.inventory import load, variables
from labtools.source import parsed

ROOT = Path(__file__).resolve().parent.parents[1]


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch):
    monkeypatch.setenv("K26OPS_SSH_CONFIG", "")


def _run(*args):
    return CliRunner().invoke(cli, hoist_global_flags(list(args)))


def test_docs_inventory_md_is_generated_from_the_registry():
    doc = (ROOT / "docs/reference/inventory.md").read_text()
    assert doc == variables.markdown(), "regenerate: k26ops inventory vars --markdown > docs/reference/inventory.md"
    assert _run("inventory", "vars", "--markdown").stdout == doc


# How k26ops code reads an inventory variable: `vars.get("x")`, `hv["x"]`, `"x" in vars`
# (on the names the code gives a host's vars), or `hvars.get("x", ...)`.
_VARS = r"(?:vars|hv|hvars|host_vars|values)"
READS = (
    re.compile(r"\b" + _VARS + r"(?:\.get\(|\[)\"([A-Za-z_][A-Za-z0-9_]*)\""),
    re.compile(r"\"([A-Za-z_][A-Za-z0-9_]*)\" (?:not )?in " + _VARS + r"\b"),
)


def variables_read(text: str) -> set[str]:
    return {name for pattern in READS for name in pattern.findall(text)}


def test_every_variable_the_code_reads_is_declared():
    """Any `vars.get("x")`, `hv.get("x")`, `host_vars["x"]`, `"x" in vars`... in k26ops/
    is declared by some module (k26ops.hostvars.declare). Host agents read their own
    JSON requests, not inventories; `_x` keys are k26ops' own per-run values."""
    read = set()
    for path in (ROOT / "k26ops").rglob("*.py"):
        if "agents" in path.parts and path.name != "__init__.py":
            continue
        read |= variables_read(path.read_text())
    read = {n for n in read if not n.startswith("_")}
    missing = sorted(n for n in read if not variables.is_read(n))
    assert len(read) > 40 and not missing, missing


def test_the_read_patterns_find_reads():
    """The patterns themselves: each way of reading is seen, a plain dict key is not."""
    text = (
        'a = ctx.vars.get("x1"); b = hv["x2"]; c = hvars.get("x3", 3)\nif "x4" in vars: pass\nd = params.get("nope")\n'
    )
    assert variables_read(text) == {"x1", "x2", "x3", "x4"}


def _declaring_modules() -> set[str]:
    """Modules whose source calls `declare(` (k26ops.hostvars) at module level."""
    out = set()
    for path in (ROOT / "k26ops").rglob("*.py"):
        for node in parsed(path).body:
            call = getattr(node, "value", None)
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "declare":
                rel = path.relative_to(ROOT).with_suffix("")
                out.add(".".join(rel.parts).removesuffix(".__init__"))
    return out


def test_the_cli_imports_every_declaring_module():
    """k26ops.cli.readers imports each module that declares variables, so the registry the
    CLI checks an inventory against is whole whatever command runs."""
    from k26ops.cli import readers

    tree = ast.parse(Path(readers.__file__).read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported |= {f"{node.module}.{a.name}" for a in node.names}
    declaring = _declaring_modules()
    assert "k26ops.layout" in declaring and "k26ops.steps.engine" in declaring
    assert sorted(declaring - imported) == []
    assert {v.module for v in variables.variables()} == declaring


def test_declared_defaults_are_the_codes():
    """The table shows what the code does when a variable is unset."""
    from k26ops import layout
    from k26ops.host import preflight
    from k26ops.layout import Layout
    from k26ops.release import installer, wheelsource
    from k26ops.steps import driver, engine

    by_name = {v.name: v for v in variables.variables()}
    assert by_name["k26ops_root"].default == Layout.of({}).root == layout.DEFAULT_ROOT
    assert preflight.expectations({})["gpus_per_host"] == by_name["gpus_per_host"].default
    assert installer.choice({}) == by_name["release_installer"].default
    assert driver.want({}, {})["branch"] == by_name["nvidia_driver_branch"].default
    assert by_name["health_timeout"].default == engine.DEFAULT_HEALTH_TIMEOUT
    assert by_name["wheel_peer_port"].default == wheelsource.DEFAULT_PEER_PORT


@pytest.mark.parametrize("name", ["example-rtxpro6000.yml", "example-ansible.yml"])
def test_example_inventories_have_no_unknown_keys(name):
    inv = load(ROOT / "inventory" / name, ssh_config=None)
    assert inv.unknown_vars == [] and not any("unknown" in w for w in inv.warnings)


def _typo_inventory(tmp_path, shape="native"):
    p = tmp_path / "inv.yml"
    if shape == "native":
        p.write_text(
            "vars:\n  releases_dir: /srv/r\n  grafana_url: x\nhosts:\n  a:\n    address: 127.0.0.1\n"
            "    port: 1\n    vars:\n      engine_service: e.service\n"
        )
    else:
        p.write_text(
            "all:\n  vars:\n    releases_rot: /srv/r\n    grafana_url: x\n    ansible_python_interpreter: /usr/bin/python3\n"
            "  hosts:\n    a:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
        )
    return p


def test_unknown_key_warns_with_the_nearest_name_in_text_and_json(tmp_path):
    p = _typo_inventory(tmp_path)
    text = _run("inventory", "list", "-i", str(p))
    assert text.exit_code == 0, text.stderr
    lines = text.stderr.splitlines()
    assert f"k26ops: warning: {p}:2: vars: releases_dir: unknown; did you mean releases_root?" in lines
    assert f"k26ops: warning: {p}:9: host a: engine_service: unknown; did you mean engine_unit?" in lines
    assert f"k26ops: warning: {p}:3: vars: grafana_url: unknown; k26ops does not read it" in lines
    doc = json.loads(_run("inventory", "list", "-i", str(p), "--json").stdout)
    assert any(w.endswith("releases_dir: unknown; did you mean releases_root?") for w in doc["warnings"])


def test_ansible_shape_warns_only_about_likely_typos(tmp_path):
    inv = load(_typo_inventory(tmp_path, "ansible"), ssh_config=None)
    assert [w.split(": ", 2)[-1] for w in inv.unknown_vars] == ["releases_rot: unknown; did you mean releases_root?"]


def test_strict_makes_an_unknown_key_an_error(tmp_path):
    p = _typo_inventory(tmp_path)
    for args in (["--strict", "inventory", "list", "-i", str(p)], ["inventory", "list", "--strict", "-i", str(p)]):
        res = _run(*args)
        assert res.exit_code == 2 and res.stdout == ""
        err = res.stderr.splitlines()[-1]
        assert err.startswith(f"k26ops: error: {p}:2: vars: releases_dir: unknown") and "(--strict)" in err


def test_check_warns_in_text_and_json_and_strict_stops_before_connecting(tmp_path):
    p = _typo_inventory(tmp_path)  # host a: 127.0.0.1:1, nothing listens
    res = _run("-i", str(p), "--connect-timeout", "2", "check", "--json")
    doc = json.loads(res.stdout)
    assert any("releases_dir: unknown" in w for w in doc["warnings"])
    assert "releases_dir: unknown" in res.stderr
    strict = _run("-i", str(p), "--strict", "check")
    assert strict.exit_code == 2 and "(--strict)" in strict.stderr and "unreachable" not in strict.stdout
