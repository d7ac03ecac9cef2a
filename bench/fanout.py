"""Case 1, fan-out: converged `k26ops deploy` on 1 host vs 8 hosts of one lab.

Boots an 8-host lab, deploys it once from scratch, then alternates converged
deploys with `--limit lab1` and over all 8 hosts (same lab, same load), REPS
times each. Reports the process wall time (python start to exit, what a user
waits for), the slowest host's in-run elapsed time, remote commands per host,
and the ratio of medians 8 hosts / 1 host (target <= 1.5).

    python bench/fanout.py [--reps 5]
"""

from __future__ import annotations

import os
import time

import common

HOSTS = 8


def busy_seconds() -> float:
    """Machine-wide non-idle CPU seconds so far (/proc/stat): the lab hosts'
    sshd, shells and python agents run on this machine's cores too."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_one(inv, limit=None, forks=None):
    extra = (("--limit", limit) if limit else ()) + (("--forks", str(forks)) if forks else ())
    b0 = busy_seconds()
    rc, data, wall = common.deploy_json(inv, *extra)
    machine_cpu = busy_seconds() - b0
    hosts = data["hosts"]
    bad = {h: (r["status"], r["error"]) for h, r in hosts.items() if r["status"] != "ok"}
    if rc != 0 or bad:
        raise RuntimeError(f"converged deploy was not ok: {bad}")
    changed = [h for h, r in hosts.items() if any(s["changed"] for s in r["steps"])]
    if changed:
        raise RuntimeError(f"converged deploy changed something on {changed}")
    return {
        "wall": wall,
        "cpu": data["_cpu"],
        "machine_cpu": machine_cpu,
        "max_host_elapsed": max(r["elapsed"] for r in hosts.values()),
        "commands": sorted({r["commands"] for r in hosts.values()}),
        "hosts": len(hosts),
    }


def main() -> int:
    reps = common.reps_arg(5)
    runs = {"1": [], str(HOSTS): [], f"{HOSTS} serial": []}
    with common.lab(HOSTS, "fanout") as b:
        t0 = time.monotonic()
        common.first_deploy(b)
        print(f"first deploy of {HOSTS} hosts: {time.monotonic() - t0:.0f}s")
        run_one(b.inventory)  # warm-up (page cache, pyc), not counted
        for i in range(reps):
            for key, limit, forks in (("1", "lab1", None), (str(HOSTS), None, None), (f"{HOSTS} serial", None, 1)):
                r = run_one(b.inventory, limit, forks)
                runs[key].append(r)
                print(
                    f"  rep {i + 1}: {key} host(s): wall {r['wall']:.2f}s, slowest host "
                    f"{r['max_host_elapsed']:.2f}s, k26ops CPU {r['cpu']:.2f}s, machine CPU {r['machine_cpu']:.2f}s, commands/host {r['commands']}"
                )
    out = {"reps": reps, "hosts": HOSTS, "cases": {}}
    rows = []
    for key, rs in runs.items():
        s = {
            "wall": common.stats([r["wall"] for r in rs]),
            "cpu": common.stats([r["cpu"] for r in rs]),
            "machine_cpu": common.stats([r["machine_cpu"] for r in rs]),
            "max_host_elapsed": common.stats([r["max_host_elapsed"] for r in rs]),
            "commands_per_host": sorted({c for r in rs for c in r["commands"]}),
        }
        out["cases"][key] = s
        rows.append(
            (
                f"{key} hosts" if key != "1" else "1 host",
                common.fmt(s["wall"]),
                common.fmt(s["max_host_elapsed"]),
                common.fmt(s["cpu"]),
                common.fmt(s["machine_cpu"]),
                ",".join(map(str, s["commands_per_host"])),
            )
        )
    one, many, serial = out["cases"]["1"], out["cases"][str(HOSTS)], out["cases"][f"{HOSTS} serial"]
    out["ratio_serial_over_parallel"] = serial["wall"]["median"] / many["wall"]["median"]
    out["ratio_wall"] = many["wall"]["median"] / one["wall"]["median"]
    out["ratio_host_elapsed"] = many["max_host_elapsed"]["median"] / one["max_host_elapsed"]["median"]
    out["target"] = "ratio_wall <= 1.5"
    out["met"] = out["ratio_wall"] <= 1.5
    common.table(
        f"fan-out: converged deploy, {reps} reps",
        rows,
        ("hosts", "wall median (min-max)", "slowest host in-run", "k26ops CPU", "machine CPU", "commands/host"),
    )
    print(
        f"  ratio {HOSTS}/1 (wall): {out['ratio_wall']:.2f}  (target <= 1.5: "
        f"{'met' if out['met'] else 'MISSED'}); in-run: {out['ratio_host_elapsed']:.2f}; "
        f"serial (--forks 1) / parallel: {out['ratio_serial_over_parallel']:.2f}"
    )
    common.write_result("fanout", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
