"""A closed output pipe ends the printing, never a host's work half-way (issue 35.4).

`k26ops deploy 2>&1 | head -1`: once `head` exits, every write to stdout and
stderr fails with EPIPE. Python raises BrokenPipeError where the write happens
-- often a worker thread's progress callback in the middle of a host's step --
and rich answers it with SystemExit, which ends a worker thread silently: the
host was left with `current` on the new release beside the old engine, and the
run hung until --deadline. Here instead:

- a write that fails because the reader is gone lands in `silence()`: each
  stream whose reader is gone is pointed at /dev/null, so no later write (any
  thread, rich, Python's flush at exit) fails again, and nothing more is shown;
- a callback wrapped by `quiet()` (progress, per-host results: they run in host
  threads) never raises: the first closed write interrupts the run like Ctrl-C,
  so hosts not started stay untouched and hosts in progress restore at their
  next remote command (the same restore as for Ctrl-C), quickly;
- the command then exits EXIT_CLOSED_PIPE (141 = 128 + SIGPIPE, what a shell
  shows for a process a closed pipe ended), whatever the hosts' outcome was:
  `k26ops status` shows where each host is.
"""

from __future__ import annotations

import _thread
import errno
import os
import select
import threading

from rich.console import Console

EXIT_CLOSED_PIPE = 141
_closed = threading.Event()
_lock = threading.Lock()


def is_closed() -> bool:
    """Whether this run's output went away (the exit code is then EXIT_CLOSED_PIPE)."""
    return _closed.is_set()


def _reader_gone(fd: int) -> bool:
    """A pipe whose read end is closed polls as POLLERR on its write end (Linux)."""
    try:
        p = select.poll()
        p.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError):
        return False


def silence() -> bool:
    """After a failed write: point stdout/stderr whose reader is gone at /dev/null.
    True when an output stream was gone (False: the error was not about our output)."""
    with _lock:
        gone = [fd for fd in (1, 2) if _reader_gone(fd)]
        if not gone:
            return _closed.is_set()
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in gone:
            os.dup2(null, fd)
        os.close(null)
        _closed.set()
        return True


def is_output_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.EIO)


_interrupted = threading.Event()


def quiet(callback):
    """`callback` (progress or a host's result; called from host threads) made
    unable to raise into host work: a closed output silences it and interrupts
    the run once (like Ctrl-C: hosts finish their restore and the run ends)."""

    def call(*args, **kw):
        if _closed.is_set():
            return None
        try:
            return callback(*args, **kw)
        except OSError as exc:
            if not is_output_error(exc) or not silence():
                raise
            if not _interrupted.is_set():
                _interrupted.set()
                _thread.interrupt_main()
            return None

    return call


def _rich_broken_pipe(self) -> None:
    """rich's default answer to EPIPE is SystemExit(1), which silently ends the
    host thread that printed; re-raise the BrokenPipeError for the callers above."""
    self.quiet = True
    raise  # the BrokenPipeError rich is handling


Console.on_broken_pipe = _rich_broken_pipe  # rich's documented hook (it names subclassing; every Console here)
