"""Case 7, fleet scale: `facts`, `check` and a converged `deploy` at 1, 8, 32
and 64 hosts; what each costs the control node per host.

Boots ONE lab of the largest size (64 hosts by default) and measures smaller
fleets with `--limit lab1,...,labN` (the other hosts sit idle: booted systemd
and sshd, no work). For `deploy`, the first N hosts are deployed from scratch
once (not measured), then a warm-up converged deploy, then REPS converged
deploys. Per run:

- wall: the k26ops process, start to exit;
- control CPU: user + system seconds of that k26ops process alone
  (os.wait4's rusage of the child, the same as resource.getrusage(CHILDREN)
  for one child);
- peak memory: the k26ops process's max RSS;
- hosts' CPU: CPU seconds the lab's hosts themselves used during the run
  (their sshd, shells, python: each host is in a cgroup of its own, whose
  cgroup-v2 cpu.stat usage_usec is read before and after), all hosts of the
  lab summed;
- machine CPU: non-idle CPU seconds of the whole machine over the run
  (/proc/stat): control + hosts + whatever else this shared machine ran;
- remote commands per host: k26ops counts every SSH exec channel per host
  (`commands` in --json; SFTP uploads are not exec channels).

The per-host marginal cost is the least-squares slope over the host counts.
A plot (bench/scale.png) is written when matplotlib is installed (the
`bench` extra); without it the numbers are still printed.

    python bench/scale.py [--reps 3] [--sizes 1,8,32,64] [--deploy-sizes 1,8,32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

PLOT = common.REPO / "bench" / "scale.png"


def busy_seconds() -> float:
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


HOST_CGROUPS: list[Path] = []  # the lab hosts' own cgroups (k26ops.lab.machines.own_cgroups)


def hosts_cpu_seconds() -> float | None:
    total, seen = 0, False
    for cg in HOST_CGROUPS:
        try:
            for line in (cg / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    total += int(line.split()[1])
                    seen = True
        except OSError:
            continue
    return total / 1e6 if seen else None


def run(*args: str, timeout: float = 1800) -> dict:
    """The real CLI in a child of its own; wall, CPU and max RSS of that child only."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        h0, b0, t0 = hosts_cpu_seconds(), busy_seconds(), time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "k26ops", *args], stdout=out, stderr=err, cwd=common.REPO, env=common.installed_env()
        )
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall, machine, h1 = time.perf_counter() - t0, busy_seconds() - b0, hosts_cpu_seconds()
        out.seek(0), err.seek(0)
        text, errtext = out.read().decode(), err.read().decode()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise RuntimeError(
            f"k26ops {' '.join(args[:6])} printed no JSON (rc {proc.returncode}): {text[-300:]!r} {errtext[-800:]!r}"
        ) from None
    hosts = data["hosts"] if isinstance(data.get("hosts"), dict) else {h["host"]: h for h in data["hosts"]}
    return {
        "rc": proc.returncode,
        "wall": wall,
        "cpu": ru.ru_utime + ru.ru_stime,
        "maxrss_mb": ru.ru_maxrss / 1024,
        "machine_cpu": machine,
        "hosts_cpu": (h1 - h0) if h0 is not None and h1 is not None else float("nan"),
        "hosts": hosts,
    }


def limit(n: int) -> str:
    return ",".join(f"lab{i}" for i in range(1, n + 1))


