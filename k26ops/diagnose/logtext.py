"""Turn a raw log (journald, docker-compose, Kubernetes, SGLang, torchrun,
pasted) into clean lines that remember the rank/process that printed them.

Why: the same traceback reaches us behind many prefixes and is often pasted
without indentation; matchers should see only the message text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
RANK_TOKEN = r"(?:ATTN_DP|ATTN_TP|MOE_DP|MOE_EP|DP|TP|EP|PP|CP|DCP)\d+"

# Prefixes that carry no rank, tried repeatedly at the start of a line.
_PLAIN_PREFIXES = [
    # journald short / short-iso / short-precise: "Nov 29 10:00:00 host unit[123]: "
    re.compile(r"^[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\S+\s+[^\s:\[]+(?:\[\d+\])?:\s?"),
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+\S+\s+"
               r"[^\s:\[]+\[\d+\]:\s?"),
    # Kubernetes CRI: "<ts> stdout F " / kubectl --timestamps / docker --timestamps
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"
               r"(?:(?:stdout|stderr)\s+[FP]\s)?"),
    # docker-compose "name  | " (also "name-1  | ")
    re.compile(r"^[A-Za-z0-9][\w.\-]*\s*\|\s?(?=.)"),
    # glog-style from torch C++: "[E520 08:02:44.123456 1234 ProcessGroupNCCL.cpp:616] "
    # (older torch: "[E ProcessGroupNCCL.cpp:474] ")
    re.compile(r"^\[?[EWIF](?:\d{3,4}\s+\d\d:\d\d:\d\d\.\d+\s+)?(?:\d+\s+)?[\w./-]+\.\w+:\d+\]\s*"),
    # plain logging timestamps: "2026-05-20 08:02:44,123 " / "INFO 05-20 08:02:44 "
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+(?:-\s+)?"),
]
# SGLang "[2026-05-20 08:02:44 TP7] " or "[2026-05-20 08:02:44 DP2 TP2 EP2] "
_SGLANG = re.compile(r"^\[(?:\d{4}-\d\d-\d\d[ T][\d:.,]+|\.\.\.|[^\]]{0,40}?)\s*"
                     rf"(?P<rank>{RANK_TOKEN}(?:\s+{RANK_TOKEN})*)?\]\s?")
_SGLANG_DATE = re.compile(r"^\[\d{4}-\d\d-\d\d[ T][\d:.,]+\s*\]\s?")
# torchrun "[rank3]: ", "[default0]:"
_TORCHRUN = re.compile(r"^\[(?P<rank>rank\d+|default\d+)\]:\s?")
_NCCL_RANK = re.compile(r"\[(?:PG[^\]]*?\s)?Rank\s+(?P<n>\d+)\]")
# "Scheduler hit an exception: Traceback ..." / "... hit an exception: ValueError: x"
_SPLIT_AT = re.compile(r"(?<=\S)\s*(?=Traceback \(most recent call last\):)|"
                       r"(?<=hit an exception:)\s+(?=\S)")


@dataclass
class Line:
    text: str          # message text, prefixes removed, stripped
    rank: str | None   # "TP3", "DP2 TP2 EP2", "rank3", or None
    raw_index: int     # index of the source line in the input
    new_record: bool = False  # began with an SGLang "[time RANK]" prefix


def strip_prefixes(line: str) -> tuple[str, str | None, bool]:
    """Remove known prefixes; return (text, rank found in them, whether an
    SGLang record prefix was among them)."""
    rank, record = None, False
    text = ANSI.sub("", line).replace("\r", "").rstrip()
    for _ in range(6):
        before = text
        stripped = text.lstrip()
        m = _TORCHRUN.match(stripped)
        if m:
            rank = rank or m.group("rank")
            text = stripped[m.end():]
            continue
        m = _SGLANG.match(stripped)
        if m and (m.group("rank") or _SGLANG_DATE.match(stripped)):
            rank = m.group("rank") or rank
            text = stripped[m.end():]
            record = True
            continue
        for rx in _PLAIN_PREFIXES:
            m = rx.match(stripped)
            if m and m.end() > 0:
                text = stripped[m.end():]
                break
        if text == before:
            break
    return text.strip(), rank, record


def clean_lines(text: str) -> list[Line]:
    """Clean every line; lines without their own rank inherit the last one seen
    (a multi-line SGLang record carries its prefix only on the first line)."""
    out: list[Line] = []
    current = None
    for i, raw in enumerate(text.splitlines()):
        body, rank, record = strip_prefixes(raw)
        if rank is None:
            m = _NCCL_RANK.search(body)
            if m:
                rank = f"rank{m.group('n')}"
        if rank is not None:
            current = rank
        elif not body:
            continue
        parts = _SPLIT_AT.split(body) if "Traceback" in body or "hit an" in body else [body]
        for n, part in enumerate(parts):
            out.append(Line(part.strip(), current, i, record and n == 0))
    return out
