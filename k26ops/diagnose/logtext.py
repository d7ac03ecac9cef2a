"""Turn a raw log (journald, docker-compose, Kubernetes, SGLang, torchrun,
vLLM workers, Ray, CI runners, pasted) into clean lines that remember the
rank/process that printed them.

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
    # journald short / short-precise: "Nov 29 10:00:00 host unit[123]: "
    # journald short(-precise) "Nov 29 10:00:00 host unit[123]: ", short-unix "1764494042.123456 host
    # unit[123]: ", short-full "Sun 2026-11-30 09:14:02 UTC host unit[123]: "
    re.compile(
        r"^(?:[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d(?:\.\d+)?|\d{9,11}\.\d+|"
        r"[A-Z][a-z]{2}\s+\d{4}-\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+[A-Z]{2,5})"
        r"\s+\S+\s+[^\s:\[]+(?:\[\d+\])?:\s?"
    ),
    # journald short-iso(-precise): "2026-11-30T09:14:02+0000 host unit[123]: " (the pid is
    # required: without it a kubectl --timestamps line would look the same)
    re.compile(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+\S+\s+"
        r"[^\s:\[]+\[\d+\]:\s?"
    ),
    # kubectl logs --prefix: "[pod/engine-0/sglang] "
    re.compile(r"^\[pod/[^\]/\s]+/[^\]\s]+\]\s?"),
    # CI runners (Buildkite): "[2025-12-13T19:54:35Z] "
    re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?Z\]\s?"),
    # llama.cpp common_log: "0.00.461.531 E "
    re.compile(r"^\d+\.\d\d\.\d{3}\.\d{3}\s+[EWIDN]\s+"),
    # Ray components without a pid: "(raylet) ", "(gcs_server) "
    re.compile(r"^\((?:raylet|gcs_server|autoscaler|monitor)(?:,\s*ip=[\d.]+)?\)\s?"),
    # Kubernetes CRI: "<ts> stdout F " / kubectl --timestamps / docker --timestamps
    re.compile(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"
        r"(?:(?:stdout|stderr)\s+[FP]\s)?"
    ),
    # docker-compose "name  | " (also "name-1  | ")
    re.compile(r"^[A-Za-z0-9][\w.\-]*\s*\|\s?(?=.)"),
    # glog-style from torch C++: "[E520 08:02:44.123456 1234 ProcessGroupNCCL.cpp:616] "
    # (older torch: "[E ProcessGroupNCCL.cpp:474] "); its letter is the level (see _GLOG_LEVEL)
    re.compile(r"^\[?[EWIF](?:\d{3,4}\s+\d\d:\d\d:\d\d\.\d+\s+)?(?:\d+\s+)?[\w./-]+\.\w+:\d+\]\s*"),
    # FastChat/LLaVA-style logging after its time stamp: "| ERROR | stderr | " (a child's stderr logged
    # at ERROR whatever it says: the message's own level word, if any, is the line's; haotian-liu/LLaVA#415)
    re.compile(r"^\|\s*(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|\s*[\w.\-]+\s*\|\s?"),
    # plain logging timestamps: "2026-05-20 08:02:44,123 " / "INFO 05-20 08:02:44 "
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+(?:-\s+)?"),
    # a paste's own elision before the text it kept: "... EngineDeadError: EngineCore encountered an
    # issue." (vllm-project/vllm#50067); unread, the exception line under it was no error at all
    re.compile(r"^(?:\.\.\.|…)\s+(?=\S)"),
]
# SGLang "[2026-05-20 08:02:44 TP7] " or "[2026-05-20 08:02:44 DP2 TP2 EP2] "
_SGLANG = re.compile(
    r"^\[(?:\d{4}-\d\d-\d\d[ T][\d:.,]+|\.\.\.|[^\]]{0,40}?)\s*"
    rf"(?P<rank>{RANK_TOKEN}(?:\s+{RANK_TOKEN})*)?\]\s?"
)
_SGLANG_DATE = re.compile(r"^\[\d{4}-\d\d-\d\d[ T][\d:.,]+\s*\]\s?")
# torchrun "[rank3]: ", "[default0]:"
_TORCHRUN = re.compile(r"^\[(?P<rank>rank\d+|default\d+)\]:\s?")
# vLLM / Ray process prefixes: "(VllmWorker rank=3 pid=1090) ", "(Worker_TP1_EP1 pid=1045) ",
# "(EngineCore_DP0 pid=150) ", "(RayWorkerWrapper pid=206994, ip=192.168.10.25) ", "(pid=123) "
_PROCESS = re.compile(
    r"^\((?:(?P<name>[A-Za-z_][\w.:-]*)\s+)?(?:rank=(?P<rank>\d+)\s+)?pid=\d+"
    r"(?:,\s*ip=[\d.]+)?\)\s?"
)
_NAME_RANKS = re.compile(r"_(?P<kind>TP|EP|DP|PP)(?P<n>\d+)")
# vLLM log records: "ERROR 06-05 06:18:13 [multiproc_executor.py:470] ", "INFO 08-19 07:51:03 model_runner.py:732] "
_VLLM_RECORD = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+"
    r"\d\d:\d\d:\d\d(?:\.\d+)?\s+(?:\[[\w./-]+:\d+\]|[\w./-]+\.py:\d+\])\s?"
)
# The level a line's logger gave it, where its words show one: glog's letter ("[W508 00:41:45.80 ...
# ProcessGroupNCCL.cpp:1496]"), Python logging's and uvicorn's level word at the start ("WARNING:  ...",
# "WARNING - ...", "[WARNING] ...", Ray's "WARNING utils.py:580 -- ..."), a Python warning ("x.py:61:
# FutureWarning: ...", "UserWarning: ..."), NCCL's "NCCL INFO" lines. None: the line does not say.
_GLOG_LEVEL = re.compile(r"^\[?(?P<letter>[EWIF])(?:\d{3,4}\s+\d\d:\d\d:\d\d\.\d+\s+)?(?:\d+\s+)?[\w./-]+\.\w+:\d+\]")
_LEVEL_WORD = re.compile(
    r"^(?:-\s+)?\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?(?::|\s+-+\s|\s+[\w./-]+\.py:\d+|\s)"
)
_PY_WARNING = re.compile(r"^(?:\S+:\d+:\s+)?[A-Z]\w*Warning:\s")
_NCCL_INFO = re.compile(r"\bNCCL INFO\b")
_LEVELS = {
    "E": "error",
    "F": "error",
    "W": "warning",
    "I": "info",
    "DEBUG": "debug",
    "INFO": "info",
    "WARNING": "warning",
    "WARN": "warning",
    "ERROR": "error",
    "CRITICAL": "error",
    "FATAL": "error",
}
_NCCL_RANK = re.compile(r"\[(?:PG[^\]]*?\s)?Rank\s+(?P<n>\d+)\]")
# "Scheduler hit an exception: Traceback ..." / "... hit an exception: ValueError: x"
_SPLIT_AT = re.compile(
    r"(?<=\S)\s*(?=Traceback \(most recent call last\):)|"
    r"(?<=hit an exception:)\s+(?=\S)"
)


@dataclass
class Line:
    text: str  # message text, prefixes removed, stripped
    rank: str | None  # "TP3", "DP2 TP2 EP2", "rank3", or None
    raw_index: int  # index of the source line in the input
    new_record: bool = False  # began with an SGLang "[time RANK]" prefix
    error_level: bool = False  # its logger prefix said ERROR/CRITICAL
    level: str | None = None  # debug / info / warning / error, where the line shows it (level_of)

    @property
    def quiet(self) -> bool:
        """Its logger called it info, debug or a warning: the engine's own words that it is no error."""
        return self.level in ("debug", "info", "warning")


