"""labtools.invoke.cli, the in-process CLI the pure tests use: it answers as the real
`python -m k26ops` does (exit code, stdout, stderr), and one call leaves
nothing behind for the next (environment, cwd, argv, signal handlers, the
run's module state)."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import yaml

from labtools.invoke import cli, k26ops


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["deploy", "--bogus"],  # click's usage error: one line, exit 2
        ["--json", "-i", "/nonexistent/inv.yml", "status"],  # UserError under --json: the document on stdout
        ["status", "--json", "--forks=0"],  # --json after the command, a bad value
    ],
)
def test_in_process_answers_as_the_real_process(args):
    real, here = k26ops(*args, env={"COLUMNS": "120"}), cli(*args, env={"COLUMNS": "120"})
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)


def test_a_call_leaves_no_state_for_the_next(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(
        yaml.safe_dump(
            {"vars": {"secret_vars": ["MY_PASSPHRASE"]}, "hosts": {"gpu1": {"address": "127.0.0.1", "port": 9}}}
        )
    )
    before = (
        dict(os.environ),
        os.getcwd(),
        list(sys.argv),
        signal.getsignal(signal.SIGTERM),
        signal.getsignal(signal.SIGHUP),
    )
    proc = cli("--json", "inventory", "list", env={"K26OPS_INVENTORY": str(inv), "K26OPS_X": "1"})
    assert proc.returncode == 0, proc.stderr
    from k26ops.cli import jsonout
    from k26ops.engine import secret_policy

    assert (
        dict(os.environ),
        os.getcwd(),
        list(sys.argv),
        signal.getsignal(signal.SIGTERM),
        signal.getsignal(signal.SIGHUP),
    ) == before
    assert secret_policy.in_force() == secret_policy.SecretPolicy() and jsonout.CURRENT["command"] == ""
    # the next call does not see the first one's --json nor its inventory
    again = cli("inventory", "list")
    assert not again.stdout.startswith("{") and str(inv) not in again.stdout + again.stderr


def test_a_crash_is_a_traceback_and_exit_1_as_in_a_real_run(monkeypatch):
    """What the tests that say "never a traceback" look for must show in-process too."""
    from k26ops.cli import context

    def boom(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(context.Settings, "inventory_path", boom)
    proc = cli("status")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "RuntimeError: boom" in proc.stderr
