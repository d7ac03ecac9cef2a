"""Running k26ops as a user would (a subprocess) or in-process, and ssh to a lab host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from k26ops.lab.access import ssh_argv
from labtools import REPO


def lab_ssh(
    lab_dir: Path, port: int, command: str, timeout: float = 60, user: str = "root", known_hosts: Path | None = None
) -> subprocess.CompletedProcess:
    """OpenSSH with the lab's key and known_hosts (or `known_hosts`), strict host key checking."""
    return subprocess.run(
        ssh_argv(lab_dir, port, command, user=user, known_hosts=known_hosts),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def k26ops(*args: str, env: dict | None = None, timeout: float = 600, input: str | None = None):
    """Run the real CLI in a subprocess (as a user would)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "k26ops", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=REPO,
        input=input,
    )


def cli(
    *args: str,
    env: dict | None = None,
    timeout: float | None = None,
    input: str | None = None,
    cwd: Path | str | None = None,
):
    """Run the CLI in this process (no interpreter start: ~0.8 s saved a call), for
    tests that never reach a host. Same result as `k26ops()`: returncode, stdout,
    stderr. Keep `k26ops()` where the test needs a real process: signals, real
    pipes or a TTY, a host (threads and sessions that may outlive the call).
    `timeout` is accepted for `k26ops()`'s signature and not enforced here."""
    import signal
    import traceback

    from click.testing import CliRunner

    from k26ops import cli as entry

    saved = (list(sys.argv), os.getcwd(), {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)})
    rc = 0
    with CliRunner().isolation(input=input, env=env) as (out, err, _):
        sys.argv = ["k26ops", *args]  # jsonout.wanted() reads it, as in a real run
        os.chdir(cwd or REPO)
        try:
            entry.main()
        except SystemExit as exc:
            code = exc.code
            rc = code if isinstance(code, int) else (0 if code is None else 1)
            if not isinstance(code, (int, type(None))):
                sys.stderr.write(f"{code}\n")
        except Exception:  # what a real run shows as a traceback, exit 1
            sys.stderr.write(traceback.format_exc())
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.argv = saved[0]
            os.chdir(saved[1])
            for sig, handler in saved[2].items():
                signal.signal(sig, handler)
            _forget_run_state()
    return subprocess.CompletedProcess(
        ["k26ops", *args], rc, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
    )


def _forget_run_state() -> None:
    """What one k26ops process keeps in module globals for its one run: a next
    in-process run must start as a fresh process would."""
    from k26ops import interrupt
    from k26ops.cli import jsonout
    from k26ops.engine import secret_policy
    from k26ops.steps import release

    interrupt.requested.clear()
    secret_policy.use(secret_policy.SecretPolicy())
    jsonout.CURRENT["command"] = ""
    release._PREP.clear()
    release._FLAGS.clear()


def cli_json(*args: str, **kw) -> tuple[int, dict]:
    """`k26ops_json` in this process (see `cli`)."""
    return k26ops_json(*args, run=cli, **kw)


def k26ops_json(*args: str, run=None, **kw) -> tuple[int, dict]:
    proc = (run or k26ops)("--json", *args, **kw)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} {proc.stderr!r}")
    from jsonshape import validate

    validate(doc)  # every command's --json has one shape (docs/json)
    assert doc["exit_code"] == proc.returncode, (doc["exit_code"], proc.returncode)
    return proc.returncode, doc
