"""One JSON shape for every command (docs/reference/json.md): the envelope and each
command's schema, errors included, through the real CLI. (Commands that need
hosts are checked the same way by labtools.invoke.k26ops_json in their own tests.)"""

from __future__ import annotations

import json

import pytest
from jsonshape import SCHEMAS, schema, validate

from labtools import REPO
from labtools.invoke import cli, cli_json

INVENTORY = """\
all:
  vars: {releases_dir: /data/releases}
  children:
    gpu:
      hosts:
        rtx01: {ansible_host: 127.0.0.1, ansible_port: 1}
"""
LOG = REPO / "tests/data/logs/capture_oom_tp8.log"


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "inv.yml"
    p.write_text(INVENTORY)
    return p


def test_every_schema_is_a_valid_schema():
    import jsonschema

    names = sorted(p.name for p in SCHEMAS.glob("*.schema.json"))
    assert "envelope.schema.json" in names and len(names) > 20
    for name in names:
        jsonschema.Draft202012Validator.check_schema(json.loads((SCHEMAS / name).read_text()))


@pytest.mark.parametrize(
    "args",
    [
        ["inventory", "list"],
        ["inventory", "show", "rtx01"],
        ["inventory", "vars"],
        ["config", "show"],
        ["diagnose", "log", str(LOG)],
        ["baselines", "list"],
        ["lab", "status"],
    ],
)
def test_commands_without_hosts(inv, tmp_path, args):
    (tmp_path / "config.toml").write_text("")
    env = {
        "K26OPS_INVENTORY": str(inv),
        "K26OPS_BASELINES": str(tmp_path / "none"),
        "K26OPS_LAB_DIR": str(tmp_path / "nolab"),
        "K26OPS_CONFIG": str(tmp_path / "config.toml"),
    }
    rc, doc = cli_json(*args, env=env)  # validates envelope + the command's schema, exit code
    assert doc["command"] == " ".join(a for a in args[:2] if not a.startswith(("/", "rtx")))
    assert doc["ok"] is (rc == 0)


def test_inventory_list_keeps_its_keys_and_warnings(inv):
    rc, doc = cli_json("inventory", "list", env={"K26OPS_INVENTORY": str(inv)})
    assert rc == 0 and doc["command"] == "inventory list" and doc["ok"] is True
    assert list(doc["hosts"]) == ["rtx01"] and doc["hosts"]["rtx01"]["port"] == 1
    assert any("releases_dir: unknown" in w for w in doc["warnings"])


def test_a_diagnosis_that_exits_1_says_so(tmp_path):
    log = tmp_path / "x.log"
    log.write_text((REPO / "tests/data/logs/sglang_nextn_arange_power_of_2.log").read_text())
    rc, doc = cli_json("diagnose", "log", str(log))
    assert rc == 1 and doc["ok"] is False and doc["exit_code"] == 1 and doc["signature"] == "unclassified"


@pytest.mark.parametrize(
    "args, says",
    [
        (["-i", "/nonexistent/inv.yml", "status"], "cannot read inventory"),
        (["status", "--bogus"], "No such option '--bogus'"),
        (["inventory", "list", "-l", "nosuch"], "nosuch"),
        (["diagnose", "log", "/nonexistent.log"], "no such file"),
        (["--forks", "0", "status"], "--forks"),
    ],
)
def test_errors_are_json_on_stdout_with_the_line_on_stderr(inv, args, says):
    proc = cli("--json", *args, env={"K26OPS_INVENTORY": str(inv)})
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["ok"] is False and doc["exit_code"] == 2 and says in doc["error"], doc
    assert proc.stderr.splitlines()[-1] == f"k26ops: error: {doc['error']}"


def test_an_error_before_the_command_runs_still_names_it(tmp_path):
    proc = cli("--json", "inventory", "list", env={"K26OPS_CONFIG": str(tmp_path / "none.toml")})
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["command"], doc["ok"]) == (2, "inventory list", False)
    assert "K26OPS_CONFIG: no such file" in doc["error"]


def test_json_after_the_command_gives_the_error_document_too(inv):
    proc = cli("status", "--json", "-l", "nosuch", env={"K26OPS_INVENTORY": str(inv)})
    doc = json.loads(proc.stdout)
    assert (proc.returncode, doc["command"], doc["exit_code"]) == (2, "status", 2)


def test_logs_follow_records_schema():
    import jsonschema

    rec = schema("logs-follow")
    jsonschema.validate({"host": "lab1", "lines": ["a"]}, rec)
    with pytest.raises(jsonschema.ValidationError):  # never an empty record
        jsonschema.validate({"host": "lab1", "lines": []}, rec)


def test_without_json_an_error_prints_nothing_on_stdout(inv):
    proc = cli("-i", "/nonexistent.yml", "status")
    assert proc.returncode == 2 and proc.stdout == ""


def test_every_command_has_a_schema():
    import click

    from k26ops.cli import cli

    def leaves(cmd, path):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from leaves(sub, path + [name])
        else:
            yield " ".join(path)

    missing = [n for n in leaves(cli, []) if not (SCHEMAS / f"{n.replace(' ', '-')}.schema.json").exists()]
    assert missing == [], f"commands without a docs/json schema: {missing}"
    for n in leaves(cli, []):
        assert schema(n.replace(" ", "-"))["properties"]["command"] == {"const": n}


def test_a_healthy_log_is_signature_null_and_the_schema_tells_it_from_unknown():
    """`diagnose log --json` on a real healthy vLLM log: exit 0, signature null; the schema
    refuses the old shape (error_found false with signature "unclassified")."""
    rc, doc = cli_json("diagnose", "log", str(REPO / "tests/data/logs/vllm_request_errors_kept_serving.log"))
    assert rc == 0 and doc["ok"] is True and doc["signature"] is None and doc["error_found"] is False
    import jsonschema

    schema = json.loads((SCHEMAS / "diagnose-log.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(doc))
    assert list(validator.iter_errors({**doc, "signature": "unclassified"}))
    assert list(validator.iter_errors({**doc, "error_found": True}))  # an error needs its signature
