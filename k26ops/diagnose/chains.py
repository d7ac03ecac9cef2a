"""Traceback structure in cleaned log lines: exception lines, the traceback
block that ends at an error, chained blocks, frames, startup progress.

Why: a message alone rarely says where it happened; the frames above it (and
the chained exception after it) say whether CUDA-graph capture or replay ran.
"""

from __future__ import annotations

import bisect
import re

from k26ops.diagnose.logtext import Line

HEADER = re.compile(r"^Traceback \(most recent call last\):")
CHAIN_MARK = re.compile(
    r"The above exception was the direct cause|"
    r"During handling of the above exception"
)
FRAME = re.compile(r'^File "(?P<path>[^"]+)", line \d+, in (?P<fn>[\w<>.]+)')
EXC_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z_]\w*)?(?:Error|Exception|Exit|Interrupt|Fault))"
    r"(?::\s*(?P<msg>.*))?$"
)
# Error-ish lines when no exception line is there: words, a traceback header, a torch
# size message pasted without its first half.
ERRORISH = re.compile(
    r"\b(?:error|fatal|failed|failure|exception)\b|^Traceback \(most recent|"
    r"\bnon-singleton\s+dimension\b",
    re.IGNORECASE,
)
# sglang 0.5.17/0.5.23 name the graph: "Capture target verify CUDA graph begin." (seen on a real H200 run)
PROGRESS = re.compile(
    r"(?P<begin>Capture (?:[\w-]+ )*(?:cuda|CUDA) graph begin|Capturing batches)|"
    r"(?P<end>Capture (?:[\w-]+ )*(?:cuda|CUDA) graph end|fired up and ready to roll|"
    r"Uvicorn running on)",
    re.IGNORECASE,
)
# Lines with an error word that a healthy engine prints (seen in real sglang 0.5.17 start-up
# logs, tests/data/rehearsal: a model module whose optional dependency is absent is skipped;
# the rerank endpoint's warning without a tokenizer, entrypoints/openai/serving_rerank.py:45).
BENIGN = re.compile(
    r"Ignore import error when loading sglang\.srt\.[\w.]+|"
    # unified-memory GPUs (GB10/Grace): nvidia-smi reports no memory, sglang falls back to
    # torch.cuda.mem_get_info() and serves (CoralLeiCN/DGXSpark-Small-LLMs' run notes)
    r"Failed to get GPU memory capacity from nvidia-smi|"
    # NVSwitch SXid lines that are no fault: non-fatal ones and their Severity/Data lines
    r"SXid \([^)]*\): \d+, (?:Non-fatal|Severity \d|Data \{)|"
    # nvidia-smi -q counters: "Correctable Error : 0", "Double Bit ECC : 0" are zeros, not errors
    r"^[A-Za-z][\w .()/-]*\b(?:Errors?|ECC|Failure Occurred)\b[\w .()/-]*:\s*(?:0|No|N/A|None|"
    r"\[N/A\]|Not Active|Not Supported)\s*$|"
    r"Failed to get yes/no token IDs dynamically|"
    # NCCL's plugin probe at init (INFO level): NVIDIA/nccl#1000, aws-ofi-nccl#715
    r"\bNCCL INFO (?:NET|ENV|TUNER|PROFILER)/Plugin ?: (?:Failed to find \w+ symbol|"
    r"Could not find|No plugin found|Plugin load returned)"
)
# A request-level error: the server caught it, answered that request with an error status and
# went on serving (vLLM's OpenAI handlers, entrypoints/openai/serving_*.py; uvicorn's per-request
# handler). Seen in vllm-project/vllm#15018 and PR #21391.
REQUEST_LEVEL = re.compile(
    r"Error in preprocessing prompt inputs|^Error with model object=|"
    r"^Exception in ASGI application$"
)
# Lines that say the server finished starting and listens: an error line before one of them did not
# stop the start (sglang's "The server is fired up and ready to roll!", uvicorn's own lines).
READY = re.compile(r"fired up and ready to roll|Application startup complete|Uvicorn running on")
# Lines that say the server served a request or ran a batch.
SERVING = re.compile(
    r'"(?:POST|GET) /\S* HTTP/[\d.]+" 2\d\d\b|\b(?:Prefill|Decode) batch[.,]|'
    r"Avg prompt throughput: .*Running: \d+ reqs"
)
# An orderly stop that someone asked for: sglang's SIGTERM handler (0.5.17, seen on a real
# H200 run stopped by SIGTERM to its process group, as `systemctl stop/restart` stops it;
# tests/data/serving), systemd's own "Stopping <unit>". What follows it and only echoes the
# stop (the scheduler "crashed" with -15/-9, the SIGQUIT cleanup) is not an error.
STOP_REQUESTED = re.compile(
    r"SIGTERM received\b.*(?:Draining|shutting down)|^Stopping \S+\.service\b|"
    # vLLM's own shutdown log (launcher.py / core.py, "[shutdown] ..." since 2026)
    r"\[shutdown\] (?:API server: shutdown triggered|EngineCore: trigger received "
    r"signal=SIG(?:TERM|INT))|"
    # systemd stopping a unit by its description: "Stopping vLLM Qwen3 (...)..."
    r"^Stopping .+\.\.\.$|"
    # sglang's drain after SIGTERM (tokenizer_manager.sigterm_watchdog; older builds
    # print only this line): "Gracefully exiting... Remaining number of requests 0"
    r"^Gracefully exiting\.\.\. remaining number of requests",
    re.IGNORECASE,
)
# A (re)start after a stop: systemd's "Started <unit>." / "Starting <unit>...", the engine's first lines.
STARTED = re.compile(
    r"^Started .+\.$|^Starting .+\.\.\.$|server_args=ServerArgs\(|Started server process \[\d+\]|"
    r"vLLM API server version"
)
STOP_ECHO = re.compile(
    r"crashed with exit code -(?:15|9)\b|Triggering SIGQUIT for cleanup|SIGQUIT received|"
    # vLLM's output handler meeting the engine it is stopping (vllm-project/vllm#48745)
    r"AsyncLLM output_handler failed|EngineDeadError|EngineCore encountered an issue|"
    r"force killing remaining process|"
    r"Received sigquit|before crash diagnostics|No live scheduler processes found|"
    r"kill_process_tree called|"
    # the drain's end: sglang SIGKILLs its own process tree (kill_process_tree with the
    # parent), so the shell says "Killed" and systemd "code=killed, status=9/KILL"
    r"^Killed\s*$|code=killed, status=(?:9/KILL|15/TERM)|Failed with result 'signal'|"
    r"State 'stop-sigterm' timed out|with signal SIGKILL|"
    # systemd's account of the stopped process's exit status: the stop's, not a crash
    r"Main process exited, code=exited, status=\d+|Failed with result 'exit-code'",
    re.IGNORECASE,
)
# vLLM's offline LLM: its progress bars ("Adding requests: 100%|...| 4/4", "Processed prompts: 100%|...| 4/4");
# the client finding its engine process gone, after a crash and at a script's normal end alike (vllm#32468)
OFFLINE_PROGRESS = re.compile(
    r"(?P<what>Adding requests|Processed prompts):\s*\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)"
)
ENGINE_GONE = re.compile(r"Engine core proc \S+ died unexpectedly, shutting down client")
# Python's report of an exception it ignored (in a __del__, a weakref callback, atexit), then its traceback.
IGNORED = re.compile(r"^Exception ignored (?:in|on|while)\b")
# Lines that say the process died or is going down.
FATAL = re.compile(
    r"Received sigquit|SIGQUIT|\bKilled\b|core dumped|\bAborted\b|Fatal Python error|"
    r"EngineDeadError|Main process exited|Failed with result|Shutting down|"
    r"terminate called|exited with|is dead|died\b",
    re.IGNORECASE,
)
MAX_BLOCK = 250


