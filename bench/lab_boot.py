"""Case 6, the lab itself: `k26ops lab up` until every host answers ssh, then
`k26ops lab down`, for 1, 3 and 8 hosts; and what a booted host costs on disk.

Hosts boot on an overlay of the shared rootfs (k26ops/lab/machines.py,
overlay_boot), so neither time nor disk should grow with the rootfs size.
Before that design, `nspawn --ephemeral` copied the 760 MB rootfs per host.

    python bench/lab_boot.py [--reps 5]
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import common


def _du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def main() -> int:
    reps = common.reps_arg(5)
    common.k26ops("lab", "--help")  # warm the interpreter's caches once
    results, rows = {}, []
    for count in (1, 3, 8):
        ups, downs, disk = [], [], []
        for _ in range(reps):
            d = Path(tempfile.mkdtemp(prefix="k26ops-bench-boot-", dir="/var/tmp"))
            port = common.free_port_block(count, 41000, 44000)
            try:
                proc, up = common.k26ops("lab", "up", "--hosts", str(count), "--dir", str(d), "--base-port", str(port))
                if proc.returncode != 0:
                    raise RuntimeError(f"lab up failed: {proc.stderr[-800:]}")
                disk.append(_du_bytes(d) / count)
            finally:
                proc, down = common.k26ops("lab", "down", "--dir", str(d))
                shutil.rmtree(d, ignore_errors=True)
            ups.append(up)
            downs.append(down)
        results[count] = {
            "up": common.stats(ups),
            "down": common.stats(downs),
            "disk_per_host_bytes": common.stats(disk),
        }
        rows.append(
            (
                f"{count} host(s)",
                common.fmt(results[count]["up"]),
                common.fmt(results[count]["down"]),
                f"{results[count]['disk_per_host_bytes']['median'] / 1e6:.2f} MB",
            )
        )
    common.table(
        f"lab up (all hosts answer ssh) / down, {reps} reps",
        rows,
        ("hosts", "up median (min-max)", "down median (min-max)", "lab dir per host"),
    )
    ratio = results[8]["up"]["median"] / results[1]["up"]["median"]
    print(f"\nup 8 hosts / 1 host: {ratio:.2f}")
    common.write_result("lab_boot", {"reps": reps, "cases": results, "ratio_up_8_over_1": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
