"""Issue 44, model fan-out: `k26ops model sync` of the lab model onto 1 host vs 8 hosts,
and `k26ops model verify --full` against a plain read of the same files.

Boots a 9-host lab. The origin is a path on the ninth host (`lab9:/models/Kimi-K2.6`,
the lab model: 3 real safetensors shards of 21 MB + 2 small files, 63 MB); lab1 (1 host)
or lab1-lab8 (8 hosts) sync it to /srv/k26/model, emptied before each run. Each rep
alternates 1 and 8 hosts (same lab, same load). Per run:

- `bytes_from_origin`, `bytes_between_hosts`: the sync's own report (its planner's count
  of bytes fetched from the origin and from peers);
- `bytes_through_control_node`: measured, not reported: every byte the k26ops process
  read or wrote (`/proc/self/io` rchar + wchar at its exit: sockets, pipes and files,
  its own module and inventory reads included), so an upper bound of what went through it;
- `wall_s`: the k26ops process from start to exit;
- `verify_gbps`, `read_gbps`: `model verify --full --force` on lab1 after the runs (at
  least 5 times), one host hashing on all its cores, beside its plain read of the same
  files in the same call (the agent drops their page cache before each pass; pages the
  sync just wrote may still be dirty, and then both passes read the page cache); the
  ratio is the median of each call's hash rate over its own read rate.

Every transfer is limited to `--bwlimit` MB/s (default 5): the lab's hosts share this
machine's cores and loopback, so without a limit 8 hosts' transfers compete for the
same 2 cores (a CPU bound, not the per-host network link a fleet has); the limit stands
in for each host's link. `--bwlimit 0` measures without it (printed, not judged).

    python bench/model_fanout.py [--reps 3] [--bwlimit 5]

Prints a table and, as its last line, one JSON object: the 8-host medians at the top
level (`hosts`, `bytes_from_origin`, `bytes_through_control_node`, `wall_s`,
`verify_gbps`, `read_gbps`), the 1-host medians under `one_host`, and the three ratios
of issue 44 with their targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import common
import yaml

HOSTS = 8
MODEL = "/srv/k26/model"
ORIGIN_HOST = "lab9"
ORIGIN = f"{ORIGIN_HOST}:/models/Kimi-K2.6"
# the k26ops CLI, with what it read and wrote written to $K26BENCH_IO at its exit
LAUNCH = (
    "import atexit, os, runpy, sys\n"
    "atexit.register(lambda: open(os.environ['K26BENCH_IO'], 'w').write(open('/proc/self/io').read()))\n"
    "sys.argv[0] = 'k26ops'\n"
    "runpy.run_module('k26ops', run_name='__main__')\n"
)


def k26ops_io(*args: str, timeout: float = 900) -> tuple[int, dict, float, int]:
    """(rc, JSON document, wall seconds, bytes the process read + wrote)."""
    import subprocess

    fd, io_path = tempfile.mkstemp(prefix="k26bench-io-")
    os.close(fd)
    try:
        env = {**common.installed_env(), "K26BENCH_IO": io_path}
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, "-c", LAUNCH, "--json", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=common.REPO,
            check=False,
        )
        wall = time.perf_counter() - t0
        with open(io_path) as f:
            io = dict(line.split(": ") for line in f.read().splitlines() if ": " in line)
    finally:
        os.unlink(io_path)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"k26ops {' '.join(args)} printed no JSON (rc {p.returncode}): {p.stderr[-1500:]}") from None
    return p.returncode, doc, wall, int(io["rchar"]) + int(io["wchar"])


def empty(b, names) -> None:
    """The hosts without the synced model, its verify record, this run's keys."""
    for n in names:
        b.ssh(n, f"rm -rf {MODEL} /opt/k26ops/state/model-verify /opt/k26ops/state/model-sync")


def sync_once(b, inv, names, bwlimit) -> dict:
    empty(b, names)
    limit = ",".join(names)
    args = ["-i", str(inv), "--limit", limit, "model", "sync", "--origin", ORIGIN]
    if bwlimit:
        args += ["--bwlimit", str(bwlimit)]
    rc, doc, wall, io = k26ops_io(*args)
    bad = {h: r["error"] for h, r in doc["hosts"].items() if r["status"] not in ("ok", "changed")}
    if rc != 0 or bad or any(r["fetched"] != 5 for r in doc["hosts"].values()):
        raise RuntimeError(f"sync of {limit} failed (rc {rc}): {bad or doc['hosts']}")
    return {
        "hosts": len(names),
        "wall_s": wall,
        "bytes_from_origin": doc["bytes_from_origin"],
        "bytes_between_hosts": doc["bytes_between_hosts"],
        "bytes_through_control_node": io,
        "host_gbps": [r["gbps"] for r in doc["hosts"].values()],
    }


