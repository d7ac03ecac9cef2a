"""Loopback ports for labs and stand-ins: each xdist worker takes only its own."""

from __future__ import annotations

import os
import socket

PORT_CHUNK = 100  # ports handed out per xdist worker in chunks of this many (a block fits in one)


# k26ops.lab.machines.ENGINE_PORT_OFFSET (a lab host's engine port is its sshd port + this), not
# imported: that import costs seconds at every test start (test_marks checks the two agree)
ENGINE_PORT_OFFSET = 20000


def _port_owner(port: int, workers: int) -> int:
    """Which xdist worker may take `port`: chunks of PORT_CHUNK ports dealt in turn, counted
    modulo ENGINE_PORT_OFFSET so that a port and its engine port (+20000) have the same owner."""
    return (port % ENGINE_PORT_OFFSET) // PORT_CHUNK % workers


_HANDED_OUT: set[int] = set()  # every port free_port_block gave in this process


def free_port_block(count: int, start: int = 23000, stop: int = 29000) -> int:
    """The first port of `count` consecutive free loopback ports. Under pytest-xdist, only
    ports this worker owns (_port_owner), whatever the range: a port is free only until the
    lab's sshd binds it (seconds of boot later), and two workers probing the same ports
    could both take it (the ranges of the callers overlap too). Never a port it gave before
    in this process: a module that set the shared lab's engine_port to one leaves that engine
    listening there, free whenever it restarts (a full run's port-in-use: test_faults_rehearse
    was given the 38000 that test_faults_input's engine came back to)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    me = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    assert count <= PORT_CHUNK or workers == 1, count
    first = start + (os.getpid() * 7) % max(1, min(3000, stop - start - count))  # inside the range asked
    port, wrapped = first, False
    while port + count < stop or not wrapped:
        if port + count >= stop:  # the range's start, once, up to where this began
            port, wrapped, stop = start, True, first + count
            continue
        if workers > 1 and {_port_owner(p, workers) for p in (port, port + count - 1)} != {me}:
            port = (port // PORT_CHUNK + 1) * PORT_CHUNK  # the next chunk
            continue
        ok = not _HANDED_OUT.intersection(range(port, port + count))
        # the sshd ports and the engine ports the lab derives from them; and not the engine port of a
        # lab up now (its sshd port bound 20000 below), free only while its engine is not serving
        below = range(max(1024, port - ENGINE_PORT_OFFSET), max(1024, port - ENGINE_PORT_OFFSET + count))
        for p in [
            *range(port, port + count),
            *range(port + ENGINE_PORT_OFFSET, port + ENGINE_PORT_OFFSET + count),
            *below,
        ]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            _HANDED_OUT.update(range(port, port + count))
            return port
        port += count + 1
    raise RuntimeError("no free port block")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