def measure(inv: Path, command: str, n: int, reps: int) -> dict:
    runs = []
    for _ in range(reps):
        r = run("--json", "-i", str(inv), "--limit", limit(n), command)
        bad = {
            h: (x.get("status"), x.get("error"))
            for h, x in r["hosts"].items()
            if x.get("status") not in ("ok", "changed")
        }
        if len(r["hosts"]) != n or bad:
            raise RuntimeError(f"{command} on {n} hosts: {len(r['hosts'])} results, not ok: {bad}")
        r["changed"] = {}
        if command == "deploy":  # kept (and said): under load a host's engine may need a restart
            r["changed"] = {
                h: [c for st in x["steps"] for c in st["changes"]]
                for h, x in r["hosts"].items()
                if any(st["changed"] for st in x["steps"])
            }
            if r["changed"]:
                print(f"    not converged on {len(r['changed'])} host(s): {r['changed']}", flush=True)
        r["commands"] = sorted({x["commands"] for x in r["hosts"].values()})
        del r["hosts"]
        runs.append(r)
    out = {k: common.stats([r[k] for r in runs]) for k in ("wall", "cpu", "maxrss_mb", "machine_cpu", "hosts_cpu")}
    out["commands_per_host"] = sorted({c for r in runs for c in r["commands"]})
    out["changed"] = [r["changed"] for r in runs if r["changed"]]
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope: the marginal cost of one more host."""
    if len(xs) < 2:
        return float("nan")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def plot(results: dict) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install '.[bench]'): no plot, the numbers are above")
        return None
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    panels = (
        ("wall", "wall time (s)"),
        ("cpu", "control-node CPU (s)"),
        ("hosts_cpu", "lab hosts' own CPU (s)"),
        ("maxrss_mb", "control-node peak RSS (MB)"),
    )
    for ax, (key, title) in zip(axes, panels):
        for command, by_n in results.items():
            ns = sorted(int(n) for n in by_n)
            ax.plot(ns, [by_n[str(n)][key]["median"] for n in ns], marker="o", label=command)
        ax.set_xlabel("hosts")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.set_xticks([1, 8, 16, 32, 64])
    axes[0].legend()
    fig.suptitle("k26ops on a lab of nspawn hosts sharing the control node's 2 cores (medians)")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=90)
    print(f"wrote {PLOT.relative_to(common.REPO)}")
    return PLOT


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=int(os.environ.get("K26BENCH_REPS", 3)))
    p.add_argument("--sizes", default="1,8,32,64")
    p.add_argument("--deploy-sizes", default="1,8,32")
    a = p.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    deploy_sizes = [int(x) for x in a.deploy_sizes.split(",") if x]
    results: dict = {"facts": {}, "check": {}, "deploy": {}}
    load = {"start": os.getloadavg()}
    t_boot = time.monotonic()
    with common.lab(max(sizes), "scale") as b:
        from k26ops.lab.machines import own_cgroups

        boot = time.monotonic() - t_boot
        HOST_CGROUPS[:] = [c for n in b.names for c in own_cgroups(b.lab._machine(n)) if (c / "cpu.stat").exists()]
        run("--json", "-i", str(b.inventory), "--limit", "lab1", "facts")  # warm-up: pyc, page cache
        for n in sizes:
            for command in ("facts", "check"):
                s = results[command][str(n)] = measure(b.inventory, command, n, a.reps)
                common.write_result("scale-partial", {"cases": results})
                print(
                    f"  {command} {n:>2} hosts: wall {common.fmt(s['wall'])}, control CPU {common.fmt(s['cpu'])}, "
                    f"peak {s['maxrss_mb']['median']:.0f} MB, commands/host {s['commands_per_host']}",
                    flush=True,
                )
        done = 0
        for n in deploy_sizes:
            t0 = time.monotonic()
            common.first_deploy(b, limit=limit(n))  # only the hosts not deployed yet change
            print(f"  first deploy of lab{done + 1}..lab{n}: {time.monotonic() - t0:.0f}s", flush=True)
            done = n
            run("--json", "-i", str(b.inventory), "--limit", limit(n), "deploy")  # warm-up
            s = results["deploy"][str(n)] = measure(b.inventory, "deploy", n, a.reps)
            common.write_result("scale-partial", {"cases": results})
            print(
                f"  deploy {n:>2} hosts (converged): wall {common.fmt(s['wall'])}, control CPU "
                f"{common.fmt(s['cpu'])}, peak {s['maxrss_mb']['median']:.0f} MB, commands/host "
                f"{s['commands_per_host']}",
                flush=True,
            )
        load["end"] = os.getloadavg()
    rows, marginal = [], {}
    for command, by_n in results.items():
        ns = sorted(int(n) for n in by_n)
        for n in ns:
            s = by_n[str(n)]
            rows.append(
                (
                    command,
                    n,
                    common.fmt(s["wall"], digits=2),
                    f"{s['cpu']['median']:.2f} s",
                    f"{s['cpu']['median'] / n * 1000:.0f} ms",
                    f"{s['hosts_cpu']['median']:.2f} s",
                    f"{s['machine_cpu']['median']:.2f} s",
                    f"{s['maxrss_mb']['median']:.0f} MB",
                    ",".join(map(str, s["commands_per_host"])),
                )
            )
        if len(ns) >= 2:
            marginal[command] = {
                k: slope(ns, [by_n[str(n)][k]["median"] for n in ns]) for k in ("wall", "cpu", "hosts_cpu", "maxrss_mb")
            }
    common.table(
        f"scale: {a.reps} reps each, one lab of {max(sizes)} hosts (booted in {boot:.1f}s)",
        rows,
        (
            "command",
            "hosts",
            "wall median (min-max)",
            "control CPU",
            "CPU/host",
            "hosts' CPU",
            "machine CPU",
            "peak RSS",
            "commands/host",
        ),
    )
    print("\nper-host marginal cost (least-squares slope over the host counts):")
    for command, m in marginal.items():
        print(
            f"  {command}: wall {m['wall'] * 1000:.0f} ms, control CPU {m['cpu'] * 1000:.0f} ms, hosts' CPU "
            f"{m['hosts_cpu'] * 1000:.0f} ms, peak RSS {m['maxrss_mb']:.2f} MB"
        )
    print(f"load average: start {load['start']}, end {load['end']}")
    plot(results)
    common.write_result(
        "scale", {"reps": a.reps, "boot_s": boot, "load": load, "cases": results, "marginal_per_host": marginal}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
