"""Case 9, what a converged deploy costs the host: CPU seconds and python3 starts.

Boots a HOSTS-host lab (default 2), deploys it once, then runs REPS converged
`k26ops --json deploy` (nothing to change). For each run and each host it reads:

- host CPU: the host's own cgroup (`cpu.stat` usage_usec of the lab's
  per-host cgroup, k26ops/lab/machines.own_cgroups): everything the host ran
  for the deploy (sshd, shells, python3 agents, systemctl, the engine's
  answers to health and smoke). The same host's CPU over an idle stretch of
  the same length (no k26ops) is measured right after and reported too, and
  subtracted in the "net" column: the host's own background (journald,
  the engine stand-in's idle loop) is not the deploy's cost.
- python3 starts (k26ops' agents, `python3 -S -c`, counted apart): counted in one
  more deploy after the reps, with a counting wrapper first on PATH
  (/usr/local/bin/python3 logs one line, then execs /usr/bin/python3), removed
  after it. The measured reps run without it (its sh, fork and tr per start are
  the bench's, not k26ops'), and nothing else reaches the host between a rep's
  two CPU reads (the starts log used to be read over ssh inside that window).
- remote commands (SSH exec channels) from the report.
- the lab's stand-ins apart: the nvidia-smi stand-in (k26ops/lab/fixtures/
  nvidia-smi) is a Python script, each call a python3 start; on a GPU host
  nvidia-smi is NVIDIA's binary. Its CPU per call is measured on the same
  host (STANDIN_CALLS calls in one ssh command, less the same command with
  `true` in their place) and times its calls in the deploy is its share. The
  engine stand-in's (the engine unit's cgroup: its answers to health and
  smoke, and its idle loop) is read from its own cgroup. "k26ops" = net less
  both: the figure issue 31 compares with 0.15 s.
- where the rest went: every sub-cgroup of the host (sshd, the session, PID 1,
  journald, the engine unit) with its CPU in the last run.
- with --execs (needs strace on this machine, and root): every program the
  host started for one more converged deploy after the reps, from
  `strace -f -e trace=execve` on the first host's sshd (its PAM session
  scripts too), in order: what a deploy costs, process by process.

    python bench/host_cpu.py [--reps 5] [--hosts 2] [--execs]
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

import common

COUNT_LOG = "/var/tmp/k26ops-bench-python3.log"
WRAPPER = f"""#!/bin/sh
printf '%s %.60s\\n' "${{1:-}}" "$(printf %s "${{2:-}}" | tr '\\n' ' ')" >> {COUNT_LOG}
exec /usr/bin/python3 "$@"
"""


def cpu_stat_path(b, name: str) -> Path:
    from k26ops.lab.machines import own_cgroups

    for cg in own_cgroups(b.lab._machine(name)):
        if (cg / "cpu.stat").exists():
            return cg / "cpu.stat"
    raise SystemExit(
        f"no cpu.stat in the lab host's cgroups ({own_cgroups(b.lab._machine(name))}): "
        "this bench needs the unified cgroup hierarchy"
    )


def usage_s(path: Path) -> float:
    for line in path.read_text().splitlines():
        k, v = line.split()
        if k == "usage_usec":
            return int(v) / 1e6
    raise RuntimeError(f"{path}: no usage_usec")


def cgroup_usage(top: Path) -> dict[str, float]:
    """{sub-cgroup path under the host's cgroup ("." the host): CPU seconds} for every cgroup there now."""
    return {str(p.parent.relative_to(top)): usage_s(p) for p in top.rglob("cpu.stat")}


STANDIN_CALLS = 20


def standin_call_s(b, name: str, stat: Path) -> float:
    """CPU seconds of one nvidia-smi stand-in call on this host: STANDIN_CALLS query calls in one
    ssh command, less the same command with `true` for each call (sshd, the shell), per call."""
    loop = "for i in $(seq {n}); do {cmd} >/dev/null 2>&1; done"
    query = (
        "nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap,uuid,pci.bus_id "
        "--format=csv,noheader,nounits"
    )
    cost = {}
    for what, cmd in (("standin", query), ("true", "true"), ("standin2", query), ("true2", "true")):
        c0 = usage_s(stat)
        b.ssh(name, loop.format(n=STANDIN_CALLS, cmd=cmd))
        cost[what] = usage_s(stat) - c0
    return max(0.0, (cost["standin"] + cost["standin2"] - cost["true"] - cost["true2"]) / (2 * STANDIN_CALLS))


def counted(b) -> dict[str, list[str]]:
    """The python3 starts of one more converged deploy, per host: a counting wrapper put first
    on PATH (/usr/local/bin/python3 logs its first argument and the start of the second, then
    execs /usr/bin/python3), one deploy, the log read, the wrapper removed. Not during the
    measured reps: the wrapper's own sh, fork and tr per start would count as k26ops' CPU."""
    for n in b.names:
        b.ssh(
            n,
            f"printf %s {shlex.quote(WRAPPER)} > /usr/local/bin/python3 && "
            f"chmod 755 /usr/local/bin/python3 && : > {COUNT_LOG}",
        )
    rc, data, _ = common.deploy_json(b.inventory)
    if rc != 0:
        raise RuntimeError(f"the counted deploy failed: {data}")
    out = {n: b.ssh(n, f"cat {COUNT_LOG}").splitlines() for n in b.names}
    for n in b.names:
        b.ssh(n, f"rm -f /usr/local/bin/python3 {COUNT_LOG}")
    return out


def execs(b, name: str, stat: Path) -> list[str]:
    """The programs (path and argv's start) the host's sshd and its children exec'd
    during one converged deploy: strace -f on the sshd listener, successful execve only."""
    import subprocess
    import tempfile

    procs = stat.parent.rglob("ssh.service/cgroup.procs")
    pid = next(p.read_text().split()[0] for p in procs)
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        st = subprocess.Popen(
            ["strace", "-f", "-qq", "-z", "-s", "60", "-e", "trace=execve", "-o", log.name, "-p", pid]
        )
        time.sleep(1.0)  # attached
        rc, data, _ = common.deploy_json(b.inventory)
        time.sleep(0.5)
        st.terminate()
        st.wait()
        if rc != 0:
            raise RuntimeError(f"the traced deploy failed: {data}")
        return [
            line.split(" ", 1)[1].split(", [", 1)[0].replace("execve(", "").strip('"')
            + "  "
            + line.split(", [", 1)[1].split("], ", 1)[0][:100]
            for line in log.read().splitlines()
            if "execve(" in line and ", [" in line
        ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--execs", action="store_true", help="list every program the host starts for one deploy (strace)")
    args = ap.parse_args()
    started_execs: list[str] = []
    runs = []
    with common.lab(args.hosts, "hostcpu") as b:
        common.first_deploy(b)
        stats = {n: cpu_stat_path(b, n) for n in b.names}
        common.deploy_json(b.inventory)  # warm-up (page cache, pyc), not counted
        per_call = {n: standin_call_s(b, n, stats[n]) for n in b.names}
        # The reps run on the host as it is (no counting wrapper: its sh, fork and tr per python3
        # start would be counted as k26ops'); nothing else reaches the host between c0 and c1.
        # Which programs a deploy starts is counted after them, in one more deploy (counted()).
        for i in range(args.reps):
            g0 = {n: cgroup_usage(p.parent) for n, p in stats.items()}
            c0 = {n: usage_s(p) for n, p in stats.items()}
            t0 = time.monotonic()
            rc, data, wall = common.deploy_json(b.inventory)
            took = time.monotonic() - t0
            c1 = {n: usage_s(p) for n, p in stats.items()}
            g1 = {n: cgroup_usage(p.parent) for n, p in stats.items()}
            hosts = data["hosts"]
            bad = {h: (r["status"], r["error"]) for h, r in hosts.items() if r["status"] != "ok"}
            changed = {
                h: [c for s in r.get("steps", []) for c in s["changes"]]
                for h, r in hosts.items()
                if any(s["changed"] for s in r.get("steps", []))
            }
            if rc != 0 or bad or changed:
                raise RuntimeError(f"converged deploy was not ok/unchanged: {bad or changed}")
            i0 = {n: usage_s(p) for n, p in stats.items()}
            time.sleep(took)
            i1 = {n: usage_s(p) for n, p in stats.items()}
            for n in b.names:
                groups = {g: round(v - g0[n][g], 6) for g, v in g1[n].items() if g in g0[n]}
                engine = sum(v for g, v in groups.items() if g.endswith("/" + common.UNIT))
                runs.append(
                    {
                        "host": n,
                        "cpu": c1[n] - c0[n],
                        "idle": i1[n] - i0[n],
                        "engine_s": engine,
                        "net": c1[n] - c0[n] - (i1[n] - i0[n]),
                        "cgroups": groups,
                        "commands": hosts[n]["commands"],
                        "wall": wall,
                    }
                )
            print(
                f"  rep {i + 1}: wall {wall:.2f}s; "
                + "; ".join(
                    f"{r['host']}: CPU {r['cpu']:.3f}s (idle {r['idle']:.3f}s), {r['commands']} commands"
                    for r in runs[-len(b.names) :]
                )
            )
        started = counted(b)
        for r in runs:
            smi = [s for s in started[r["host"]] if s.split(" ")[0].endswith("/nvidia-smi")]
            r.update(
                started=started[r["host"]],
                python3=len(started[r["host"]]),
                agents=sum(s.startswith(("-S -c", "-c ")) for s in started[r["host"]]),
                standin_calls=len(smi),
                standin_s=len(smi) * per_call[r["host"]],
            )
            r["k26ops"] = r.pop("net") - r["standin_s"] - r["engine_s"]
        print(
            "  python3 starts per host (one more deploy, counted): "
            + ", ".join(
                f"{n} x{len(v)} (k26ops agents x{sum(s.startswith(('-S -c', '-c ')) for s in v)})"
                for n, v in started.items()
            )
        )
        if args.execs:
            started_execs = execs(b, b.names[0], stats[b.names[0]])
    if started_execs:
        print(f"programs {b.names[0]} started for one more converged deploy ({len(started_execs)}, in order):")
        for line in started_execs:
            print("   ", line)
    print("python3 starts of the last run on " + runs[-1]["host"] + ":")
    for line in runs[-1]["started"]:
        print("   ", line)
    print(f"CPU by cgroup of the last run on {runs[-1]['host']} (nested: a cgroup's figure includes its children's):")
    for g, v in sorted(runs[-1]["cgroups"].items(), key=lambda kv: -kv[1]):
        if v >= 0.001:
            print(f"    {v:.3f} s  {g}")
    print(
        f"nvidia-smi stand-in: {', '.join(f'{n} {v * 1000:.1f} ms' for n, v in per_call.items())} per call "
        f"({STANDIN_CALLS} calls in one ssh command, less the same with `true`)"
    )
    cpu = common.stats([r["cpu"] for r in runs])
    idle = common.stats([r["idle"] for r in runs])
    net = common.stats([r["cpu"] - r["idle"] for r in runs])
    standin = common.stats([r["standin_s"] for r in runs])
    engine = common.stats([r["engine_s"] for r in runs])
    own = common.stats([r["k26ops"] for r in runs])
    py = sorted({r["python3"] for r in runs})
    agents = sorted({r["agents"] for r in runs})
    cmds = sorted({r["commands"] for r in runs})
    common.table(
        f"host cost of a converged deploy ({args.hosts} hosts x {args.reps} reps)",
        [
            (
                "per host",
                common.fmt(cpu),
                common.fmt(idle),
                common.fmt(net),
                common.fmt(standin),
                common.fmt(engine),
                common.fmt(own),
                ",".join(map(str, agents)),
                ",".join(map(str, py)),
                ",".join(map(str, cmds)),
            )
        ],
        (
            "case",
            "host CPU",
            "idle, same time",
            "net",
            "nvidia-smi stand-in",
            "engine stand-in",
            "k26ops (net less both)",
            "k26ops agents (python3 -S -c)",
            "all python3 starts",
            "ssh commands",
        ),
    )
    print(
        "  all python3 starts = the agents + the lab's nvidia-smi stand-in (a Python script here; NVIDIA's "
        "binary on a GPU host)"
    )
    print(
        "  k26ops = net less the lab's stand-ins: the nvidia-smi stand-in's calls x its CPU per call, and the "
        "engine stand-in's cgroup (its answers to health and smoke); issue 31's target (<= 0.15 s) is this one"
    )
    common.write_result(
        "host_cpu",
        {
            "reps": args.reps,
            "hosts": args.hosts,
            "cpu_s": cpu,
            "idle_s": idle,
            "net_s": net,
            "standin_s": standin,
            "engine_s": engine,
            "k26ops_s": own,
            "standin_call_s": per_call,
            "agent_starts": agents,
            "python3_starts": py,
            "commands": cmds,
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
