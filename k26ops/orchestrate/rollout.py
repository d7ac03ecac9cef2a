"""The one fleet driver: run a unit of work over hosts, canary batch first, then the rest.

`run(hosts, work, options, canary=N)` runs `work(session)` on the first N
hosts; only when every one of them ends ok/changed does it run the rest, at
once or in batches (`batch`: sizes as Ansible's `serial`, with `max_fail`
failures allowed per later batch). A failed batch stops the rollout: the
other hosts are `skipped` and untouched (`Rollout.stopped` says which host
failed and which were left). Ctrl-C ends it with `Rollout.interrupted` set.
Each batch's first host relays wheels to the others (release.wheelsource).
Nothing is printed: callbacks report progress (`on_event`) and each host's
end (`on_result`); k26ops.cli shows them, prints the table and exits with
`Rollout.code`.

`playbook_work(steps, ...)` builds a `work(session, progress)` for a playbook
and carries the steps' report data (health, smoke latency,
spec_accept_length, rollback) into each host's result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from k26ops.errors import EXIT_INTERRUPTED
from k26ops.orchestrate import playbook
from k26ops.release import wheelsource
from k26ops.transport.fleet import (
    CHANGED,
    OK,
    Connections,
    Fleet,
    FleetInterrupted,
    FleetOptions,
    HostResult,
    Work,
    exit_code,
)

SKIPPED = "skipped"
Progress = Callable[[str], None]


@dataclass
class Stop:
    """Why a rollout stopped before its last batch."""

    host: str  # the first failed host of the batch
    error: str
    untouched: list[str]


@dataclass
class Rollout:
    """Per-host results (in host order), why it stopped early, and whether Ctrl-C ended it."""

    results: list[HostResult] = field(default_factory=list)
    stopped: Stop | None = None
    interrupted: FleetInterrupted | None = None

    @property
    def code(self) -> int:
        return EXIT_INTERRUPTED if self.interrupted else exit_code(self.results)


@dataclass(frozen=True)
class Size:
    """One batch size or failure threshold: a count, or a percent of the hosts."""

    value: float
    percent: bool = False

    def of(self, total: int) -> int:
        """Hosts this size means among `total` (a percent: at least one, as Ansible's `serial`)."""
        return max(1, int(total * self.value / 100)) if self.percent else int(self.value)

    def exceeded(self, failed: int, total: int) -> bool:
        """Whether `failed` of `total` hosts is more than this threshold allows."""
        return failed * 100 > self.value * total if self.percent else failed > self.value

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else str(int(self.value))


def parse_size(text: str, *, zero: bool = False) -> Size:
    """`N` or `P%` (0 < P <= 100; 0 only with `zero`, for --max-fail); raises ValueError naming the value."""
    t = str(text).strip()
    m = re.fullmatch(r"(\d{1,6})(?:\.(\d{1,3}))?(%?)", t)
    if not m or (m.group(2) and not m.group(3)):
        raise ValueError(f"{text!r} is not a host count N or a percent P%")
    v = float(t.rstrip("%"))
    if m.group(3) and v > 100:
        raise ValueError(f"{text!r}: a percent is at most 100%")
    if v == 0 and not zero:
        raise ValueError(f"{text!r}: a batch has at least one host")
    return Size(v, bool(m.group(3)))


def parse_batches(text: str) -> list[Size]:
    """`--batch`: `N`, `P%` or Ansible's `serial` list `1,2,25%` (the last size repeats)."""
    parts = str(text).split(",")
    if len(parts) > 100:
        raise ValueError("more than 100 batch sizes")
    try:
        return [parse_size(p) for p in parts]
    except ValueError as exc:
        if len(parts) == 1:
            raise
        raise ValueError(f"{text!r}: {exc}") from None


def canary_batches(hosts: list, n: int | None, batch: "int | list[Size] | None" = None) -> list[list]:
    """[first n hosts, then the rest] (empty batches dropped); n <= 0 or None: one
    batch, or with `batch` every host in batches. `batch`: a count, or sizes as
    Ansible's `serial` (each in turn, the last repeated; a percent is of all hosts)."""
    hosts = list(hosts)
    if not n or n <= 0:
        first, rest = ([], hosts) if batch else (hosts, [])
    elif n >= len(hosts):
        first, rest = hosts, []
    else:
        first, rest = hosts[:n], hosts[n:]
    sizes = [Size(batch)] if isinstance(batch, int) and batch > 0 else list(batch or []) or [Size(len(rest) or 1)]
    out, i, k = [first], 0, 0
    while i < len(rest):
        size = sizes[min(k, len(sizes) - 1)].of(len(hosts))
        out.append(rest[i : i + size])
        i, k = i + size, k + 1
    return [b for b in out if b]


def run(
    hosts: list,
    work: Work,
    options: FleetOptions | None = None,
    *,
    canary: int | None = 0,
    batch: "int | list[Size] | None" = None,
    max_fail: Size | None = None,
    stopped: str = "not deployed",
    on_event: Callable[[str, str], None] | None = None,
    on_result: Callable[[HostResult], None] | None = None,
    connections: Connections | None = None,
) -> Rollout:
    """Run `work(session)` over `hosts` in canary batches; never raises for a host.
    A failed canary stops the rollout; a later batch stops it when its failures
    exceed `max_fail` (default: any failure).
    `connections` (kept open) lets several runs share each host's connection;
    without it each batch's connections close when the batch ends."""
    conns = connections or Connections(options)
    details: dict[str, dict] = {}

    def keep_details(session):
        try:
            return work(session)
        except Exception as exc:  # a failed step's report data (journal tail, diagnosis, gate)
            if getattr(exc, "details", None):
                details[session.host.name] = exc.details
            raise

    out = Rollout()
    results: dict[str, HostResult] = {}
    batches = canary_batches(hosts, canary, batch)
    for i, part in enumerate(batches):
        # peer wheel source: this batch's first host relays wheels to the others, until the batch ends
        relay = wheelsource.Batch(part, conns.session)

        def ended(r: HostResult, relay=relay):
            relay.ended(r.host, f"{r.status}: {r.error}" if r.error else r.status)
            if on_result:
                on_result(r)

        fleet = Fleet(part, options, on_event=on_event, on_result=ended, connections=conns)

        def in_batch(session, relay=relay):
            """The host's work with its batch's relay on its session (wheelsource.deliver reads it)."""
            session.relay = relay
            try:
                return keep_details(session)
            finally:
                session.relay = None

        try:
            for r in fleet.run(in_batch):
                results[r.host] = r
        except FleetInterrupted as exc:
            for r in exc.results:
                results[r.host] = r
            out.interrupted = exc
        finally:
            relay.stop()
            for h in part:  # the relay's pushes may come after its own work
                s = conns.sessions.get(h.name)
                if s and h.name in results:
                    results[h.name].uploaded = s.uploaded
            if connections is None:
                conns.close([h.name for h in part])
        if out.interrupted:
            break
        failed = [h.name for h in part if results[h.name].status not in (OK, CHANGED)]
        is_canary = i == 0 and bool(canary) and len(batches) > 1
        limit = max_fail if max_fail is not None and not is_canary else Size(0)
        if failed and limit.exceeded(len(failed), len(part)) and i + 1 < len(batches):
            what = "canary" if is_canary else f"batch {i + 1}"
            why = f"{stopped}: {what} {', '.join(failed)} failed"
            untouched = [h.name for later in batches[i + 1 :] for h in later]
            for name in untouched:
                results[name] = HostResult(name, SKIPPED, why)
                if on_result:
                    on_result(results[name])
            first = results[failed[0]]
            out.stopped = Stop(failed[0], first.error or first.status, untouched)
            break
    out.results = [results.get(h.name) or HostResult(h.name, SKIPPED, "not started") for h in hosts]
    for r in out.results:
        if r.host in details:
            r.data.update(details[r.host])
    return out


def playbook_work(steps, *, check: bool = False, purpose: str = "deploy", options=None):
    """A rollout work function running `steps` via playbook.run_on_host with the
    run's `options` (steps.RunOptions); each host's result gets the steps' report
    data (its context's `report`)."""

    def work(session, progress: Progress):
        return playbook.run_on_host(session, steps, check=check, progress=progress, purpose=purpose, options=options)

    return work
