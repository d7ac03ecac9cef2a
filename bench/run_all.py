"""Run every benchmark, one after another (each boots and stops its own lab),
then print one summary from their results (bench/results/*-latest.json).

    python bench/run_all.py [--reps N] [--only fanout,converged,crash,wheelhouse,snapshot,lab_boot,rolling_reboot,host_cpu,release_install]
    python bench/run_all.py --summary      # only print the summary of the last results
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import common

SCRIPTS = {
    "fanout": "fanout.py",
    "converged": "converged.py",
    "crash": "crash.py",
    "wheelhouse": "wheelhouse_bytes.py",
    "snapshot": "snapshot.py",
    "lab_boot": "lab_boot.py",
    "rolling_reboot": "rolling_reboot.py",
    "host_cpu": "host_cpu.py",
    "release_install": "release_install.py",
}
# the real 0.5.23 wheels (4.1 GB, see release_install.py): the case runs only where they were downloaded
WHEELS = Path("/var/tmp/k26-real-wheels")


def latest(name: str) -> dict | None:
    p = common.RESULTS / f"{name}-latest.json"
    return json.loads(p.read_text()) if p.exists() else None


def summary() -> dict:
    rows = []
    f = latest("fanout")
    if f:
        c = f["cases"]
        rows.append(
            (
                "1 fan-out 1 vs 8 hosts",
                f"{c['1']['wall']['median']:.2f}s vs {c['8']['wall']['median']:.2f}s",
                f"ratio {f['ratio_wall']:.2f}",
                "<= 1.5",
                "met" if f["met"] else "MISSED",
            )
        )
    c = latest("converged")
    if c:
        a = c["ansible"]["default"]
        rows.append(
            (
                "2 converged 1 host",
                f"k26ops {c['k26ops']['wall']['median']:.2f}s / "
                f"{','.join(map(str, c['k26ops']['commands']))} cmds; ansible {a['wall']['median']:.2f}s / "
                f"{a['ssh_exec']['exec_lines']} execs",
                f"{a['ratio_vs_k26ops']:.1f}x (pipelining {c['ansible']['pipelining']['ratio_vs_k26ops']:.1f}x)"
                if "pipelining" in c["ansible"]
                else f"{a['ratio_vs_k26ops']:.1f}x",
                ">= 10x (issue 31)",
                "met" if a["ratio_vs_k26ops"] >= 10 else "MISSED",
            )
        )
    k = latest("crash")
    if k:
        worst = max(v["detect_s"]["max"] for v in k["cases"].values())
        med = ", ".join(f"{v['detect_s']['median']:.2f}s" for v in k["cases"].values())
        rows.append(
            ("3 crash detection", f"median {med}", f"max {worst:.2f}s", "<= 3 s", "met" if k["met"] else "MISSED")
        )
    w = latest("wheelhouse")
    if w:
        c1, c4 = w["cases"]["1"]["bytes"]["median"], w["cases"]["4"]["bytes"]["median"]
        rows.append(
            (
                "4 wheelhouse 1 vs 4 hosts",
                f"{c1 / 1e6:.1f} MB vs {c4 / 1e6:.1f} MB",
                f"ratio {w['ratio_bytes']:.2f}",
                "== 1",
                "met" if w["met"] else "MISSED",
            )
        )
    s = latest("snapshot")
    if s:
        if s.get("available"):
            rows.append(
                (
                    "5 snapshot 1 host",
                    f"{s['wall']['median']:.2f}s wall",
                    f"{','.join(map(str, s['commands']))} cmds",
                    "-",
                    "-",
                )
            )
        else:
            rows.append(("5 snapshot 1 host", "no `k26ops snapshot`", "-", "-", "-"))
    b = latest("lab_boot")
    if b:
        up = {n: c["up"]["median"] for n, c in b["cases"].items()}
        rows.append(
            (
                "6 lab up 1/3/8 hosts",
                " / ".join(f"{v:.2f}s" for v in up.values()),
                f"ratio 8/1 {b['ratio_up_8_over_1']:.2f}",
                "-",
                "-",
            )
        )
    r = latest("rolling_reboot")
    if r:
        walls = [c["wall"]["median"] for c in r["cases"].values()]
        rows.append(("7 rolling reboot 3 hosts", " / ".join(f"{v:.1f}s" for v in walls), "batch 1 / batch 2", "-", "-"))
    h = latest("host_cpu")
    if h:
        # k26ops' own share: the host's CPU less the lab's stand-ins (nvidia-smi, engine): see host_cpu.py
        own = h.get("k26ops_s", h["net_s"])["median"]
        rows.append(
            (
                "8 host cost, converged deploy",
                f"host CPU {h['net_s']['median']:.3f}s, k26ops' own {own:.3f}s",
                f"{','.join(map(str, h['commands']))} cmds, {','.join(map(str, h['agent_starts']))} agent starts",
                "<= 0.15 s, <= 2 cmds, 1 agent",
                "met" if own <= 0.15 and max(h["commands"]) <= 2 and max(h["agent_starts"]) <= 1 else "MISSED",
            )
        )
    i = latest("release_install")
    if i and i.get("ratio_first") is not None:
        rows.append(
            (
                "9 release install, real 0.5.23 lock",
                f"uv {i['uv']['first']['median']:.1f}s vs pip {i['pip']['first']['median']:.1f}s",
                f"ratio {i['ratio_first']:.2f}",
                "<= 0.25",
                "met" if i["ratio_first"] <= 0.25 else "MISSED",
            )
        )
    common.table("summary (medians)", rows, ("case", "measured", "result", "target", ""))
    return {"rows": rows}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int)
    p.add_argument("--only", help="comma-separated: " + ",".join(SCRIPTS))
    p.add_argument("--summary", action="store_true")
    a = p.parse_args()
    failed = []
    if not a.summary:
        names = a.only.split(",") if a.only else list(SCRIPTS)
        for name in names:
            cmd = [sys.executable, str(common.REPO / "bench" / SCRIPTS[name])]
            if name == "release_install":
                if not WHEELS.is_dir():
                    print(f"\n=== {name}: skipped, no wheels in {WHEELS} (see bench/release_install.py)")
                    continue
                cmd += ["--wheels", str(WHEELS), "--first-only"]
            if a.reps:
                cmd += ["--reps", str(a.reps)]
            print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
            t0 = time.monotonic()
            rc = subprocess.call(cmd, cwd=common.REPO)
            print(f"=== {name}: rc {rc} in {time.monotonic() - t0:.0f}s", flush=True)
            if rc:
                failed.append(name)
    summary()
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
