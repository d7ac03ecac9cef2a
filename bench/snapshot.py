"""Case 5, snapshot time for one host's baseline: `k26ops snapshot --tag`.

Boots a 1-host lab, deploys it, then REPS times records a baseline of the
healthy host into a baselines repository of its own (a new tag each time):
process wall time, the snapshot's own elapsed_s, remote commands. If this
k26ops has no `snapshot` command, says so and records that.

    python bench/snapshot.py [--reps 5]
"""

from __future__ import annotations

import json
import tempfile

import common


def main() -> int:
    reps = common.reps_arg(5)
    proc, _ = common.k26ops("snapshot", "--help")
    if proc.returncode != 0:
        print("k26ops has no `snapshot` command here: nothing to measure")
        common.write_result("snapshot", {"available": False, "reason": (proc.stderr or proc.stdout).strip()[-300:]})
        return 0
    runs = []
    with common.lab(1, "snapshot") as b:
        host = b.names[0]
        common.first_deploy(b)
        repo = tempfile.mkdtemp(prefix="baselines-", dir=str(b.dir))
        env = {"K26OPS_BASELINES": repo}
        for i in range(reps + 1):  # the first one is a warm-up (creates the repository)
            proc, wall = common.k26ops(
                "--json", "-i", str(b.inventory), "snapshot", "--tag", f"bench-{i}", "-m", "bench", env=env
            )
            if proc.returncode != 0:
                raise RuntimeError(f"snapshot failed (rc {proc.returncode}): {proc.stdout[-800:]} {proc.stderr[-800:]}")
            data = json.loads(proc.stdout)
            r = data["hosts"][host]
            rec = {
                "wall": wall,
                "elapsed_s": data.get("elapsed_s"),
                "commands": r.get("commands"),
                "host_elapsed": r.get("elapsed"),
                "status": r.get("status"),
            }
            print(
                f"  {'warm-up' if i == 0 else f'rep {i}'}: wall {wall:.2f}s, snapshot {rec['elapsed_s']:.2f}s, "
                f"host {rec['host_elapsed']}s, {rec['commands']} remote commands"
            )
            if i:
                runs.append(rec)
    out = {
        "available": True,
        "reps": reps,
        "wall": common.stats([r["wall"] for r in runs]),
        "elapsed_s": common.stats([r["elapsed_s"] for r in runs]),
        "host_elapsed": common.stats([r["host_elapsed"] for r in runs]),
        "commands": sorted({r["commands"] for r in runs}),
        "runs": runs,
    }
    common.table(
        f"snapshot of one host, {reps} reps",
        [
            ("process wall", common.fmt(out["wall"])),
            ("snapshot elapsed_s", common.fmt(out["elapsed_s"])),
            ("host in-run", common.fmt(out["host_elapsed"])),
            ("remote commands", ",".join(map(str, out["commands"]))),
        ],
        ("what", "median (min-max)"),
    )
    common.write_result("snapshot", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
