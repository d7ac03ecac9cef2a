"""Steps: idempotent units of a playbook.

A step reads the host's state (facts, gathered once per host and shared),
compares it with the desired state and returns the changes it would make
(`plan`); `apply` makes exactly those. `--check` stops after `plan`; `--diff`
prints the changes' text diffs. A step that finds nothing to change reports
`unchanged` and runs no further command.

Steps share what they learn through typed state (k26ops.runstate): each piece
is a dataclass defined beside the step that writes it, read through its class
(`ReleaseDecision.of(ctx)`: the release id and whether `current` moved; the
service step restarts only when its files or the release changed). A step
never re-reads what another step already knows. The run's inputs (the CLI's
flags) are one `RunOptions`, built once where the run starts (`provision_work`,
the deploy command).

A failure or an interrupt after a step changed the host puts the host back:
each step declares its own `undo`, and the playbook asks them, latest first.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from typing import Callable

from k26ops import interrupt
from k26ops.errors import Interrupted, StepFailed  # noqa: F401 (re-exported: the steps' failure types)
from k26ops.inventory import Host
from k26ops.layout import Layout
from k26ops.shell import q, tied_to_channel  # noqa: F401 (re-exported)
from k26ops.transport.ssh import Session


@dataclass
class Change:
    what: str  # one line a person reads: "switch current -> sglang0.5.23-ab12cd34ef56"
    diff: str | None = None  # unified diff for --diff, when the change is a file's text
    action: str | None = None  # what apply does for it ("build", "switch"...): apply reads this, never `what`


class StepEvent(str):
    """A progress message that says which step runs: its text `3/5 service: planning` for
    whoever prints messages, its parts as fields for the CLI's progress board (which reads
    the fields, never the text)."""

    i: int
    n: int
    name: str
    what: str

    def __new__(cls, i: int, n: int, name: str, what: str) -> StepEvent:
        self = super().__new__(cls, f"{i}/{n} {name}: {what}")
        self.i, self.n, self.name, self.what = i, n, name, what
        return self

    @property
    def step(self) -> str:
        """`3/5 service`: the board's step counter."""
        return f"{self.i}/{self.n} {self.name}"


@dataclass(frozen=True)
class RunOptions:
    """The run's inputs from the command line, the same for every host: built once
    by the orchestration layer (provision, deploy), read by the steps they concern."""

    allow_reboot: bool = False  # provision --allow-reboot: the driver step may reboot a serving host
    # deploy --rehearse (k26ops.rehearsal.run.Gate): called before `current` moves or the
    # engine restarts; a callable, so that the steps never import the rehearsal built on them
    rehearse: Callable | None = None


@dataclass
class HostContext:
    session: Session
    host: Host
    vars: dict  # host vars merged with the playbook's parameters
    facts: dict
    check: bool = False
    progress: Callable[[str], None] = lambda msg: None
    steps: list = field(default_factory=list)  # this run's steps, in order (a step may look ahead)
    options: RunOptions = field(default_factory=RunOptions)
    state: dict = field(default_factory=dict)  # typed run state: {HostState subclass: its instance}
    report: dict = field(default_factory=dict)  # the host's report data (health, smoke, rollback...): its result
    # ownership of releases_root, read by the playbook before its lock writes under the root
    # (the release step's check; None: the step reads it itself)
    releases_root_state: dict | None = None

    @property
    def layout(self) -> Layout:
        """This host's directories (k26ops.engine.host)."""
        return Layout.of(self.vars)

    @property
    def root(self) -> str:
        return self.layout.root

    @property
    def releases_root(self) -> str:
        return self.layout.releases_root

    @property
    def state_dir(self) -> str:
        return self.layout.state_dir

    @property
    def pins_file(self) -> str:
        return self.layout.pins_file

    def run(self, command: str, **kw):
        check_interrupted()
        return self.session.run(command, **kw)


class Step:
    """Base class: subclasses set `name` and implement plan/apply."""

    name = "step"
    # The standard facts (k26ops.facts.FACTS) this step reads, its checks included; None: it
    # does not say, and a run with such a step gathers every fact. A run whose steps all say
    # gathers only those (a converged deploy skips nvidia-smi -L and topo, the kernel log...).
    fact_names: tuple[str, ...] | None = None

    def __init__(self, params: dict | None = None):
        self.params = dict(params or {})

    def before_hosts(self, hosts) -> None:
        """Checks on the control node before any host is contacted (bad input:
        raise UserError, exit 2, nothing runs). Default: nothing."""

    def facts(self, host_vars: dict) -> list:
        """Facts this step needs beyond the standard ones, gathered in the playbook's
        one fact-gathering call (no extra round trip). Default: none."""
        return []

    def check_host(self, ctx: HostContext) -> None:
        """Refuse the host from its gathered facts (raise StepFailed), before any step
        prepares (control-node builds) or changes anything. Default: nothing."""

    def prepare(self, ctx: HostContext) -> None:
        """Control-node work and checks that must pass before ANY step changes
        the host (called for every step first). Default: nothing."""

    def plan(self, ctx: HostContext) -> list[Change]:
        raise NotImplementedError

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        raise NotImplementedError

    def undo(self, ctx: HostContext) -> str | None:
        """After a later failure or an interrupt: put back what this run changed on the
        host that this step owns; a phrase for the report, or None when there is
        nothing of this step's to put back. The playbook asks the steps latest first
        and stops at the first phrase, so a step whose undo must also put back an
        earlier step's change (the engine's restart needs the previous release
        current again) does both. Default: nothing."""
        return None


def check_interrupted(what: str = "") -> None:
    interrupt.check(what)


def text_diff(path: str, old: str | None, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            (old or "").splitlines(True),
            new.splitlines(True),
            fromfile=f"a{path}" if old is not None else "/dev/null",
            tofile=f"b{path}",
        )
    )


class Elapsed:
    def __init__(self):
        self.t0 = time.monotonic()

    def __str__(self) -> str:
        return f"{time.monotonic() - self.t0:.0f}s"


def session_context(session: Session) -> HostContext:
    """A context for one-off reads outside a playbook (status, logs, diagnose): the host's vars, no facts."""
    return HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