def is_exception(text: str) -> bool:
    return bool(EXC_LINE.match(text)) and not HEADER.match(text)


def block_start(lines: list[Line], i: int) -> int | None:
    """Index of the Traceback header whose block ends at line i, if any."""
    anchor = i
    for j in range(i - 1, max(-1, i - MAX_BLOCK), -1):
        text = lines[j].text
        if HEADER.match(text):
            return j
        if is_exception(text) and not FRAME.match(lines[j - 1].text if j else ""):
            continued = anchor - j <= 12 and not any(lines[k].new_record for k in range(j + 1, anchor + 1))
            if not continued:
                return None  # the end of an earlier traceback
            anchor = j  # line i continues the message of exception j
    return None


def block_end(lines: list[Line], start: int) -> int:
    """The exception line closing the traceback that starts at `start`."""
    for j in range(start + 1, min(len(lines), start + MAX_BLOCK)):
        if is_exception(lines[j].text) and not FRAME.match(lines[j - 1].text):
            return j
        if HEADER.match(lines[j].text):
            return j - 1
    return min(len(lines), start + MAX_BLOCK) - 1


def _next_chained(lines: list[Line], end: int) -> int | None:
    """Header of the block chained after the exception at `end`, if any."""
    for j in range(end + 1, min(len(lines), end + 15)):
        if CHAIN_MARK.search(lines[j].text):
            for k in range(j + 1, min(len(lines), j + 4)):
                if HEADER.match(lines[k].text):
                    return k
            return None
        if HEADER.match(lines[j].text):
            return None
    return None


