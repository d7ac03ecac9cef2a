"""Rollout progress: the step counter, the elapsed time that ticks with no new
message, finished hosts marked done, and one plain line per host event when
stderr is not a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from k26ops.cli.progress import Board, HostProgress
from k26ops.orchestrate.playbook import step_message


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _plain_board(hosts, verbose=False):
    buf, clock = io.StringIO(), Clock()
    board = Board(hosts, Console(file=buf, width=80), live=False, verbose=verbose, clock=clock)
    return board, buf, clock


def test_step_counter_is_read_from_step_messages():
    p = HostProgress("lab1")
    assert p.update("gathering facts", 0.0) == ["start"]
    assert p.update(step_message(1, 5, "cuda_toolkit", "planning"), 1.0) == ["1/5 cuda_toolkit"]
    assert p.update(step_message(1, 5, "cuda_toolkit", "applying 2 change(s)"), 2.0) == []  # same step: none
    assert p.message == "applying 2 change(s)"
    # a step's own message that reads like the form is a message, not a step: events are typed
    assert p.update("2/5 lookalike: text", 2.5) == [] and p.step == "1/5 cuda_toolkit"
    assert p.update(step_message(3, 5, "service", "planning"), 3.0) == ["3/5 service"]
    assert p.update("waiting for /health (12 s)", 4.0) == []  # a step's own message keeps the counter
    assert p.state().plain == "3/5 service waiting for /health (12 s)"


def test_plain_lines_one_per_event():
    board, buf, clock = _plain_board(["lab1", "lab2"])
    board.update("lab1", "connecting")
    clock.t += 1
    board.update("lab1", step_message(1, 3, "service", "planning"))
    board.update("lab1", step_message(1, 3, "service", "applying 1 change(s)"))
    board.update("lab1", "rendering the unit")
    clock.t += 2
    board.update("lab1", step_message(2, 3, "health", "planning"))
    clock.t += 1.5
    board.finish("lab1", "changed")
    board.finish("lab2", "unreachable", "bastion jump: DNS: name does not resolve\nmore")
    assert buf.getvalue().splitlines() == [
        "lab1: start",
        "lab1: 1/3 service",
        "lab1: 2/3 health",
        "lab1: done changed 4.5s",
        "lab2: unreachable 0.0s: bastion jump: DNS: name does not resolve",
    ]


def test_verbose_prints_every_message():
    board, buf, _ = _plain_board(["lab1"], verbose=True)
    board.update("lab1", "connecting")
    board.update("lab1", step_message(1, 1, "smoke", "planning"))
    assert buf.getvalue().splitlines() == ["lab1: start", "lab1: connecting", "lab1: 1/1 smoke: planning"]


def test_live_table_ticks_without_new_messages_and_marks_done():
    clock = Clock()
    board = Board(["lab1", "lab2"], Console(file=io.StringIO()), live=False, verbose=False, clock=clock)

    def rows():
        con = Console(file=io.StringIO(), width=120)
        with con.capture() as cap:
            con.print(board.table())
        return {line.split()[0]: line for line in cap.get().splitlines()[1:]}

    board.update("lab1", step_message(2, 5, "release", "building the wheel"))
    assert "0s" in rows()["lab1"].split() and "2/5 release building the wheel" in rows()["lab1"]
    clock.t += 7  # no message for 7 s: the elapsed time still moves
    assert "7s" in rows()["lab1"].split()
    assert rows()["lab2"].split()[1] == "-"
    board.finish("lab1", "ok")
    clock.t += 30
    assert "7s" in rows()["lab1"].split() and "done: ok" in rows()["lab1"]  # stopped at the end
    board.finish("lab2", "failed", "service: unit failed to start\njournal...")
    assert "failed: service: unit failed to start" in rows()["lab2"]


def test_live_board_redraws_every_second():
    board = Board(["lab1"], Console(file=io.StringIO(), force_terminal=True), live=True, verbose=False)
    assert board.live.auto_refresh and board.live.refresh_per_second >= 1
    assert board.live.get_renderable() is not board.live.get_renderable()  # rebuilt each redraw
