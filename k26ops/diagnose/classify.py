"""Name the crash in an SGLang server log: `classify(text) -> Diagnosis`.

Pure (no I/O besides `classify_file`), so the CLI, the remote workflows and
tests all share it. Signatures (data) live in `signatures`; this module only
finds hits, checks their context, and says where they happened.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from k26ops.diagnose import chains
from k26ops.diagnose import signatures as S
from k26ops.diagnose.details import detail_for, oom_detail
from k26ops.diagnose.logtext import Line, clean_lines
from k26ops.facts import xid as X


@dataclass
class Diagnosis:
    """What crashed, where, and what to do. `signature` is a stable id."""

    signature: str | None  # None: no error in the log; "unclassified": an unknown one
    evidence: str
    phase: str | None = None  # "capture" (startup) / "replay" (runtime) / None
    rank: str | None = None  # "TP3", "DP2 TP2 EP2", "rank3", None
    algorithm: str | None = None  # DDTREE / DFLASH / EAGLE / ... if visible
    detail: dict = field(default_factory=dict)
    suggestion: str = ""
    title: str = ""
    line: int | None = None  # 1-based line of the evidence in the input
    error_found: bool = True  # False: the log holds no error at all (a clean log)

    def to_json(self) -> dict:
        return asdict(self)


class _Log:
    """Cleaned lines plus their text joined, for regexes that span lines."""

    def __init__(self, text: str):
        self.lines: list[Line] = clean_lines(text)
        self.starts: list[int] = []
        pos = 0
        for line in self.lines:
            self.starts.append(pos)
            pos += len(line.text) + 1
        self.flat = "\n".join(line.text for line in self.lines)
        self.lower = self.flat.lower()
        self.marks = chains.progress_marks(self.lines)
        self.serving = [k for k, line in enumerate(self.lines) if chains.SERVING.search(line.text)]
        self.ready = [k for k, line in enumerate(self.lines) if chains.READY.search(line.text)]
        # the echoes of an orderly stop someone asked for (SIGTERM): neither errors nor deaths; a stop lasts
        # until the next start (a journal holds the restart after it, and what that run did is its own)
        self.stop_echo, stopping = set(), False
        for k, line in enumerate(self.lines):
            if chains.STOP_REQUESTED.search(line.text):
                stopping = True
            elif chains.STARTED.search(line.text):
                stopping = False
            elif stopping and chains.STOP_ECHO.search(line.text):
                self.stop_echo.add(k)
        self.stop_echo.update(_script_end_echoes(self.lines))
        for k in [k for k in self.stop_echo if chains.is_exception(self.lines[k].text)]:
            start = chains.block_start(self.lines, k)  # the traceback that ends in an echo is one too
            self.stop_echo.update(range(start if start is not None else k, k + 1))
        for k in [k for k, line in enumerate(self.lines) if chains.IGNORED.match(line.text)]:
            # Python's own "Exception ignored in: <...>" (a __del__ or atexit at exit): ignored by it, and by us
            head = next(
                (j for j in range(k + 1, min(len(self.lines), k + 4)) if chains.HEADER.match(self.lines[j].text)), None
            )
            end = (
                next(
                    (
                        j
                        for j in range(head + 1, min(len(self.lines), head + chains.MAX_BLOCK))
                        if chains.is_exception(self.lines[j].text)
                    ),
                    head,
                )
                if head is not None
                else k
            )
            self.stop_echo.update(range(k, end + 1))  # at exit the frames come without their code lines
        self.fatal = [
            k for k, line in enumerate(self.lines) if chains.FATAL.search(line.text) and k not in self.stop_echo
        ]
        self._survived: dict[int, str | bool] = {}  # line -> "request" / "served" / False

    def index(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1

    def span_text(self, m: re.Match) -> tuple[int, str]:
        first, last = self.index(m.start()), self.index(max(m.start(), m.end() - 1))
        return first, " ".join(self.lines[k].text for k in range(first, last + 1))


def _script_end_echoes(lines: list[Line]) -> list[int]:
    """vLLM's offline client saying its engine 'died unexpectedly' after the log's last progress bar
    showed every prompt processed: the script's end, not a crash (vllm-project/vllm-ascend#5699,
    vllm#32468). Before the last prompt finished it stays an error; an error of its own stays one."""
    last, m = next(
        (
            (k, found[-1])  # a pasted tqdm line may hold several states: its last is where the bar stopped
            for k in range(len(lines) - 1, -1, -1)
            if (found := list(chains.OFFLINE_PROGRESS.finditer(lines[k].text)))
        ),
        (-1, None),
    )
    if m is None:
        return []
    if m.group("what") != "Processed prompts" or m.group("n") != m.group("total") or m.group("n") == "0":
        return []
    return [k for k in range(last + 1, len(lines)) if chains.ENGINE_GONE.search(lines[k].text)]


