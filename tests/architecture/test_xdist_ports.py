"""The full suite on several pytest-xdist workers (`make test`: `-n 2`): each worker boots
its own labs, so the loopback ports they pick must never meet. A port is free only until
the lab's sshd binds it, seconds of boot after `free_port_block` probed it, so probing
alone cannot keep two workers apart: each worker takes ports from its own chunks."""

from __future__ import annotations

import os

import pytest

from k26ops.lab.machines import ENGINE_PORT_OFFSET
from labtools import ports
from labtools.ports import free_port_block

# (count, start, stop) as the tests call it: the lab fixtures' default range and the
# overlapping ranges of the tests that pick an engine or rehearsal port
CALLS = [
    (3, 23000, 29000),
    (1, 23000, 29000),
    (64, 23000, 29000),
    (1, 35000, 39000),
    (3, 36000, 40000),
    (2, 41000, 45000),
    (2, 31000, 35000),
]


def _ports(workers: int, worker: int, monkeypatch) -> set[int]:
    """Every port (sshd and engine) worker `worker` of `workers` gets for CALLS, all workers
    with the same pid (the pid only spreads the start; it must not be what separates them)."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    got = set()
    for count, start, stop in CALLS:
        port = free_port_block(count, start, stop)
        assert start <= port and port + count < stop
        got |= {*range(port, port + count), *range(port + ENGINE_PORT_OFFSET, port + ENGINE_PORT_OFFSET + count)}
    return got


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_workers_never_pick_the_same_port(workers, monkeypatch):
    seen: set[int] = set()
    for worker in range(workers):
        ports = _ports(workers, worker, monkeypatch)
        assert not ports & seen, (worker, sorted(ports & seen))
        seen |= ports


def test_the_engine_offset_is_the_labs():
    """labtools.ports keeps its own copy (importing the lab machinery costs seconds per test run)."""
    assert ports.ENGINE_PORT_OFFSET == ENGINE_PORT_OFFSET
