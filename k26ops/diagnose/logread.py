"""A log read for `diagnose log` in bounded memory and time, whatever its size.

The classifier reads every line with many regexes (about 1 s a MiB of random bytes on a
lab machine), so a 1 GB log, or one line of 1 GB, would take minutes and gigabytes. A
crash is told by its last lines and the start-up by its first: the read streams the input
in chunks and keeps its first HEAD bytes and its last TAIL bytes of lines, each line cut
at LINE_MAX bytes; what it left out is counted, so the caller can say so, and the line
numbers of the kept tail are mapped back to the input's (`input_line`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

LINE_MAX = 4096  # bytes of one line kept (a traceback line is far shorter)
HEAD = 1 << 20  # the first lines kept: start-up, flags, the first error
TAIL = 3 << 20  # the last lines kept: the crash
CHUNK = 1 << 20


@dataclass
class Read:
    text: str
    lines: int = 0  # lines in the input
    bytes: int = 0  # bytes in the input
    head_lines: int = 0  # lines kept from the start (the first `head_lines` of the input)
    left_out: int = 0  # lines between the head and the tail not kept
    cut: int = 0  # lines longer than LINE_MAX, cut

    def input_line(self, n: int | None) -> int | None:
        """The input's line number of line `n` (1-based) of `text`."""
        if n is None or not self.left_out or n <= self.head_lines:
            return n
        return n - 1 + self.left_out  # the marker line stands for the lines left out

    def note(self) -> str | None:
        """One line saying what was not read, or None when all of it was."""
        if not (self.left_out or self.cut):
            return None
        parts = []
        if self.left_out:
            parts.append(
                f"{self.left_out} of {self.lines} lines in the middle left out (read: the first "
                f"{HEAD >> 20} MiB and the last {TAIL >> 20} MiB of {self.bytes / (1 << 20):.0f} MiB)"
            )
        if self.cut:
            parts.append(f"{self.cut} line(s) longer than {LINE_MAX} bytes cut")
        return "; ".join(parts)


def read_bounded(fh, head: int = HEAD, tail: int = TAIL, line_max: int = LINE_MAX) -> Read:
    """Stream the binary file `fh`: at most `head` + `tail` bytes (plus one line) held."""
    first: list[bytes] = []
    last: deque[bytes] = deque()
    st = {"first": 0, "last": 0, "dropped": 0, "cut": 0, "lines": 0}
    cur = bytearray()
    extra = 0  # bytes of the current line past line_max
    total = 0

    def done(line: bytes, over: int) -> None:
        st["lines"] += 1
        if over:
            st["cut"] += 1
            line += b" [... %d bytes cut]" % over
        if not last and st["first"] + len(line) + 1 <= head:
            first.append(line)
            st["first"] += len(line) + 1
            return
        last.append(line)
        st["last"] += len(line) + 1
        while st["last"] > tail and len(last) > 1:
            st["last"] -= len(last.popleft()) + 1
            st["dropped"] += 1

    while True:
        chunk = fh.read(CHUNK)
        if not chunk:
            break
        total += len(chunk)
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            room = max(0, line_max - len(cur))
            if room:
                cur += part[:room]
            extra += max(0, len(part) - room)
            if i < len(parts) - 1:  # the line ended in this chunk
                done(bytes(cur), extra)
                cur, extra = bytearray(), 0
    if cur or extra:
        done(bytes(cur), extra)
    kept = first + ([b"[... %d lines left out by k26ops ...]" % st["dropped"]] if st["dropped"] else []) + list(last)
    return Read(
        b"\n".join(kept).decode("utf-8", "replace"),
        lines=st["lines"],
        bytes=total,
        head_lines=len(first),
        left_out=st["dropped"],
        cut=st["cut"],
    )
