"""Steps: idempotent units of a playbook.

A step reads the host's state (facts, gathered once per host and shared),
compares it with the desired state and returns the changes it would make
(`plan`); `apply` makes exactly those. `--check` stops after `plan`; `--diff`
prints the changes' text diffs. A step that finds nothing to change reports
`unchanged` and runs no further command.

Steps share what they learn through `ctx.shared` (e.g. the release step puts
the release id and whether `current` moved; the service step restarts only
when its files or the release changed). A step never re-reads what another
step already knows.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from typing import Callable

from k26ops.enginehost import Layout
from k26ops.inventory import Host
from k26ops.ssh import Session, q


@dataclass
class Change:
    what: str  # one line a person reads: "switch current -> sglang0.5.23-ab12cd34ef56"
    diff: str | None = None  # unified diff for --diff, when the change is a file's text
    action: str | None = None  # what apply does for it ("build", "switch"...): apply reads this, never `what`


@dataclass
class HostContext:
    session: Session
    host: Host
    vars: dict  # host vars merged with the playbook's parameters
    facts: dict
    shared: dict = field(default_factory=dict)
    check: bool = False
    progress: Callable[[str], None] = lambda msg: None
    steps: list = field(default_factory=list)  # this run's steps, in order (a step may look ahead)

    @property
    def layout(self) -> Layout:
        """This host's directories (k26ops.enginehost)."""
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

    def __init__(self, params: dict | None = None):
        self.params = dict(params or {})

    def before_hosts(self, hosts) -> None:
        """Checks on the control node before any host is contacted (bad input:
        raise UserError, exit 2, nothing runs). Default: nothing."""

    def prepare(self, ctx: HostContext) -> None:
        """Control-node work and checks that must pass before ANY step changes
        the host (called for every step first). Default: nothing."""

    def plan(self, ctx: HostContext) -> list[Change]:
        raise NotImplementedError

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        raise NotImplementedError


class StepFailed(Exception):
    """A step could not reach its desired state; the message says why, in one line."""


class Interrupted(StepFailed):
    """The run was interrupted (Ctrl-C, SIGTERM, SIGHUP): handled like a failure of the step."""


def check_interrupted(what: str = "") -> None:
    from k26ops.fleet import interrupt_requested

    if interrupt_requested.is_set():
        raise Interrupted("interrupted (Ctrl-C, SIGTERM or SIGHUP)" + (f" during {what}" if what else ""))


def text_diff(path: str, old: str | None, new: str) -> str:
    return "".join(difflib.unified_diff((old or "").splitlines(True), new.splitlines(True),
                                        fromfile=f"a{path}" if old is not None else "/dev/null",
                                        tofile=f"b{path}"))


def tied_to_channel(script: str, stdin: bool = False) -> str:
    """`script` in its own process group, killed when our SSH channel goes away.

    sshd sends no signal to a non-tty command when the client dies (killed
    control node, Ctrl-C, lost network): a build or install would go on, unowned,
    and race the next run's rebuild of the same directory. A watchdog writes one
    NUL byte to the channel's stderr every second; once the channel is gone the
    write fails (EPIPE) and it kills the build's process group.
    `stdin`: the script reads our channel's stdin (a background job's is
    /dev/null otherwise), e.g. an agent's request.
    """
    start = ("exec 3<&0; setsid sh -c " + q(script) + " <&3 3<&- & b=$!; exec 3<&-; " if stdin
             else "setsid sh -c " + q(script) + " & b=$!; ")
    return (start + "trap '' PIPE; while kill -0 $b 2>/dev/null; do sleep 1; "
            "printf '\\0' >&2 || { kill -TERM -$b 2>/dev/null; sleep 2; kill -KILL -$b 2>/dev/null; exit 143; }; "
            "done; wait $b")


class Elapsed:
    def __init__(self):
        self.t0 = time.monotonic()

    def __str__(self) -> str:
        return f"{time.monotonic() - self.t0:.0f}s"


def session_context(session: Session) -> HostContext:
    """A context for one-off reads outside a playbook (status, logs, diagnose): the host's vars, no facts."""
    return HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
