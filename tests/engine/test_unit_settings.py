"""unit_settings takes any systemd [Service] directive in systemd's spelling (issue 45 item 4):
known ones reach the unit, an unknown key is a one-line error naming it, a non-root engine's
User= is checked before a deploy (the engine_user fact, on outputs recorded on Debian 12), and a
start failure names systemd's own exit status (217/USER, 203/EXEC)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k26ops.engine import units
from k26ops.engine.state import engine_state, exit_status_text
from k26ops.errors import UserError
from k26ops.facts.engine_user import parse_engine_user
from k26ops.host import preflight
from labtools.invoke import cli

DATA = Path(__file__).parent.parent / "data" / "facts"


def _unit(settings: dict) -> str:
    return units.render_unit({**units.unit_settings(settings), "argv": ["/bin/true"]})


def test_any_service_directive_reaches_the_unit_in_systemds_spelling():
    text = _unit(
        {
            "CPUAffinity": "0-7",
            "Nice": 5,
            "NoNewPrivileges": True,
            "User": "sglang",
            "RestartSec": 3,
            "MemoryMax": "900G",
            "ReadWritePaths": ["/data/a", "/data/b"],
        }
    )
    lines = text.splitlines()
    for line in (
        "CPUAffinity=0-7",
        "Nice=5",
        "NoNewPrivileges=yes",
        "User=sglang",
        "RestartSec=3",
        "MemoryMax=900G",
        "ReadWritePaths=/data/a",
        "ReadWritePaths=/data/b",
    ):
        assert line in lines, text
    assert lines.count("RestartSec=3") == 1 and "RestartSec=10" not in lines  # the template's own, replaced
    service = text.split("[Service]")[1].split("[Install]")[0]
    assert "CPUAffinity=0-7" in service
    assert "StartLimitBurst=5" in _unit({"StartLimitBurst": 5}).split("[Service]")[0]  # a [Unit] one, by alias


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"Bogus": 1}, "unit_settings: Bogus: not a systemd [Service] directive"),
        (
            {"CPUAfinity": "0-7"},
            "unit_settings: CPUAfinity: not a systemd [Service] directive; did you mean CPUAffinity?",
        ),
        ({"cpu_affinity": "0-7"}, "unit_settings: cpu_affinity: not a systemd [Service] directive"),
        ({"ExecStart": "/bin/sh"}, "unit_settings: ExecStart: set by the profile, not by unit_settings"),
        ({"RestartSec": "5s"}, "unit_settings: RestartSec: expected a non-negative number of seconds, got '5s'"),
        ({"Nice": {"a": 1}}, "unit_settings: Nice: expected a word, number, yes/no or a list of them"),
        ({"Nice": "5\nExecStartPre=/bin/evil"}, "control character"),
    ],
)
def test_an_unknown_or_bad_setting_is_one_line_naming_it(settings, message):
    with pytest.raises(UserError) as exc:
        units.unit_settings(settings)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_deploy_refuses_bogus_in_one_line_and_changes_nothing(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "here": {
                        "connection": "local",
                        "vars": {
                            "recipe": "lab",
                            "model_path": "/models/x",
                            "unit_settings": {"CPUAffinity": "0-7", "Bogus": 1},
                        },
                    }
                }
            }
        )
    )
    proc = cli("-i", str(inv), "deploy", "-C")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "k26ops: error: here: unit_settings: Bogus: not a systemd [Service] "
        "directive (systemd.exec(5), systemd.service(5), systemd.resource-control(5) "
        "name them)"
    ], proc.stderr


def test_engine_user_fact_on_recorded_outputs_and_its_check():
    missing = parse_engine_user((DATA / "debian12-engine-user-missing.txt").read_text(), 0)
    assert missing["exists"] is False
    c = preflight.engine_user_check(missing, "sglang")
    assert not c.ok and "217/USER" in c.detail and "does not exist" in c.detail
    nobody = parse_engine_user((DATA / "debian12-engine-user-nobody.txt").read_text(), 0)
    assert nobody == {
        "exists": True,
        "uid": 65534,
        "readable": ["/etc/passwd"],
        "denied": ["/root"],
        "absent": ["/nonexistent/model"],
        "error": None,
    }
    c = preflight.engine_user_check(nobody, "nobody")
    assert not c.ok and "cannot read /root" in c.detail and "setfacl" in c.detail
    ok = preflight.engine_user_check({**nobody, "denied": []}, "nobody")
    assert ok.ok and ok.name in preflight.DEPLOY_CHECKS
    assert preflight.engine_user({"unit_settings": {"User": "sglang"}}) == "sglang"
    assert preflight.engine_user({"unit_settings": {"user": "root"}}) is None
    want = {
        "model_path": "/models/m",
        "drafter": {"path": "/models/d"},
        "user": "sglang",
        "releases_root": "/opt/k26ops/releases",
    }
    assert [f.name for f in preflight.engine_facts(want)] == ["model", "drafter", "engine_user"]
    assert preflight.engine_user_paths(want) == ["/models/m", "/models/d", "/opt/k26ops/releases"]


def test_a_start_failure_names_systemds_exit_status():
    assert exit_status_text(217).startswith("217/USER (the unit's User= does not exist")
    assert exit_status_text(203).startswith("203/EXEC")
    assert exit_status_text(1) == "1"
    s = engine_state(
        {
            "ActiveState": "failed",
            "SubState": "failed",
            "Result": "exit-code",
            "ExecMainStatus": 217,
            "UnitFileState": "enabled",
            "LoadState": "loaded",
            "NRestarts": 1,
        },
        None,
        None,
        "k.service",
    )
    assert "exit status 217/USER" in s.label()