def _frame_part(lines: list[Line], j: int) -> bool:
    """Line j is a frame, its code line, or the ^^^ marker under that code."""
    at = lambda k: k >= 0 and bool(FRAME.match(lines[k].text))  # noqa: E731
    return at(j) or at(j - 1) or (at(j - 2) and set(lines[j].text) <= set("^~ "))


def _headerless(lines: list[Line], i: int) -> tuple[int, int] | None:
    """A traceback pasted without its header: (first frame line, end) when frames
    run up to line i, or when the same exception is printed again with a full
    traceback right after it (e.g. by multiprocessing's "Process X:")."""
    first = i
    while first > 0 and _frame_part(lines, first - 1):
        first -= 1
    if first < i:
        return first, i
    for j in range(i + 1, min(len(lines), i + 4)):
        if HEADER.match(lines[j].text):
            return i, block_end(lines, j)
    return None


def chain(lines: list[Line], i: int) -> tuple[int, int, bool]:
    """(first, last, has_frames): the chained tracebacks containing line i;
    without a traceback, a few lines around i."""
    start = block_start(lines, i)
    if start is None:
        found = _headerless(lines, i)
        if found is None:
            return max(0, i - 3), min(len(lines) - 1, i + 3), False
        first, end = found
    else:
        first, end = start, block_end(lines, start)
    # Walk back over earlier chained blocks.
    while first > 0:
        prev = [j for j in range(first - 1, max(-1, first - 4), -1) if CHAIN_MARK.search(lines[j].text)]
        if not prev:
            break
        earlier = block_start(lines, prev[0])
        if earlier is None:
            break
        first = earlier
    while (nxt := _next_chained(lines, end)) is not None:
        end = block_end(lines, nxt)
    end = max(end, i)
    tail = min(len(lines) - 1, end + 8)  # the message's continuation lines
    has_frames = any(FRAME.match(lines[j].text) for j in range(first, end + 1))
    return first, tail, has_frames


def frames(lines: list[Line], first: int, last: int) -> list[tuple[str, str, str]]:
    """(path, function, code line) of each frame, outermost first."""
    out = []
    for j in range(first, last + 1):
        m = FRAME.match(lines[j].text)
        if m:
            code = lines[j + 1].text if j + 1 <= last else ""
            code = "" if FRAME.match(code) or is_exception(code) else code
            out.append((m.group("path"), m.group("fn"), code))
    return out


def progress_marks(lines: list[Line]) -> list[tuple[int, str]]:
    """(line, 'capture'|'running') for each startup progress line, in order."""
    marks = []
    for j, line in enumerate(lines):
        if ("aptur" in line.text or "ready to roll" in line.text or "Uvicorn" in line.text) and (
            m := PROGRESS.search(line.text)
        ):
            marks.append((j, "capture" if m.group("begin") else "running"))
    return marks


def startup_state(marks: list[tuple[int, str]], i: int) -> str | None:
    """'capture' if graph capture had begun and not ended by line i,
    'running' if the server had finished starting, else None."""
    k = bisect.bisect_right(marks, (i, "~")) - 1
    return marks[k][1] if k >= 0 else None
