"""Case 3, crash detection latency: the engine crashes N seconds into its load.

Boots a 1-host lab and deploys it (a healthy engine to roll back to). Each rep
deploys an inventory whose `engine_env` makes the lab stand-in crash while
loading (K26OPS_STANDIN_CRASH=load, K26OPS_STANDIN_LOAD_SECONDS=L: it dies
40% into the load, i.e. N = 0.4 L seconds after it starts), or on the first
or second /generate (the smoke step's greedy and sampled requests). The env
file changes, so the engine restarts, and health or smoke must notice the crash.

Measured per rep, all on one clock (the lab hosts share the machine's):
  crash   = journal timestamp (journalctl -o short-unix) of the engine's crash
            line (its "Traceback" on stderr; the process exits right after);
  report  = wall time at which k26ops prints the host's `failed: ... crashed`
            progress line (-v, read from its stderr as it comes);
  exit    = k26ops process exit (after the rollback to the previous engine,
            which must come back healthy: that part is not detection).
Latency = report - crash (target <= 3 s).

    python bench/crash.py [--reps 5]
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import common

# (label, engine_env): crashes 1 s and 4 s into the load, then on the first
# request (the greedy smoke request) and on a later one (the sampled smoke request)
CASES = (
    ("load 2.5s (crash ~1s in)", {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_LOAD_SECONDS": "2.5"}),
    ("load 10s (crash ~4s in)", {"K26OPS_STANDIN_CRASH": "load", "K26OPS_STANDIN_LOAD_SECONDS": "10.0"}),
    ("first request (greedy smoke)", {"K26OPS_STANDIN_CRASH": "first-request"}),
    ("request 2 (sampled smoke)", {"K26OPS_STANDIN_CRASH": "request:2"}),
)


def deploy_streaming(inventory) -> tuple[int, dict, list[tuple[float, str]], float, float]:
    cmd = [sys.executable, "-m", "k26ops", "--json", "-v", "-i", str(inventory), "deploy"]
    lines: list[tuple[float, str]] = []
    t_start = time.time()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=common.REPO,
        bufsize=1,
        env={**common.installed_env(), "PYTHONUNBUFFERED": "1"},
    )

    def read_err():
        for line in proc.stderr:
            lines.append((time.time(), line.rstrip("\n")))

    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    out = proc.stdout.read()
    proc.wait(timeout=600)
    t_exit = time.time()
    t.join(timeout=5)
    return proc.returncode, json.loads(out), lines, t_start, t_exit


def crash_time(b: common.BenchLab, host: str, since: float) -> tuple[float | None, float | None]:
    """(first crash line, systemd's 'Main process exited') from the journal, epoch seconds."""
    out = b.ssh(host, f"journalctl -u {common.UNIT} -o short-unix --no-pager --since @{int(since) - 1}")
    crash = exited = None
    for line in out.splitlines():
        parts = line.split(None, 1)
        try:
            ts = float(parts[0])
        except (ValueError, IndexError):
            continue
        if ts < since:
            continue
        text = parts[1] if len(parts) > 1 else ""
        if crash is None and "Traceback (most recent call last)" in text:
            crash = ts
        if exited is None and "Main process exited" in text and crash is not None:
            exited = ts
    return crash, exited


def main() -> int:
    reps = common.reps_arg(5)
    results = {label: [] for label, _env in CASES}
    with common.lab(1, "crash") as b:
        host = b.names[0]
        common.first_deploy(b)
        for n, (label, env) in enumerate(CASES):
            inv = b.write_inventory(f"crash-{n}", **{host: {"engine_env": env}})
            for i in range(reps):
                rc, data, lines, t_start, t_exit = deploy_streaming(inv)
                r = data["hosts"][host]
                if rc == 0 or r["status"] != "failed" or "crashed" not in (r["error"] or ""):
                    raise RuntimeError(f"expected a crash failure, got rc {rc}: {r['status']} {r['error']}")
                crash, exited = crash_time(b, host, t_start)
                reported = next((t for t, l in lines if "failed:" in l and "crashed" in l), None)
                if crash is None or reported is None:
                    raise RuntimeError(f"no crash line ({crash}) or no failure line ({reported}): {lines[-5:]}")
                rec = {
                    "detect_s": reported - crash,
                    "exit_after_crash_s": t_exit - crash,
                    "crash_after_start_s": crash - t_start,
                    "journal_exit_after_crash_s": (exited - crash) if exited else None,
                    "rollback": (r["error"] or "").rsplit("; ", 1)[-1],
                    "signature": (r.get("diagnosis") or {}).get("signature"),
                    "evidence": (r.get("diagnosis") or {}).get("evidence"),
                }
                if not rec["signature"] or rec["signature"] == "unclassified" or not r.get("journal_tail"):
                    raise RuntimeError(f"{label}: the crash was not named: {r['error']}")
                results[label].append(rec)
                print(
                    f"  {label} rep {i + 1}: crash at +{rec['crash_after_start_s']:.2f}s after start, "
                    f"reported {rec['detect_s']:.2f}s later, exit {rec['exit_after_crash_s']:.2f}s later "
                    f"({rec['signature']}; {rec['rollback']})"
                )
            # the rollback must have left the previous engine healthy
            status = b.ssh(host, f"systemctl is-active {common.UNIT}").strip()
            if status != "active":
                raise RuntimeError(f"after the rollbacks the engine is {status}")
    out = {"reps": reps, "cases": {}, "target": "detect_s <= 3"}
    rows = []
    for label, rs in results.items():
        s = {k: common.stats([r[k] for r in rs]) for k in ("detect_s", "exit_after_crash_s", "crash_after_start_s")}
        s["runs"] = rs
        out["cases"][label] = s
        rows.append(
            (
                label,
                common.fmt(s["detect_s"]),
                common.fmt(s["exit_after_crash_s"]),
                common.fmt(s["crash_after_start_s"]),
                rs[0]["signature"],
            )
        )
    out["met"] = all(c["detect_s"]["max"] <= 3 for c in out["cases"].values())
    common.table(
        f"crash detection, {reps} reps per case",
        rows,
        ("engine", "crash -> reported (named)", "crash -> exit (incl. rollback)", "deploy start -> crash", "signature"),
    )
    print(f"  target: every crash reported within 3 s: {'met' if out['met'] else 'MISSED'}")
    common.write_result("crash", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