def _graph_context(log: _Log, i: int, sig: S.Signature) -> bool:
    first, last, has_frames = chains.chain(log.lines, i)
    text = "\n".join(line.text for line in log.lines[first : last + 1])
    if S.GRAPH_HINTS.search(text):
        return True
    if has_frames:
        return False
    if any(chains.FRAME.match(line.text) for line in log.lines):
        return False
    # A bare pasted message: the shape mismatch is specific enough on its own.
    return sig is S.SHAPE_MISMATCH or bool(S.GRAPH_HINTS.search(log.flat))


def phase_at(log: _Log, i: int) -> str | None:
    """capture / replay from the banner, then frames (innermost first), then
    startup progress lines."""
    first, last, _ = chains.chain(log.lines, i)
    window = "\n".join(line.text for line in log.lines[first : last + 1])
    if S.CAPTURE_BANNER.search(window):
        return "capture"
    for path, fn, _code in reversed(chains.frames(log.lines, first, last)):
        name = fn.lower()
        if "replay" in name:
            return "replay"
        if (
            "capture" in name
            or name in ("init_device_graphs", "init_cuda_graphs")
            or (name == "__init__" and "graph_runner" in path)
        ):
            return "capture"
    for path, fn, _code in reversed(chains.frames(log.lines, first, last)):
        if (
            fn
            in (
                "event_loop_normal",
                "event_loop_overlap",
                "run_batch",
                "forward_batch_generation",
                "process_batch_result",
            )
            or "event_loop" in fn
        ):
            return "replay"
    state = chains.startup_state(log.marks, i)
    return {"capture": "capture", "running": "replay"}.get(state or "")


def _capture_context(log: _Log, i: int) -> bool:
    return phase_at(log, i) == "capture"


def survived(log: _Log, i: int) -> bool:
    """The error at line i was one request's: the server caught it (a request-level handler's
    message heads its traceback), or it served before and after it and nothing says it died; or it
    came before the server said it was ready, which it then did, and nothing says it died."""
    if i in log._survived:
        return log._survived[i]
    first, _last, has_frames = chains.chain(log.lines, i)
    if chains.HEADER.match(log.lines[i].text):
        first, has_frames = i, True
    heads = [i] + (list(range(max(0, first - 2), first + 1)) if has_frames else [])
    caught = "request" if any(chains.REQUEST_LEVEL.search(log.lines[k].text) for k in heads) else False
    if not caught:
        running = chains.startup_state(log.marks, i) == "running" or any(k < first for k in log.serving)
        after = any(k > i for k in log.serving)
        started = not running and any(k > i for k in log.ready)
        caught = "served" if (running and after or started) and not any(k > first for k in log.fatal) else False
    log._survived[i] = caught
    return bool(caught)


