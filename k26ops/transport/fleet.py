"""Run one unit of work per host, in parallel, bounded, with per-host deadlines.

Fabric's ThreadingGroup starts a thread per host with no cap and joins with no
timeout, so one hung host blocks the whole run. Here a fixed number of daemon
workers (`forks`) take hosts from a queue; each host has its own deadline,
counted from when its work started; a host past its deadline is reported
`failed` (deadline exceeded) and its connection is closed so its worker
unblocks, while the other hosts go on.

Ctrl-C (and SIGTERM/SIGHUP, which the CLI turns into it) sets `interrupt.requested`:
no new host starts, and each running host's work sees it at its next remote
command and handles it like a failure of its step (the deploy rolls the host
back to its previous unit, env file and release). The run waits up to
`interrupt_grace` seconds for that; a second Ctrl-C, or the grace running
out, closes every connection. The hosts that did not finish are named.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from k26ops import interrupt
from k26ops.inventory import Host
from k26ops.transport.ssh import BecomeFailed, HostKeyRefused, Session, Unreachable, connect

OK, CHANGED, FAILED, UNREACHABLE, INTERRUPTED = "ok", "changed", "failed", "unreachable", "interrupted"
DEFAULT_FORKS = 16
DEFAULT_DEADLINE = 3600.0
DEFAULT_INTERRUPT_GRACE = 180.0
# Set on Ctrl-C/SIGTERM/SIGHUP: work in progress stops at its next remote command and restores the host.
# (Not `INTERRUPTED`: that is the host status above, which a host still queued at the interrupt gets.)


@dataclass
class HostResult:
    host: str
    status: str = "pending"
    error: str | None = None
    data: dict = field(default_factory=dict)
    elapsed: float = 0.0
    commands: int = 0
    uploaded: int = 0  # bytes of files the control node sent to the host

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "status": self.status,
            "error": self.error,
            "elapsed": round(self.elapsed, 3),
            "commands": self.commands,
            "uploaded": self.uploaded,
            **self.data,
        }


class Outcome(dict):
    """What a unit of work returns: `changed` plus any data for the report."""

    def __init__(self, changed: bool = False, **data):
        super().__init__(data)
        self.changed = changed


Work = Callable[[Session], "Outcome | dict | None"]


@dataclass
class FleetOptions:
    forks: int = DEFAULT_FORKS
    deadline: float = DEFAULT_DEADLINE
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    interrupt_grace: float = DEFAULT_INTERRUPT_GRACE


class Connections:
    """Each host's one connection (opened on first use, then reused), so that
    several runs over the same hosts (a snapshot and its pins, `logs -f`) share
    them; close() ends them all."""

    def __init__(self, options: FleetOptions | None = None):
        self.opt = options or FleetOptions()
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def session(self, host: Host) -> Session:
        with self._lock:
            s = self.sessions.get(host.name)
        if s is None:
            s = connect(host, accept_new=self.opt.accept_new_host_keys, connect_timeout=self.opt.connect_timeout)
            with self._lock:
                self.sessions[host.name] = s
        return s

    def close(self, names=None) -> None:
        """Close the named hosts' connections (default: all)."""
        for name, s in list(self.sessions.items()):
            if names is None or name in names:
                s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Fleet:
    """One batch of hosts run in parallel (k26ops.orchestrate.rollout.run builds it: the one driver)."""

    def __init__(
        self,
        hosts: list[Host],
        options: FleetOptions | None = None,
        on_event: Callable[[str, str], None] | None = None,
        on_result: Callable[[HostResult], None] | None = None,
        connections: Connections | None = None,
    ):
        self.hosts = hosts
        self.opt = options or FleetOptions()
        self.on_event = reporter(on_event or (lambda host, msg: None))
        self.on_result = reporter(on_result or (lambda result: None))  # each host's result, as it ends
        self.connections = connections or Connections(self.opt)
        self.sessions = self.connections.sessions

    def session(self, host: Host) -> Session:
        """The host's one connection for this run (opened on first use, then reused)."""
        return self.connections.session(host)

    def run(self, work: Work) -> list[HostResult]:
        results = {h.name: HostResult(h.name) for h in self.hosts}
        started: dict[str, float] = {}
        done: set[str] = set()
        todo: queue.Queue = queue.Queue()
        for h in self.hosts:
            todo.put(h)
        cond = threading.Condition()

        def worker():
            while True:
                if interrupt.requested.is_set():
                    return  # no new host starts once interrupted
                try:
                    host = todo.get_nowait()
                except queue.Empty:
                    return
                with cond:
                    started[host.name] = time.monotonic()
                res = self._one(host, work)
                with cond:
                    if host.name not in done:  # not already timed out
                        results[host.name] = res
                        done.add(host.name)
                        self.on_result(res)
                    cond.notify_all()

        threads = [
            threading.Thread(target=worker, daemon=True, name=f"k26ops-fork-{i}")
            for i in range(max(1, min(self.opt.forks, len(self.hosts))))
        ]
        try:
            for t in threads:  # inside: a Ctrl-C while the workers start (the first may already run) is handled
                t.start()
            with cond:
                while len(done) < len(self.hosts):
                    now = time.monotonic()
                    for name, t0 in list(started.items()):
                        if name not in done and now - t0 > self.opt.deadline:
                            done.add(name)
                            results[name] = HostResult(
                                name, FAILED, f"deadline of {self.opt.deadline:.0f}s exceeded", elapsed=now - t0
                            )
                            self.on_result(results[name])
                            self._close(name)
                    cond.wait(timeout=0.2)
        except KeyboardInterrupt:
            interrupt.requested.set()
            self.on_event("*", "interrupted: restoring the hosts that were changing (Ctrl-C again to stop now)")
            try:  # running hosts restore what they changed; then they report as failed (interrupted)
                end = time.monotonic() + self.opt.interrupt_grace
                with cond:
                    while any(n in started and n not in done for n in results) and time.monotonic() < end:
                        cond.wait(timeout=0.2)
            except KeyboardInterrupt:
                pass
            with cond:
                for name, r in results.items():
                    if name not in done:
                        done.add(name)
                        r.status = INTERRUPTED
                        r.error = (
                            "interrupted before this host started"
                            if name not in started
                            else "interrupted; its restore did not finish in time (run again to converge)"
                        )
            self.close()
            raise FleetInterrupted([results[h.name] for h in self.hosts]) from None
        return [results[h.name] for h in self.hosts]

    def _one(self, host: Host, work: Work) -> HostResult:
        t0 = time.monotonic()
        res = HostResult(host.name)
        try:
            self.on_event(host.name, "connecting")
            session = self.session(host)
            self.on_event(host.name, "running")
            out = work(session)
            res.status = CHANGED if getattr(out, "changed", False) else OK
            res.data = dict(out or {})
        except BecomeFailed as exc:  # reached, but cannot run as root: a failure, not a network one
            res.status, res.error = FAILED, str(exc)
        except (Unreachable, HostKeyRefused) as exc:
            res.status, res.error = UNREACHABLE, str(exc)
        except Exception as exc:  # a host's failure is that host's result, never the run's
            res.status, res.error = FAILED, _describe(exc)
        except BaseException as exc:  # SystemExit (rich on a closed pipe) would end this thread silently,
            res.status, res.error = FAILED, f"{type(exc).__name__} in its work: {exc}"  # host left for --deadline
        res.elapsed = time.monotonic() - t0
        s = self.sessions.get(host.name)
        res.commands = s.commands if s else 0
        res.uploaded = s.uploaded if s else 0
        self.on_event(host.name, res.status)
        return res

    def _close(self, name: str) -> None:
        s = self.sessions.get(name)
        if s:
            s.close()

    def close(self) -> None:
        self.connections.close()


