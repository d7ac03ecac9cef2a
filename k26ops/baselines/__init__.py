"""Known-good baselines: a git repository on the control node (GitPython) of
tagged snapshots of what ran on the hosts, and rollback to them.

    from k26ops import baselines
    baselines.snapshot(settings, "k26-baseline-working", "before the probe")  # -> dict
    baselines.rollback(settings, "k26-baseline-working")                    # per-host results
    baselines.Baselines(path).tags()                                        # [TagInfo]
    baselines.drift.host_drift(session, ...)                                # for `k26ops status`
    baselines.pins.delete(settings, ["old-tag"])  # drop tags, unpin what no tag needs (pins.repin)

See repo.py for the repository layout, snapshot.py and rollback.py for what
is recorded and restored. Repository: --baselines DIR, else $K26OPS_BASELINES,
else the config file's `baselines`, else ~/.local/share/k26ops/baselines
(k26ops.config); created by the first snapshot.
"""

from k26ops.baselines.repo import Baselines, TagInfo, check_tag_name, default_dir  # noqa: F401
from k26ops.baselines.snapshot import snapshot  # noqa: F401
from k26ops.baselines.rollback import run as rollback  # noqa: F401
from k26ops.baselines import drift, pins  # noqa: F401