def _primary(log: _Log) -> int | None:
    """The first real error: an exception closing a traceback, else any
    exception line, else an error-ish line; echoes of other failures and errors of
    single requests the server survived skipped."""
    candidates = [
        k
        for k, line in enumerate(log.lines)
        if chains.is_exception(line.text)
        and not S.SECONDARY.search(line.text)
        and k not in log.stop_echo
        and not line.quiet
        and not (k and chains.FRAME.match(log.lines[k - 1].text))
        and not survived(log, k)
    ]
    with_tb = next((k for k in candidates if chains.block_start(log.lines, k) is not None), None)
    if with_tb is not None or candidates:
        return with_tb if with_tb is not None else candidates[0]
    for k, line in enumerate(log.lines):
        if (
            (chains.ERRORISH.search(line.text) or line.error_level)
            and line.text
            and not line.quiet
            and not S.SECONDARY.search(line.text)
            and not chains.BENIGN.search(line.text)
            and k not in log.stop_echo
            and not survived(log, k)
        ):
            return k
    # Only echoes of a failure (e.g. gloo "Connection closed"): show the first.
    return next(
        (
            k
            for k, line in enumerate(log.lines)
            if not chains.BENIGN.search(line.text)
            and k not in log.stop_echo
            and not line.quiet
            and (
                chains.is_exception(line.text) or chains.ERRORISH.search(line.text) or (line.error_level and line.text)
            )
            and not survived(log, k)
        ),
        None,
    )


def _request_errors(log: _Log) -> int:
    """How many request-level errors the server survived: each handler message, and each
    exception the server outlived that no handler message headed."""
    heads = sum(1 for k, line in enumerate(log.lines) if chains.REQUEST_LEVEL.search(line.text) and survived(log, k))
    served = sum(
        1 for k, line in enumerate(log.lines) if chains.is_exception(line.text) and log._survived.get(k) == "served"
    )
    return heads + served


def _config_context(log: _Log, i: int) -> bool:
    """Raised by the engine's own argument/config checks (the innermost frame)."""
    first, _last, _ = chains.chain(log.lines, i)
    found = chains.frames(log.lines, first, i)
    return bool(found) and bool(S.CONFIG_FRAMES.search(found[-1][0]))


def oom_phase(log: _Log, i: int) -> str | None:
    """The phase an OOM at line i happened in (S.OOM_PHASES, first match in the table's order), from
    the frames of its traceback and the message itself; None when they show none."""
    first, last, has_frames = chains.chain(log.lines, i)
    text = "\n".join(f"{path} {fn} {code}" for path, fn, code in chains.frames(log.lines, first, last))
    if not has_frames:  # a traceback in another shape (IPython's "File [...], in fn(...)"): the lines above
        text = "\n".join(line.text for line in log.lines[max(0, i - 30) : i])
    for phase, rx, _where, _fix in S.OOM_PHASES:  # in the table's order: the start-up phases first
        if rx.search(text + "\n" + log.lines[i].text):
            return phase
    return None


def _accept(log: _Log, sig: S.Signature, i: int, primary: int | None) -> bool:
    if sig.context == "graph":
        return _graph_context(log, i, sig)
    if sig.context == "capture":
        return _capture_context(log, i) and oom_phase(log, i) is None
    if sig.context == "config":
        return _config_context(log, i)
    if sig.context == "not-capture":  # an OOM outside graph capture (CAPTURE_OOM takes the rest)
        return not _capture_context(log, i) or oom_phase(log, i) is not None
    if sig.context == "startup":  # raised before the engine served anything
        return chains.startup_state(log.marks, i) != "running" and not any(k < i for k in log.serving)
    if sig.context == "primary":
        if primary is None or i <= primary:
            return True
        return any(p.search(log.lines[primary].text) for p in sig.patterns)
    return True


def _hits(log: _Log, sig: S.Signature):
    found = []
    if sig.keywords and not any(k in log.lower for k in sig.keywords):
        return found
    for strong, patterns in ((True, sig.strong), (False, sig.patterns)):
        for rx in patterns:
            for m in rx.finditer(log.flat):
                found.append((log.index(m.start()), not strong, m))
    return sorted(found, key=lambda h: (h[0], h[1]))


