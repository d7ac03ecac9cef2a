"""Host facts: shell commands plus pure parsers, gathered in one remote call.

    from k26ops import facts
    values = facts.gather(runner)                      # every fact
    values = facts.gather(runner, ["gpus", "python3"])  # a subset
    values = facts.gather(runner, extra=[facts.disk_free_fact(["/models"])])

`runner` is anything with `.run(command, *, stdin=None, timeout=None)`
returning an object with `.exited`, `.stdout`, `.stderr` (a Fabric
Connection wrapper, or a local subprocess runner). One `agents.run` call
ships agents/gather.py and the command list; parsing happens here. Fact values
carry errors ({"error": ...}, None) instead of raising; only a failure of the
gathering itself (no python3 on the host, garbled output) raises GatherError.
"""

from __future__ import annotations

from k26ops.facts import cuda, disk, driver, fabric, gpu, smi_q, xid
from k26ops.facts import os as os_facts
from k26ops.facts.base import Fact
from k26ops.facts.disk import disk_free_fact
from k26ops.transport import agents

FACTS: dict[str, Fact] = {
    **gpu.FACTS,
    **smi_q.FACTS,
    **xid.FACTS,
    **cuda.FACTS,
    **os_facts.FACTS,
    **disk.FACTS,
    **driver.FACTS,
    **fabric.FACTS,
}
SLACK_S = 15.0

__all__ = ["FACTS", "Fact", "GatherError", "gather", "command_list", "parse_results", "disk_free_fact"]


class GatherError(Exception):
    """The gatherer itself failed on the host (not one fact)."""


def _select(names=None, extra=()) -> list[Fact]:
    table = dict(FACTS)
    for f in extra:
        table[f.name] = f
    wanted = list(names) if names is not None else list(table)
    for f in extra:
        if f.name not in wanted:
            wanted.append(f.name)
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise KeyError(f"unknown fact(s): {', '.join(unknown)} (known: {', '.join(table)})")
    return [table[n] for n in wanted]


def command_list(names=None, extra=(), python: str = "python3") -> list[dict]:
    """The JSON-able list agents/gather.py's op "gather" runs. A fact the agent answers
    itself (Fact.own) is marked so only when the agent runs as `python3`, the
    interpreter those commands name; under another it runs the command."""
    return [
        {"name": f.name, "command": f.command, "timeout": f.timeout}
        | ({"own": f.own, "args": list(f.own_args)} if f.own and python == "python3" else {})
        for f in _select(names, extra)
    ]


def parse_results(raw: dict, names=None, extra=()) -> dict:
    """Raw {name: {rc, stdout, stderr}} -> {name: parsed value}."""
    out = {}
    for f in _select(names, extra):
        r = raw.get(f.name)
        if r is None:
            out[f.name] = {"error": "not gathered"}
        elif r.get("rc") == 124 and "timed out" in r.get("stderr", ""):
            out[f.name] = {"error": f"timed out after {f.timeout:g} s: {f.command[:80]}"}
        else:
            out[f.name] = f.parse(r.get("stdout", ""), int(r.get("rc", 0)))
    return link_gpu_indexes(out)


def link_gpu_indexes(facts: dict) -> dict:
    """GPU health and Xid events name GPUs by PCI bus id; the `gpus` fact (nvidia-smi's
    pci.bus_id) gives their indexes, filled in here where both were gathered."""
    gpus = (facts.get("gpus") or {}).get("gpus") if isinstance(facts.get("gpus"), dict) else None
    if gpus:
        if isinstance(facts.get("gpu_health"), dict):
            smi_q.with_gpu_index(facts["gpu_health"], gpus)
        if isinstance(facts.get("gpu_xid"), dict):
            xid.with_gpu_index(facts["gpu_xid"], gpus)
    return facts


def gather(host_runner, names=None, *, extra=(), python: str = "python3") -> dict:
    """All (or the named) facts of one host in one `host_runner.run` call."""
    items = command_list(names, extra, python)
    timeout = max((i["timeout"] for i in items), default=0) + SLACK_S
    try:
        raw = agents.run(
            host_runner, "gather", "gather", timeout, what="fact gathering", interpreter=python, commands=items
        )
    except agents.AgentFailed as exc:
        raise GatherError(str(exc)) from None
    return parse_results(raw, names, extra)
