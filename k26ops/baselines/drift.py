"""Drift: does what runs on a host equal a tagged baseline (which), or how does
it differ? The seeds' "is the deployed worker canonical?" as one remote call:
the current release's patched files hashed against its own manifest, and the
release, files, unit and env file (secrets masked) compared with every tag.
"""

from __future__ import annotations

from k26ops.baselines import hostscript
from k26ops.baselines.repo import Baselines
from k26ops.baselines.snapshot import sha256
from k26ops.baselines.validate import BaselineCorrupt
from k26ops.engine import secret_policy


def load_index(baselines_dir=None, warn=lambda line: None) -> list[tuple[str, dict]]:
    """[(tag, {host: record})], newest first; empty without a repository. A tag
    or record that does not read (validate.BaselineCorrupt) is left out and
    `warn`ed in one line: drift is advisory, the other tags still count."""
    repo = Baselines(baselines_dir)
    if not repo.exists():
        return []
    out = []
    for t in reversed(repo.tags()):
        if t.error:
            warn(f"{t.error}: tag left out of the comparison")
            continue
        recs = {}
        for h in t.index.get("hosts") or {}:
            try:
                rec = repo.host_record(t.commit, h)
            except BaselineCorrupt as exc:
                warn(f"{exc}: left out of the comparison")
                continue
            if rec:
                recs[h] = rec
        out.append((t.name, recs))
    return out


def tag_file(state_dir: str) -> str:
    """Where a rollback records the tag it brought the host to."""
    return f"{state_dir}/baseline-tag"


def host_drift(
    session,
    releases_root: str,
    unit_path: str,
    env_path: str,
    index: list,
    state_dir: str | None = None,
    verify: str = "cheap",
) -> dict:
    """The first (newest) tag whose record matches what runs; the tag a rollback
    recorded on the host first, when it matches too (several tags may hold the same content).
    `verify`: the release's files against their wheels' RECORD by size and mtime ("cheap"),
    or every byte ("full": `status --verify`)."""
    p = hostscript.call(
        session,
        "probe",
        1800 if verify == "full" else 300,
        releases_root=releases_root,
        release=None,
        verify=verify,
        unit_path=unit_path,
        env_path=env_path,
        tag_file=tag_file(state_dir) if state_dir else None,
    )
    recorded = p.get("recorded_tag")
    index = sorted(index, key=lambda item: item[0] != recorded)  # stable: newest first otherwise
    r = p["release"]
    m = r.get("manifest") or {}
    changed = sorted(k for k, h in (m.get("patched_files") or {}).items() if r["hashes"].get(k) != h)
    changed = sorted(set(changed) | set(r.get("probe_files") or []))  # a probe left applied is drift too
    record_bad = [f"{b['path']} ({b['why']})" for b in r.get("record_bad") or []]  # vs the wheels' RECORD
    changed += [x for x in record_bad if x.split(" (")[0] not in changed]
    unit_sha = sha256(p.get("unit"))
    env_sha = sha256(secret_policy.env_for_baseline(p["env"])) if p.get("env") is not None else None
    out = {
        "release": r["current"],
        "canonical": bool(m) and not changed,
        "drifted_files": changed,
        "probe_left": bool(r.get("probe_files")),
        "record_bad": len(record_bad),
        "baseline": None,
        "differs_from": None,
        "engine": m.get("engine"),
    }
    name = session.host.name
    for tag, recs in index:
        rec = recs.get(name)
        if not rec or rec.get("release_id") != r["current"]:
            continue
        diff = []
        bad = sorted(k for k, h in rec["patched_files"].items() if r["hashes"].get(k) != h)
        if bad or record_bad:
            bad += record_bad
            diff.append(f"{len(bad)} file(s): {', '.join(bad[:3])}")
        if rec["unit"].get("sha256") != unit_sha:
            diff.append("unit")
        if rec["env"].get("sha256_redacted") != env_sha:
            diff.append("env file")
        if not diff:
            out["baseline"] = tag
            break
        if out["differs_from"] is None:
            out["differs_from"] = {"tag": tag, "what": diff}
    return out


def with_engine(d: dict, engine_releases: list | None) -> dict:
    """`d` with the release(s) the running engine was started from (None: unknown,
    e.g. not running). An engine not from `current` (current switched, engine not
    restarted: the half-changed host of issue 35.4) is neither canonical nor any baseline."""
    if not engine_releases or d.get("error"):
        return d
    d["engine_release"] = engine_releases[0] if len(engine_releases) == 1 else engine_releases
    if (d.get("release") or "").rsplit("/", 1)[-1] not in engine_releases:
        d.update(canonical=False, baseline=None, engine_not_current=True)
    return d


def describe(d: dict) -> str:
    """One short cell for `k26ops status`."""
    if d.get("error"):
        return f"? {d['error']}"
    if d.get("engine_not_current"):
        runs = d["engine_release"] if isinstance(d["engine_release"], str) else ", ".join(d["engine_release"])
        return f"ENGINE NOT FROM current: it runs {runs} (restart it, or deploy/roll back again)"
    if d["drifted_files"]:
        why = "a probe (diagnose cuda-graph, rehearse --probe) is still applied; " if d.get("probe_left") else ""
        what = "the release manifest" + (" and their wheels' RECORD" if d.get("record_bad") else "")
        return f"DRIFT: {why}{len(d['drifted_files'])} file(s) differ from {what}: " + ", ".join(d["drifted_files"][:3])
    if d["baseline"]:
        return f"= {d['baseline']}"
    if d["differs_from"]:
        return f"differs from {d['differs_from']['tag']}: {', '.join(d['differs_from']['what'])}"
    return "canonical, no baseline" if d["canonical"] else "no release manifest"