def _first_accepted(log: _Log, sig: S.Signature, primary: int | None):
    """The earliest accepted hit, preferring a Python exception line (e.g. over
    NCCL's own WARN lines) among the next few hundred; bounded for huge logs."""
    first = None
    for n, (i, weak, m) in enumerate(_hits(log, sig)):
        if (first is not None and n > 300) or n > 3000:
            break
        if log.lines[i].quiet and primary is None and not any(not log.lines[k].quiet for k in log.fatal):
            continue  # a warning or info line may explain a crash, never make one
        if weak and not _accept(log, sig, i, primary):
            continue
        if weak and survived(log, i):
            continue
        if chains.is_exception(log.lines[i].text):
            return [(i, m)]
        first = first or (i, m)
    return [first] if first else []


def algorithm_in(text: str) -> str | None:
    """The speculative algorithm named in server args or frames, if any."""
    m = re.search(
        r"speculative[_-]algorithm['\"]?\s*[=:]?\s*['\"]?(?:SpeculativeAlgorithm\.)?"
        r"([A-Za-z0-9_]+)",
        text,
    )
    algo = m.group(1).upper() if m and m.group(1).upper() in S.ALGORITHMS else None  # not a code name
    budget = re.search(r"speculative[_-]ddtree[_-]budget['\"]?\s*[=:]?\s*['\"]?\d", text)
    if algo in (None, "DFLASH") and (budget or re.search(r"ddtree", text, re.I)):
        return "DDTREE"
    if algo:
        return algo
    for name in ("DFLASH", "EAGLE3", "EAGLE"):
        if re.search(name, text, re.IGNORECASE):
            return name
    return None


def _gpu_fault(text: str, soft: Diagnosis, bus_ids: dict | None) -> Diagnosis | None:
    """The kernel's Xid lines in the log, named before the software symptom they caused: a
    hardware Xid wins over any engine error; an application Xid names the crash only when
    the engine's own lines name nothing (its software signature keeps the Xid in `detail`)."""
    if not any(k in (text or "") for k in ("NVRM", "SXid", "device handle")):
        return None
    events = X.parse_kernel_text(text, bus_ids)
    if not events:
        return None
    hardware = [e for e in events if e.kind == "hardware" and e.action != "none"]
    pick = hardware[0] if hardware else next((e for e in events if e.kind == "application"), None)
    if pick is None:
        return None
    gpus = sorted({e.gpu for e in (hardware or [pick]) if e.gpu is not None})
    action = X.worst_action(hardware) if hardware else pick.action  # the named fault's, or a worse one's beside it
    detail = {
        "xid": pick.xid,
        "pci": pick.pci,
        "gpu": pick.gpu,
        "uuid": pick.uuid,
        "source": pick.source,
        "action": action,
        "meaning": pick.meaning,
        "events": len(events),
    }
    if pick.caused_by:
        detail["caused_by"] = pick.caused_by
    if len(gpus) > 1:
        detail["gpus"] = gpus
    if also := _also(pick, hardware):
        detail["also"] = also
    engine_error = (
        soft.error_found
        and soft.signature
        and not X.reports_gpu(soft.evidence)  # a kernel or nvidia-smi fault line is none of the engine's
        and soft.signature != S.GPU_ERROR_TEXT.id
    )
    if engine_error:
        detail["symptom"] = soft.signature
        detail["symptom_evidence"] = soft.evidence[:300]
    where = _where(pick) + (f" link {pick.link}" if pick.link is not None else "")
    said = f"The engine's own error ({soft.signature}: {soft.evidence[:120]})" if engine_error else ""
    symptom = (
        (
            f"{said} is what this fault caused, not its cause. "
            if hardware
            else f"{said} is this fault seen from the program. "
        )
        if engine_error
        else ""
    )
    detail = {k: v for k, v in detail.items() if v is not None}
    if hardware:
        return Diagnosis(
            signature=S.GPU_HARDWARE_FAULT,
            evidence=pick.text,
            title=S.GPU_HARDWARE_TITLE,
            detail=detail,
            line=pick.line + 1,
            rank=None,
            phase=soft.phase,
            algorithm=soft.algorithm,
            suggestion=S.GPU_FAULT_SUGGESTION.format(
                where=where,
                xid=pick.label,
                meaning=pick.meaning,
                also=f"Also: {also}. " if also else "",
                symptom=symptom,
                action=X.ACTION_TEXT[action],
            ),
        )
    if soft.error_found and soft.signature != S.UNCLASSIFIED:
        soft.detail = {**soft.detail, "xid": pick.xid, "xid_pci": pick.pci}
        return soft
    return Diagnosis(
        signature=S.GPU_APP_FAULT,
        evidence=pick.text,
        title=S.GPU_APP_TITLE,
        detail=detail,
        line=pick.line + 1,
        phase=soft.phase,
        algorithm=soft.algorithm,
        suggestion=S.GPU_APP_SUGGESTION.format(where=where, xid=pick.label, meaning=pick.meaning, symptom=symptom),
    )


