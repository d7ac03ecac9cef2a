"""Known-good baselines: a git repository on the control node (GitPython) of
tagged snapshots of what ran on the hosts, and rollback to them.

    from k26ops import baselines
    repo = baselines.snapshot.open_repo("k26-baseline-working")      # refusals before any host
    baselines.snapshot.snapshot(repo, hosts, options, "k26-baseline-working", "before the probe")  # -> dict
    with baselines.rollback.prepared(repo, tag, names) as work: ...  # a rollout's work (k26ops.cli runs it)
    baselines.Baselines(path).tags()                                 # [TagInfo]
    baselines.drift.host_drift(session, ...)                         # for `k26ops status`
    baselines.pins.delete(hosts, options, ["old-tag"])  # drop tags, unpin what no tag needs (pins.repin)

They take hosts, fleet options and a `log` callback (never the CLI's settings)
and return results; k26ops.cli prints them.

See repo.py for the repository layout, snapshot.py and rollback.py for what
is recorded and restored. Repository: --baselines DIR, else $K26OPS_BASELINES,
else the config file's `baselines`, else ~/.local/share/k26ops/baselines
(k26ops.config); created by the first snapshot.
"""

from k26ops.baselines import drift, pins, rollback, snapshot  # noqa: F401
from k26ops.baselines.repo import Baselines, TagInfo, check_tag_name, default_dir  # noqa: F401