def _process_rank(m: re.Match) -> str | None:
    if m.group("rank"):
        return f"rank{m.group('rank')}"
    found = _NAME_RANKS.findall(m.group("name") or "")
    return " ".join(kind + n for kind, n in found) or None


def level_of(text: str) -> str | None:
    """The level a (prefix-stripped or raw) line's own words give it, else None."""
    if m := _LEVEL_WORD.match(text):
        return _LEVELS[m.group("level")]
    if _PY_WARNING.match(text):
        return "warning"
    if "NCCL INFO" in text and _NCCL_INFO.search(text):
        return "info"
    return None


def strip_prefixes(line: str) -> tuple[str, str | None, bool, bool]:
    """Remove known prefixes; return (text, rank found in them, whether an
    SGLang record prefix was among them, whether a logger prefix said ERROR)."""
    text, rank, record, level = _strip(line)
    return text, rank, record, level == "error"


def _strip(line: str) -> tuple[str, str | None, bool, str | None]:
    rank, record, level = None, False, None
    text = ANSI.sub("", line).replace("\r", "").rstrip()
    for _ in range(8):
        before = text
        stripped = text.lstrip()
        if level is None and (m := _GLOG_LEVEL.match(stripped)):
            level = _LEVELS[m.group("letter")]
        m = _TORCHRUN.match(stripped)
        if m:
            rank = rank or m.group("rank")
            text = stripped[m.end() :]
            continue
        m = _PROCESS.match(stripped)
        if m:
            rank = rank or _process_rank(m)
            text = stripped[m.end() :]
            continue
        m = _VLLM_RECORD.match(stripped)
        if m:
            level = level or _LEVELS[m.group("level")]
            text = stripped[m.end() :]
            continue
        m = _SGLANG.match(stripped)
        if m and (m.group("rank") or _SGLANG_DATE.match(stripped)):
            rank = m.group("rank") or rank
            text = stripped[m.end() :]
            record = True
            continue
        for rx in _PLAIN_PREFIXES:
            m = rx.match(stripped)
            if m and m.end() > 0:
                text = stripped[m.end() :]
                break
        if text == before:
            break
    text = text.strip()
    return text, rank, record, level or level_of(text)


def clean_lines(text: str) -> list[Line]:
    """Clean every line; lines without their own rank inherit the last one seen
    (a multi-line SGLang record carries its prefix only on the first line)."""
    out: list[Line] = []
    current = None
    for i, raw in enumerate(text.splitlines()):
        body, rank, record, level = _strip(raw)
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
            out.append(Line(part.strip(), current, i, record and n == 0, level == "error", level))
    return out