def _where(e: X.XidEvent) -> str:
    """The device an event names: a GPU by index or PCI id, the driver's GPUn, or an NVSwitch."""
    if e.source == "sxid":
        return f"NVSwitch {e.name} (PCI {e.pci})"
    if e.gpu is not None:
        return f"GPU {e.gpu} ({e.pci})"
    return f"the GPU at PCI {e.pci}" if e.pci else f"the driver's {e.name}" if e.name else "a GPU"


MAX_ALSO = 8


def _also(pick: X.XidEvent, hardware: list[X.XidEvent]) -> str:
    """The other hardware faults beside the named one, so that none goes unsaid (gpud's README capture:
    Xid 79, then fatal SXid 20034 on five NVSwitch links): one entry per kind and device, its links
    listed; repeats of the named one's kind on its device left out."""
    groups: dict[tuple[str, str], list[int]] = {}
    named = _where(pick)
    for e in hardware:
        if e.label == pick.label and _where(e) == named and e.link == pick.link:
            continue  # the named fault, or its repeats
        name = f" {X.SXID_TABLE[e.xid][0]}" if e.source == "sxid" and e.xid in X.SXID_TABLE else ""
        links = groups.setdefault((f"{e.label}{name}", _where(e)), [])
        if e.link is not None and e.link not in links:
            links.append(e.link)
    entries = [
        f"{what} on {where}" + (f" link{'s' if len(links) > 1 else ''} {', '.join(map(str, links))}" if links else "")
        for (what, where), links in groups.items()
    ]
    more = f"; and {len(entries) - MAX_ALSO} more" if len(entries) > MAX_ALSO else ""
    return "; ".join(entries[:MAX_ALSO]) + more


def classify(text: str, base: str | None = None, bus_ids: dict | None = None) -> Diagnosis:
    """Classify one log text; never raises on odd input. `base` (the deployed
    engine's, e.g. sglang@<commit>) picks the suggestion that fits that code base;
    `bus_ids` (PCI bus id -> GPU index, from nvidia-smi) names the GPU of a kernel Xid."""
    soft = _classify_software(text, base)
    return _gpu_fault(text, soft, bus_ids) or soft


