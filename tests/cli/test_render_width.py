"""Tables at 80 and 200 columns and piped: the values an operator acts on (host,
status, release id, error text) are never cut or folded into one-word cells;
piped output is never wrapped, so `grep ADDRESS` finds whole rows."""

from __future__ import annotations

import re

import pytest

from k26ops.cli.context import Settings
from k26ops.cli.report import print_results
from k26ops.cli.rollout import print_rollout
from k26ops.transport.fleet import HostResult
from labtools.invoke import cli

ANSI = re.compile(r"\x1b\[[0-9;]*m")
HOST = "gpu-rtx01.dc1"
RELEASE = "20261201T101500Z-3f9c2a1b7e4d"
ERROR = (
    "service: engine did not become healthy in 600 s: /health answered 503 and the unit "
    "restarted 3 times (see journal tail)"
)
STATUS_COLS = [
    ("unit", "state"),
    ("health", "health"),
    ("release", "release"),
    ("baseline / drift", "baseline"),
    ("uptime", "uptime"),
    ("model", "model_short"),
    ("restarts", "restarts"),
    ("started", "started"),
]


def _status_results():
    data = dict(
        state="active",
        health="healthy",
        release=RELEASE,
        baseline="prod-2026-11-30",
        uptime="1h02m",
        model_short="Kimi-K2.6-Instruct-FP8",
        restarts=0,
        started="2026-12-01 10:15:02",
    )
    sick = dict(
        data, health="no answer", state="activating", baseline="drift: 3 files differ from the release manifest"
    )
    return [
        HostResult(HOST, "ok", None, dict(data), 1.2),
        HostResult("rtx04", "ok", None, sick, 2.0),
        HostResult("rtx02", "failed", ERROR, {}, 600.4),
        HostResult("rtx03", "unreachable", "bastion jump.example.com: DNS: name does not resolve", {}, 0.1),
    ]


def _render(monkeypatch, capsys, columns: int | None, fn, *args, **kw) -> list[str]:
    if columns:  # a terminal this wide (rich honours TTY_COMPATIBLE and COLUMNS)
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
        monkeypatch.setenv("COLUMNS", str(columns))
    else:  # piped, whatever COLUMNS says
        monkeypatch.setenv("TTY_COMPATIBLE", "0")
        monkeypatch.setenv("COLUMNS", "80")
    fn(*args, **kw)
    out = ANSI.sub("", capsys.readouterr().out)
    return out.splitlines()


@pytest.mark.parametrize("columns", [80, 200, None])
def test_status_table_keeps_hosts_states_releases_and_errors_whole(monkeypatch, capsys, columns):
    lines = _render(
        monkeypatch, capsys, columns, print_results, Settings(), _status_results(), "engine status", STATUS_COLS
    )
    text = "\n".join(lines)
    if columns:
        assert max(map(len, lines)) <= columns, text
    for value in (HOST, RELEASE, "active", "healthy", "unreachable", "failed"):
        assert value in text, (value, text)
    # each error whole after its host, below the table (a terminal wraps it at spaces only)
    if columns:
        assert f"rtx02: {ERROR}" in " ".join(lines), text
    else:
        assert f"rtx02: {ERROR}" in lines, text
    assert "rtx03: bastion jump.example.com: DNS: name does not resolve" in lines, text
    row = next(line for line in lines if HOST in line)
    assert "active" in row and "healthy" in row and RELEASE in row, row
    sick = next(line for line in lines if "rtx04" in line)
    assert "activating" in sick and "no answer" in sick and RELEASE in sick, sick
    if columns == 80:  # something had to give: said so, never silently
        assert "not shown at 80 columns:" in text and "started" in text.split("not shown")[1], text
    else:  # wide enough or piped: every column, every row on one line
        assert "not shown" not in text
        for value in ("prod-2026-11-30", "Kimi-K2.6-Instruct-FP8", "2026-12-01 10:15:02"):
            assert value in row, (value, row)


@pytest.mark.parametrize("columns", [80, 200, None])
def test_rollout_table_with_a_multiline_error(monkeypatch, capsys, columns):
    err = "release: pip install failed\nERROR: No matching distribution found for sglang==9.9.9"
    steps = [{"step": s, "changed": True} for s in ("toolchain", "release", "drafter", "units", "service")]
    results = [
        HostResult(
            "lab1",
            "changed",
            None,
            {
                "release": RELEASE,
                "engine_restarted": True,
                "steps": steps,
                "health": {"state": "healthy", "wait_s": 3.25},
            },
            42.0,
        ),
        HostResult("lab2", "failed", err, {}, 12.0),
    ]
    lines = _render(
        monkeypatch,
        capsys,
        columns,
        print_rollout,
        Settings(),
        results,
        "deploy",
        [("release", "release"), ("changed", "_changed"), ("engine", "_engine"), ("health", "_health")],
    )
    text = "\n".join(lines)
    if columns:
        assert max(map(len, lines)) <= columns, text
    row = next(line for line in lines if "lab1" in line)
    assert "changed" in row and RELEASE in row and "restarted" in row and "healthy 3.2s" in row, row
    if not columns:  # piped: the changed steps on the host's line too
        assert "toolchain, release, drafter, units, service" in row, row
    assert "lab2: release: pip install failed" in lines, text
    assert "lab2: ERROR: No matching distribution found for sglang==9.9.9" in lines, text


def test_too_narrow_for_even_the_kept_values_gives_one_block_per_host(monkeypatch, capsys):
    results = _status_results()
    results[0].host = HOST = "rtx01.a-very-long-hostname.datacenter.example.com"
    lines = _render(monkeypatch, capsys, 80, print_results, Settings(), results, "engine status", STATUS_COLS)
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 80, text
    assert HOST in lines and f"  release: {RELEASE}" in lines, text
    assert "  model: Kimi-K2.6-Instruct-FP8" in lines, text


INVENTORY = """\
all:
  children:
    gpu:
      hosts:
        rtx01.very-long-hostname.datacenter.example.com:
          ansible_host: 10.40.12.11
          ansible_user: deploy-operator
          ansible_ssh_private_key_file: /home/operator/.ssh/keys/production/id_ed25519_rtxpro6000_fleet
        rtx02:
          ansible_host: 10.40.12.12
"""


def test_piped_inventory_list_is_never_wrapped(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    proc = cli("-i", str(path), "inventory", "list", env={"COLUMNS": "80", "TTY_COMPATIBLE": "0"})
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "10.40.12.11" in line]
    assert rows and "rtx01.very-long-hostname.datacenter.example.com" in rows[0], proc.stdout
    assert "/home/operator/.ssh/keys/production/id_ed25519_rtxpro6000_fleet" in rows[0]
    assert "deploy-operator" in rows[0] and "all, gpu" in rows[0]


def test_inventory_list_at_80_columns(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY.replace("rtx01.very-long-hostname.datacenter.example.com", "rtx01"))
    proc = cli("-i", str(path), "inventory", "list", env={"COLUMNS": "80", "TTY_COMPATIBLE": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = ANSI.sub("", proc.stdout).splitlines()
    assert max(map(len, lines)) <= 80, proc.stdout
    row = next(line for line in lines if "10.40.12.11" in line)
    assert "rtx01" in row and "deploy-operator" in row, row
    assert "/home/operator/.ssh/keys/production/id_ed25519_rtxpro6000_fleet" in ANSI.sub("", proc.stdout).replace(
        "\n", ""
    )
