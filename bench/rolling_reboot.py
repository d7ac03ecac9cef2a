"""Rolling reboot of a 3-host lab: `k26ops reboot` one host per batch (the
default), and `--canary 1 --batch 2` (two batches). Wall time of the command
and each host's time from `systemctl reboot` to a new boot id over SSH.

A lab host's reboot is a container's: systemd stops and starts again without
firmware or a kernel, so this measures k26ops' own overhead (waiting, polling
every 2 s, re-gathering facts), not what a GPU host's reboot takes.

    python bench/rolling_reboot.py [--reps 3]
"""

from __future__ import annotations

import json
import re

import common


def main() -> int:
    reps = common.reps_arg(3)
    results, rows = {}, []
    with common.lab(3, "reboot") as b:
        env = {"K26OPS_INVENTORY": str(b.inventory), "K26OPS_LAB_DIR": str(b.dir)}
        for case, args in (("batch 1 (3 batches)", ()), ("canary 1, batch 2 (2 batches)", ("--batch", "2"))):
            walls, backs = [], []
            for _ in range(reps):
                proc, wall = common.k26ops("--json", "reboot", "--reboot-timeout", "120", *args, env=env)
                if proc.returncode != 0:
                    raise RuntimeError(f"reboot failed: {proc.stdout[-800:]} {proc.stderr[-400:]}")
                walls.append(wall)
                for h in json.loads(proc.stdout)["hosts"].values():
                    backs.append(float(re.search(r"back in (\d+)s", h["reboot"]).group(1)))
            results[case] = {"wall": common.stats(walls), "host_back_s": common.stats(backs)}
            rows.append((case, common.fmt(results[case]["wall"]), common.fmt(results[case]["host_back_s"])))
    common.table(
        f"k26ops reboot, 3-host lab, {reps} reps", rows, ("case", "wall median (min-max)", "host back after (s)")
    )
    common.write_result("rolling_reboot", {"reps": reps, "cases": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