def _classify_software(text: str, base: str | None = None) -> Diagnosis:
    log = _Log(text or "")
    primary = _primary(log)
    algorithm = algorithm_in(log.flat)
    for sig in S.SIGNATURES:
        for i, m in _first_accepted(log, sig, primary):
            first, evidence = log.span_text(m)
            if first and _continues(log, first):  # an exception message a paste wrapped: from its start
                first, evidence = first - 1, log.lines[first - 1].text + evidence
            detail, suggestion = detail_for(sig, m, log.lines, first, algorithm, base)
            title = sig.title
            if sig is S.GPU_OOM:
                detail, suggestion = oom_detail(oom_phase(log, first), phase_at(log, first))
                title = f"out of GPU memory ({detail['phase']})"
            return Diagnosis(
                signature=sig.id,
                evidence=evidence,
                phase=phase_at(log, first),
                rank=log.lines[first].rank,
                algorithm=algorithm,
                detail=detail,
                suggestion=suggestion,
                title=title,
                line=log.lines[first].raw_index + 1,
            )
    if (killed := _killed(log, primary)) is not None:
        return killed
    if primary is None:
        survived_n = _request_errors(log)
        return Diagnosis(
            None,
            "",
            suggestion=S.NO_ERROR_SUGGESTION
            + (f" {survived_n} request-level error(s) the server survived were skipped." if survived_n else ""),
            title="no error found",
            algorithm=algorithm,
            error_found=False,
            detail={"request_errors": survived_n} if survived_n else {},
        )
    line = log.lines[primary]
    exc = chains.EXC_LINE.match(line.text)
    return Diagnosis(
        signature=S.UNCLASSIFIED,
        evidence=line.text,
        phase=phase_at(log, primary),
        rank=line.rank,
        algorithm=algorithm,
        detail={"exception": exc.group("type")} if exc else {},
        suggestion=S.UNCLASSIFIED_SUGGESTION,
        title="no known crash signature",
        line=line.raw_index + 1,
    )


def _continues(log: _Log, k: int) -> bool:
    """Line k is the rest of the exception line above it, wrapped by a paste ("... (4.26 GiB KV cach" /
    "e is needed, ..."): no record or frame of its own, the line above an exception not ending a sentence."""
    above, line = log.lines[k - 1].text, log.lines[k]
    return (
        chains.is_exception(above)
        and not chains.is_exception(line.text)
        and not line.new_record
        and not chains.FRAME.match(line.text)
        and not above.rstrip().endswith((".", "!", ")", ":"))
        and line.raw_index == log.lines[k - 1].raw_index + 1
        and not line.text[:1].isupper()
    )


def _killed(log: _Log, primary: int | None) -> Diagnosis | None:
    """A run SIGKILLed with no error text of its own (the primary line, if any, is no exception):
    'killed (signal 9)', and 'by the OOM killer' where the kernel log or journal in the text says so.
    Kills that echo a requested stop are not this."""
    if primary is not None and chains.is_exception(log.lines[primary].text):
        return None
    kills = [k for k, line in enumerate(log.lines) if S.KILLED.search(line.text) and k not in log.stop_echo]
    # sglang's cleanup after a failed child (SIGQUIT to the parent, then kill_process_tree) SIGKILLs the rest:
    # a kill after it is that cleanup's echo; a kill that set it off ("crashed with exit code -9") is not
    quit_at = next((k for k, line in enumerate(log.lines) if S.SIGQUIT_CLEANUP.search(line.text)), None)
    kills = [k for k in kills if quit_at is None or k <= quit_at]
    ooms = [k for k, line in enumerate(log.lines) if S.OOM_KILLER.search(line.text)]
    if not kills and not ooms:
        return None
    k = ooms[0] if ooms else kills[-1]
    oom = bool(ooms)
    title = S.KILLED_TITLE + (" by the OOM killer" if oom else "")
    return Diagnosis(
        signature=S.PROCESS_KILLED,
        evidence=log.lines[k].text,
        title=title,
        detail={"signal": 9, "oom_killer": oom},
        suggestion=S.KILLED_SUGGESTION.format(
            by=" (by the OOM killer)" if oom else "", fix=S.KILLED_FIX_OOM if oom else S.KILLED_FIX
        ),
        phase=phase_at(log, k),
        line=log.lines[k].raw_index + 1,
    )


def classify_file(path: str | Path) -> Diagnosis:
    """Classify a log file (read as UTF-8, undecodable bytes replaced)."""
    return classify(Path(path).read_text(encoding="utf-8", errors="replace"))
