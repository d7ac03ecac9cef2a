"""One host's side of the weights: what a host has (the fast check), its full sha256
verify, and the one-shard fetch, each one call of the `weights` agent (or one fact).

`wanted(host_vars)` is the one place that says which manifest a host's model must match,
where the model is, and where the host keeps its verify record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from k26ops import facts as facts_mod
from k26ops.engine.profile import DEFAULT_MODEL_PATH, profile_for, recipe_for
from k26ops.errors import StepFailed, UserError
from k26ops.facts.model_files import model_files_fact
from k26ops.layout import Layout
from k26ops.transport import agents
from k26ops.weights import manifest as mf

VERIFY_TIMEOUT = 6 * 3600.0  # a full verify of 590 GB on a slow disk
FETCH_TIMEOUT = 12 * 3600.0
READ_SAMPLE = 4 << 30  # the plain-read rate is measured on up to this many bytes


@dataclass(frozen=True)
class Wanted:
    manifest_path: Path
    model_path: str
    record: str
    source: str | None
    name: str


def wanted(host_vars: dict, manifest: str | Path | None = None) -> Wanted:
    """The recipe's model (or `manifest`, given on the command line) for this host."""
    r = recipe_for(host_vars)
    prof = profile_for(host_vars, r)
    model_path = str(prof.get("model_path") or host_vars.get("model_path") or DEFAULT_MODEL_PATH)
    if manifest is None and r.model is None:
        raise UserError(
            f"{r.source}: the recipe names no model manifest (model: {{name, manifest}}); "
            "make one with `k26ops model manifest` or pass --manifest"
        )
    path = Path(manifest) if manifest is not None else r.model.manifest
    record = mf.record_path(Layout.of(host_vars).state_dir, model_path)
    return Wanted(path, model_path, record, r.model.source if r.model else None, r.model.name if r.model else path.stem)


def fast(session, w: Wanted, m: mf.Manifest) -> dict:
    """Sizes and the file set, no byte read (one fact): compare's answer plus the record."""
    fact = facts_mod.gather(session, [], extra=[model_files_fact(w.model_path, w.record)])["model_files"]
    if fact.get("error"):
        return {
            "problems": [f"{w.model_path} {fact['error']}"],
            "ignored": [],
            "changed": [],
            "verified": 0,
            "record": None,
        }
    return {**mf.compare(m, fact["files"], fact.get("record")), "record": fact.get("record")}


def full(session, w: Wanted, m: mf.Manifest, force: bool = False, workers: int | None = None) -> dict:
    """sha256 of every file the record does not vouch for (all with `force`), on the host's cores."""
    res = agents.run(
        session,
        "weights",
        "verify",
        VERIFY_TIMEOUT,
        what="model verify",
        tied=True,
        path=w.model_path,
        entries=[[e.path, e.size, e.sha256] for e in m.entries],
        record=w.record,
        manifest=m.sha256,
        force=force,
        workers=workers,
        read_sample=READ_SAMPLE,
    )
    res["verify_gbps"] = _gbps(res["hashed_bytes"], res["hash_s"])
    res["read_gbps"] = _gbps(res["read_bytes"], res["read_s"])
    return res


def _gbps(n: int, s: float) -> float | None:
    return round(n / s / 1e9, 3) if n and s > 0 else None


def prepare(session, w: Wanted, m: mf.Manifest) -> dict:
    return agents.run(
        session,
        "weights",
        "prepare",
        300,
        what="model sync (prepare)",
        path=w.model_path,
        entries=[[e.path, e.size, e.sha256] for e in m.entries],
        record=w.record,
    )


def fetch(
    session, w: Wanted, e: mf.Entry, source: dict, key: str | None, bwlimit_kbps: int = 0, token: str | None = None
) -> dict:
    res = agents.run(
        session,
        "weights",
        "fetch",
        FETCH_TIMEOUT,
        what="model sync (fetch)",
        tied=True,
        path=w.model_path,
        rel=e.path,
        size=e.size,
        sha256=e.sha256,
        record=w.record,
        source=source,
        key=key,
        known_hosts=(os.path.dirname(key) + "/known_hosts") if key else None,
        bwlimit_kbps=bwlimit_kbps,
        token=token,
    )
    if not res.get("ok"):
        raise StepFailed(res.get("why") or "the fetch failed")
    return res


def sync_dir(host_vars: dict) -> str:
    """Where a host keeps this run's SSH key for fetching from peers (removed after the run)."""
    return f"{Layout.of(host_vars).state_dir}/model-sync"