def verify_once(inv) -> dict:
    rc, doc, _wall, _io = k26ops_io("-i", str(inv), "--limit", "lab1", "model", "verify", "--full", "--force")
    r = doc["hosts"]["lab1"]
    if rc != 0 or r["hashed"] != 5:
        raise RuntimeError(f"verify failed (rc {rc}): {r}")
    return {"verify_gbps": r["verify_gbps"], "read_gbps": r["read_gbps"], "workers": r["workers"]}


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=int(os.environ.get("K26BENCH_REPS", "3")))
    ap.add_argument("--bwlimit", type=float, default=5.0, help="MB/s per transfer (0: none)")
    a = ap.parse_args()
    one_names, many_names = ["lab1"], [f"lab{i}" for i in range(1, HOSTS + 1)]
    runs = {1: [], HOSTS: []}
    unlimited = {}
    verifies = []
    with common.lab(HOSTS + 1, "model-fanout") as b:
        data = yaml.safe_load(b.inventory.read_text())
        data["vars"]["model_path"] = MODEL
        inv = b.dir / "model.yml"
        inv.write_text(yaml.safe_dump(data, sort_keys=False))
        sync_once(b, inv, one_names, a.bwlimit)  # warm-up (page cache, bytecode), not counted
        for i in range(a.reps):
            for names in (one_names, many_names):
                r = sync_once(b, inv, names, a.bwlimit)
                runs[len(names)].append(r)
                print(
                    f"  rep {i + 1}: {len(names)} host(s): wall {r['wall_s']:.2f} s, from origin "
                    f"{r['bytes_from_origin'] / 1e6:.1f} MB, between hosts {r['bytes_between_hosts'] / 1e6:.1f} MB, "
                    f"through this node {r['bytes_through_control_node'] / 1e6:.1f} MB",
                    flush=True,
                )
        for i in range(max(a.reps, 5)):  # seconds each: more reps against this machine's noise
            v = verify_once(inv)
            verifies.append(v)
            print(
                f"  verify {i + 1}: lab1 hash {v['verify_gbps']} GB/s, plain read {v['read_gbps']} GB/s "
                f"({v['workers']} workers)",
                flush=True,
            )
        if a.bwlimit:  # for the record: no link limit, the lab's CPUs are the bound
            for names in (one_names, many_names):
                unlimited[len(names)] = sync_once(b, inv, names, 0)
    v = {k: statistics.median(x[k] for x in verifies) for k in ("verify_gbps", "read_gbps")}
    summary = {}
    rows = []
    for n, rs in runs.items():
        s = {
            "hosts": n,
            "reps": len(rs),
            "bwlimit_mb_s": a.bwlimit or None,
            "bytes_from_origin": med(rs, "bytes_from_origin"),
            "bytes_between_hosts": med(rs, "bytes_between_hosts"),
            "bytes_through_control_node": med(rs, "bytes_through_control_node"),
            "wall_s": round(med(rs, "wall_s"), 3),
            "wall_s_min": round(min(r["wall_s"] for r in rs), 3),
            "wall_s_max": round(max(r["wall_s"] for r in rs), 3),
            **v,
        }
        summary[n] = s
        rows.append(
            (
                n,
                f"{s['wall_s']:.2f} s ({s['wall_s_min']:.2f}-{s['wall_s_max']:.2f})",
                f"{s['bytes_from_origin'] / 1e6:.1f} MB",
                f"{s['bytes_between_hosts'] / 1e6:.1f} MB",
                f"{s['bytes_through_control_node'] / 1e6:.1f} MB",
            )
        )
        print(json.dumps(s))
    for n, r in unlimited.items():
        rows.append(
            (
                f"{n}, no --bwlimit",
                f"{r['wall_s']:.2f} s (1 run)",
                f"{r['bytes_from_origin'] / 1e6:.1f} MB",
                f"{r['bytes_between_hosts'] / 1e6:.1f} MB",
                f"{r['bytes_through_control_node'] / 1e6:.1f} MB",
            )
        )
    common.table(
        f"model sync of the lab model (63 MB) from {ORIGIN}, --bwlimit {a.bwlimit} MB/s, {a.reps} reps",
        rows,
        ("hosts", "wall median (min-max)", "from origin", "between hosts", "through this node"),
    )
    print(f"  lab1 model verify --full --force: hash {v['verify_gbps']} GB/s vs plain read {v['read_gbps']} GB/s")
    one, many = summary[1], summary[HOSTS]
    ratios = {
        "origin_8_over_1": many["bytes_from_origin"] / one["bytes_from_origin"],
        "wall_8_over_1": many["wall_s"] / one["wall_s"],
        # side by side: each verify's hash rate over its own read's, the median of those
        "verify_over_read": statistics.median(x["verify_gbps"] / x["read_gbps"] for x in verifies),
    }
    targets = {"origin_8_over_1": 1.1, "wall_8_over_1": 2.0, "verify_over_read": 0.8}
    met = {
        "origin_8_over_1": ratios["origin_8_over_1"] <= 1.1,
        "wall_8_over_1": ratios["wall_8_over_1"] <= 2.0,
        "verify_over_read": ratios["verify_over_read"] is not None and ratios["verify_over_read"] >= 0.8,
    }
    for k in ratios:
        print(
            f"  {k}: {ratios[k]:.3f} (target {'<=' if k != 'verify_over_read' else '>='} {targets[k]}: "
            f"{'met' if met[k] else 'MISSED'})"
        )
    out = {
        **many,
        "one_host": one,
        "ratios": {k: round(x, 3) for k, x in ratios.items() if x is not None},
        "targets": targets,
        "met": met,
        "unlimited": {
            str(n): {k: r[k] for k in ("wall_s", "bytes_from_origin", "bytes_through_control_node")}
            for n, r in unlimited.items()
        },
    }
    common.write_result("model_fanout", out)
    print(json.dumps(out))
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