def reporter(callback: Callable) -> Callable:
    """`callback` (progress, a host's event or result: output, called from host
    threads) made unable to raise into host work. A reporter that fails (a closed
    pipe, a terminal gone) is switched off; the hosts' work goes on (issue 35.4)."""
    broken = threading.Event()

    def call(*args, **kw):
        if broken.is_set():
            return None
        try:
            return callback(*args, **kw)
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 -- SystemExit too: rich raises it on EPIPE
            broken.set()
            return None

    return call


class FleetInterrupted(Exception):
    def __init__(self, results: list[HostResult]):
        self.results = results
        unfinished = [r.host for r in results if r.status == INTERRUPTED]
        failed = [r.host for r in results if r.status not in (OK, CHANGED, INTERRUPTED, "pending")]
        if unfinished:  # never "not finished: none" when the interrupt made every host fail
            why = "not finished: " + ", ".join(unfinished)
        else:
            why = "failed: " + ", ".join(failed) if failed else "every host had finished"
        super().__init__("interrupted; " + why)


def _describe(exc: Exception) -> str:
    text = str(exc).strip() or exc.__class__.__name__
    return text.splitlines()[0] if "\n" in text and len(text) > 300 else text


def exit_code(results: list[HostResult]) -> int:
    """0: every host ok or changed; 1: any host failed or unreachable."""
    return 0 if all(r.status in (OK, CHANGED) for r in results) else 1
