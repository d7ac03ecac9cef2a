"""Bench results stored in a baseline (`snapshot --bench`: hosts/<host>/bench.json)."""

from __future__ import annotations

from k26ops.errors import UserError


def stored_benches(baselines_dir, tag: str) -> dict[str, dict]:
    """{host: bench} the tag stored (`snapshot --bench`); exit 2 for an unknown tag."""
    # lazy: the baselines package (about 60 ms) only for --compare and --gate
    from k26ops.baselines import Baselines

    repo = Baselines(baselines_dir)
    if not repo.exists():
        raise UserError(f"unknown baseline tag {tag!r}: no baselines repository at {repo.path}")
    t = repo.tag(tag)
    out = {}
    for h in (t.index or {}).get("hosts") or {}:
        b = repo.host_bench(t.commit, h)
        if b:
            out[h] = b
    return out


def baseline_for(stored: dict[str, dict], host: str) -> tuple[str, dict] | None:
    """The host's own stored bench, else the first stored one (same hardware assumed; said in the output)."""
    if host in stored:
        return host, stored[host]
    return next(iter(stored.items()), None)
