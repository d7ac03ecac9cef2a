"""A host session that answers from recorded cases (tests/data/steps/*.json), so a
step's plan is tested without a host: given the host's answers, the expected
plan and the expected remote calls (the shape of pyinfra's operation tests).

Every remote call a step makes goes through `session.run`: an agent call
(`agents.run`: the agent's source as the command, a JSON request on stdin) or a
shell command. `Replay` checks each call against the next recorded answer, in
order, and answers as the host did. The answers were recorded from a real lab
host (tests/record_step_answers.py); a case may change a value inside a
recorded answer, never its format.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from k26ops.engine.host import lab_standin_text
from k26ops.transport import agents
from k26ops.transport.ssh import CommandFailed, Result

CASES = Path(__file__).resolve().parent / "data" / "steps"
REPO = Path(__file__).resolve().parent.parent
# An answer that names a repository file's hash stays right when that file is edited.
_HASH_OF = "<sha256 of "
STANDIN_PATH = "k26ops/lab/fixtures/engine_standin.py"


def _agents_by_command() -> dict[str, str]:
    return {agents.command(p.stem): p.stem for p in agents.DIR.glob("*.py") if p.stem != "__init__"}


def _resolve(value):
    """Recorded answers with `<sha256 of PATH>` placeholders filled in."""
    if isinstance(value, str) and value.startswith(_HASH_OF) and value.endswith(">"):
        path = value[len(_HASH_OF) : -1]
        if path == STANDIN_PATH:  # installed with its recorded start phases filled in (enginehost)
            return hashlib.sha256(lab_standin_text().encode()).hexdigest()
        return hashlib.sha256((REPO / path).read_bytes()).hexdigest()
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value


class Replay:
    """`session` for HostContext, facts.gather and agents.run, answering from `answers`."""

    def __init__(self, host, answers: list[dict]):
        self.host = host
        self.answers = [dict(a) for a in answers]
        self.calls: list[dict] = []
        self.commands = 0
        self._agents = _agents_by_command()

    def run(
        self, command: str, *, stdin: str | None = None, timeout: float | None = None, check: bool = False
    ) -> Result:
        self.commands += 1
        name = self._agents.get(command)
        call = {"agent": name, "op": json.loads(stdin or "{}").get("op")} if name else {"command": command}
        self.calls.append(call)
        if not self.answers:
            raise AssertionError(f"{self.host.name}: unexpected remote call {call} (no recorded answer left)")
        want = self.answers.pop(0)
        key = {k: want[k] for k in ("agent", "op", "command") if k in want}
        if key != call:
            raise AssertionError(f"{self.host.name}: remote call {call}, the case expected {key}")
        if name:
            answer = (
                want["answer"] if "answer" in want else json.loads((CASES / want["answer_file"]).read_text())["answer"]
            )
            res = Result(want.get("exited", 0), "\n" + json.dumps(_resolve(answer)) + "\n", want.get("stderr", ""))
        else:
            res = Result(want.get("exited", 0), want.get("stdout", ""), want.get("stderr", ""))
        if check and not res.ok:
            raise CommandFailed(self.host.name, command, res)
        return res

    def put(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        raise AssertionError(f"{self.host.name}: a plan wrote {remote_path}")

    put_file = put


def load(step: str) -> dict:
    """The cases of one step: {"step", "host", "params", "cases": [...]}."""
    return json.loads((CASES / f"{step}.json").read_text())
