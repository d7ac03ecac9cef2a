"""Per-host progress of a rollout: a live table on a terminal, plain lines otherwise.

On a terminal (stderr), a table redrawn every second: host, elapsed (ticking
even while a step is silent), the step counter (`3/5 service`) and the last
message; a finished host shows its result. When stderr is not a terminal (CI
logs, `| tee`) or --json, one line per host event -- start, each new step,
done/failed -- so progress shows as it happens; -v adds every message.
Steps announce themselves with a k26ops.steps.StepEvent (`i/n name: what` as text; the
board reads its fields), made by k26ops.orchestrate.playbook.step_message.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from k26ops.steps import StepEvent

RESULT_STYLE = {"ok": "green", "changed": "yellow"}


@dataclass
class HostProgress:
    """One host: its step counter, last message, start and end."""

    host: str
    step: str = ""  # "3/5 service"
    message: str = "waiting"
    t0: float | None = None
    t_end: float | None = None
    result: str | None = None  # "ok", "changed", "failed", ... once finished
    error: str | None = None

    def update(self, msg: str, now: float) -> list[str]:
        """Take a progress message; return the event lines it makes (start, new step)."""
        lines = []
        if self.t0 is None:
            self.t0 = now
            lines.append("start")
        if isinstance(msg, StepEvent):  # a step's own event: its counter from the fields
            if msg.step != self.step:
                self.step = msg.step
                lines.append(msg.step)
            self.message = msg.what
        else:
            self.message = msg
        return lines

    def finish(self, status: str, error: str | None, now: float) -> str:
        self.t0 = self.t0 if self.t0 is not None else now
        self.t_end, self.result, self.error = now, status, error
        word = "done" if status in RESULT_STYLE else status
        tail = f": {error.splitlines()[0]}" if error else ""
        return (
            f"{word} {status} {self.elapsed(now):.1f}s{tail}"
            if word == "done"
            else f"{word} {self.elapsed(now):.1f}s{tail}"
        )

    def elapsed(self, now: float) -> float:
        if self.t0 is None:
            return 0.0
        return (self.t_end if self.t_end is not None else now) - self.t0

    def state(self) -> Text:
        if self.result:
            style = RESULT_STYLE.get(self.result, "red")
            word = "done" if self.result in RESULT_STYLE else self.result
            first = (self.error or "").splitlines()[0][:120] if self.error else ""
            return Text(f"{word}: {self.result}" if word == "done" else f"{word}: {first}", style=style)
        return Text(" ".join(p for p in (self.step, self.message[:160]) if p))


class Board:
    """Every host's progress; thread-safe (each host reports from its own thread)."""

    def __init__(self, hosts: list[str], console: Console, live: bool, verbose: bool, clock=time.monotonic):
        self.hosts = {h: HostProgress(h) for h in hosts}
        self.console, self.verbose, self.clock = console, verbose, clock
        self.lock = threading.Lock()
        self.live = None
        if live:
            # lazy: rich.live (3 ms of every start) only on a terminal; --json, pipes and CI have none
            from rich.live import Live

            self.live = Live(console=console, get_renderable=self.table, refresh_per_second=1, transient=True)

    def table(self) -> Table:
        t = Table("host", "elapsed", "state", box=None, pad_edge=False)
        now = self.clock()
        with self.lock:
            for p in self.hosts.values():
                t.add_row(p.host, f"{p.elapsed(now):.0f}s" if p.t0 is not None else "-", p.state())
        return t

    def update(self, host: str, msg: str) -> None:
        with self.lock:
            lines = self.hosts[host].update(msg, self.clock())
        if self.live:
            self.live.refresh()
            return
        if self.verbose:  # every message, after the start line
            lines = [line for line in lines if line == "start"] + [msg]
        self._say(host, lines)

    def finish(self, host: str, status: str, error: str | None = None) -> None:
        with self.lock:
            line = self.hosts[host].finish(status, error, self.clock())
        if self.live:
            self.live.refresh()
        else:
            self._say(host, [line])

    def _say(self, host: str, lines: list[str]) -> None:
        for line in lines:
            self.console.print(Text(f"{host}: {line}"), soft_wrap=True, highlight=False)

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)
