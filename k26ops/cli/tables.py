"""Tables that stay readable at any width, and never wrap when piped.

On a terminal the values an operator acts on (host, status, release id) are
never cut: their columns do not wrap; the other columns wrap first and, if the
table still cannot fit, are hidden (a note says which; --json has them all).
Long or multi-line details go below the table as `host: detail` lines instead
of a column of one-word lines. Piped (not a terminal), the table is as wide as
its content, whatever COLUMNS says, so `| grep ADDRESS` finds whole rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

UNBOUNDED = 100_000
INLINE_MAX = 60  # a longer detail goes below the table, even piped: rows stay short


@dataclass(frozen=True)
class Col:
    header: str
    keep: bool = False  # never wrapped, cut or hidden
    justify: str = "left"


def plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _build(title, cols: list[Col], rows: list[list], keep_idx: list[int], **kw) -> Table:
    table = Table(title=title, **kw)
    for i in keep_idx:
        c = cols[i]
        whole = (
            max(
                cell_len(line)
                for cell in [c.header, *(r[i] for r in rows)]
                for line in plain(cell).splitlines() or [""]
            )
            if c.keep
            else None
        )
        table.add_column(c.header, justify=c.justify, no_wrap=c.keep, overflow="fold", min_width=whole)
    for row in rows:
        table.add_row(*[row[i] for i in keep_idx])
    return table


def _measure(console: Console, table: Table) -> Measurement:
    return Measurement.get(console, console.options.update_width(UNBOUNDED), table)


def show(console: Console, title, cols: list[Col], rows: list[list], details: list | None = None, **table_kw) -> None:
    """Print `rows` (cells: str with markup, or Text) under `cols`; `details[i]`
    (text or None) is row i's detail: a last column when every detail is one
    short line and the table fits, else `host: detail` lines below (host = the row's first cell)."""
    details = list(details or [None] * len(rows))
    inline = any(details) and all("\n" not in (d or "") and len(d or "") <= INLINE_MAX for d in details)
    all_cols = cols + ([Col("detail", keep=True)] if inline else [])
    all_rows = [r + ([d or ""] if inline else []) for r, d in zip(rows, details)]
    shown = list(range(len(all_cols)))
    if not console.is_terminal:  # piped: no wrapping at all
        table = _build(title, all_cols, all_rows, shown, **table_kw)
        width = max(_measure(console, table).maximum, len(plain(title or "")), 20)
        Console(file=console.file, width=width, color_system=None, highlight=False).print(table)
        _below(console, rows, details, inline)
        return
    width = console.width
    table = _build(title, all_cols, all_rows, shown, **table_kw)
    if inline and _measure(console, table).maximum > width:  # details go below instead
        inline, all_cols, all_rows = False, cols, rows
        shown = list(range(len(cols)))
        table = _build(title, all_cols, all_rows, shown, **table_kw)
    hidden = []
    optional = [i for i in shown if not all_cols[i].keep]
    if (
        _measure(console, _build(title, all_cols, all_rows, [i for i in shown if all_cols[i].keep], **table_kw)).minimum
        > width
    ):
        _records(console, title, all_cols, all_rows)  # not even the kept values fit in a row
        _below(console, rows, details, inline)
        return
    while optional and _measure(console, table).minimum > width:
        drop = optional.pop()  # the rightmost optional column goes first
        shown.remove(drop)
        hidden.append(all_cols[drop].header)
        table = _build(title, all_cols, all_rows, shown, **table_kw)
    console.print(table)
    if hidden:
        console.print(
            Text(
                f"(not shown at {width} columns: {', '.join(reversed(hidden))}; "
                "a wider terminal, a pipe or --json shows them)",
                style="dim",
            )
        )
    _below(console, rows, details, inline)


def _records(console: Console, title, cols: list[Col], rows: list[list]) -> None:
    """One block per row, `header: value` lines: nothing cut however narrow."""
    if title:
        console.print(title if isinstance(title, Text) else Text(str(title)), style="bold")
    for row in rows:
        console.print(Text(plain(row[0]), style="bold"))
        for c, cell in zip(cols[1:], row[1:]):
            console.print(Text(f"  {c.header}: ") + (cell if isinstance(cell, Text) else Text.from_markup(str(cell))))


def print_table(console: Console, table: Table) -> None:
    """A rich Table as it is on a terminal; piped, as wide as its content (never
    wrapped at 80, whatever COLUMNS says), plain text."""
    if console.is_terminal:
        console.print(table)
        return
    width = max(_measure(console, table).maximum, 20)
    Console(file=console.file, width=width, color_system=None, highlight=False).print(table)


def console(stderr: bool = False, **kw) -> Console:
    """A terminal's own width; piped, lines are never wrapped (rules are 160 wide)."""
    con = Console(stderr=stderr, **kw)
    return con if con.is_terminal else Console(stderr=stderr, width=160, soft_wrap=True, **kw)


def _below(console: Console, rows, details, inline: bool) -> None:
    if inline:
        return
    for row, d in zip(rows, details):
        if d:
            host = plain(row[0])
            text = "\n".join(f"{host}: {line}" for line in d.rstrip("\n").splitlines())
            console.print(Text(text), soft_wrap=not console.is_terminal)
