"""Record what a real lab host answers to the deploy steps (the source of the
answers in tests/data/steps/*.json, which tests/engine/test_step_plans.py replays
without a host).

    python3 tests/record_step_answers.py OUT.json     # as root; boots a private 1-host lab

Runs, on a fresh lab host: `deploy --check`, `deploy`, `deploy --check`, and
`provision --check`; every remote command a step runs is recorded with the
agent request (stdin) and the host's answer (exit, stdout, stderr). Not a test
(pytest collects test_*.py only): it is how the cases' answers were taken.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labtools.invoke import cli
from labtools.ports import free_port_block


def main(out: Path) -> None:
    from k26ops.lab.machines import Lab
    from k26ops.transport import ssh

    records: list[dict] = []
    phase = {"name": ""}
    original = ssh.Session.run

    def recording(self, command, *, stdin=None, timeout=None, check=False):
        res = original(self, command, stdin=stdin, timeout=timeout, check=False)
        records.append(
            {
                "phase": phase["name"],
                "command": command,
                "stdin": stdin,
                "exited": res.exited,
                "stdout": res.stdout,
                "stderr": res.stderr,
            }
        )
        if check and not res.ok:
            raise ssh.CommandFailed(self.host.name, command, res)
        return res

    ssh.Session.run = recording
    directory = Path(tempfile.mkdtemp(prefix="k26ops-record-", dir="/var/tmp"))
    lab = Lab(directory)
    try:
        lab.up(1, free_port_block(1), log=lambda m: None)
        env = {"K26OPS_INVENTORY": str(lab.inventory_file), "K26OPS_LAB_DIR": str(directory)}
        for name, args in [
            ("fresh-check", ["deploy", "--check"]),
            ("deploy", ["deploy"]),
            ("converged-check", ["deploy", "--check"]),
            ("provision-check", ["provision", "--check"]),
        ]:
            phase["name"] = name
            proc = cli("--json", *args, env=env)
            records.append(
                {"phase": name, "result": proc.returncode, "json": proc.stdout[-4000:], "stderr": proc.stderr[-2000:]}
            )
            print(name, proc.returncode, file=sys.stderr)
    finally:
        lab.down(log=lambda m: None)
        shutil.rmtree(directory, ignore_errors=True)
    out.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
