"""Case 8, release bytes at the control node: what the control node sends to
build a release on 1 host vs 8 hosts, for each wheel source (push, peer, index).

Boots an 8-host lab and deploys the toolchain + release once (push, not
measured). Then for each mode and each size: the hosts' release and every
wheel in their wheelhouse are removed (the CUDA toolchain stays installed, so
only the release step moves wheels), and `k26ops deploy` with a playbook of the
toolchain and release steps runs with `wheel_source: MODE`. The bytes are
k26ops's own count of file contents it sent over SFTP (`uploaded` per host in
--json, the relay's included): the wheels plus the few small files every host
gets (its requirements file, the patch series, patchset.py, the manifest). With `--toolchain`, the toolchain is removed too, so
its wheels (the CUDA toolkit, ~100 MB) move as well.

Index mode needs the hosts to reach the package index (the lab's hosts reach
PyPI through this machine's network).

    python bench/wheel_bytes.py [--reps 1] [--modes push,peer,index] [--toolchain]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import common

HOSTS = 8
STEPS = "name: engine\nsteps:\n  - cuda_toolkit: {}\n  - release: {keep: 3}\n"
WH = "/opt/k26ops/wheelhouse"


def reset(b: common.BenchLab, names: list[str], toolchain: bool) -> None:
    extra = " /opt/k26ops/toolchain" if toolchain else ""
    for n in names:
        b.ssh(n, f"rm -rf /opt/k26ops/releases/sglang-* /opt/k26ops/releases/current {WH}/*.whl{extra}")


def one(b: common.BenchLab, mode: str, n: int, playbook, ports: int, toolchain: bool) -> dict:
    names = b.names[:n]
    reset(b, names, toolchain)
    inv = b.write_inventory(
        f"inv-{mode}", **{h: {"wheel_source": mode, "wheel_peer_port": ports + i} for i, h in enumerate(b.names)}
    )
    t0 = time.monotonic()
    proc, _ = common.k26ops(
        "--json", "-i", str(inv), "--limit", ",".join(names), "deploy", "--playbook", str(playbook), timeout=3600
    )
    try:
        rc, data = proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"{mode} deploy printed no JSON (rc {proc.returncode}): {proc.stderr[-800:]}") from None
    bad = {h: r["error"] for h, r in data["hosts"].items() if r["status"] not in ("ok", "changed")}
    if rc != 0 or bad:
        raise RuntimeError(f"{mode} deploy to {n} hosts failed: {bad}")
    hosts = data["hosts"]
    wheels = {h: r.get("wheels", {}) for h, r in hosts.items()}
    return {
        "mode": mode,
        "hosts": n,
        "wall": time.monotonic() - t0,
        "uploaded": sum(r["uploaded"] for r in hosts.values()),
        "uploaded_per_host": {h: r["uploaded"] for h, r in hosts.items()},
        "wheels": wheels,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=int(os.environ.get("K26BENCH_REPS", 1)))
    p.add_argument("--modes", default="push,peer,index")
    p.add_argument("--toolchain", action="store_true", help="remove and re-deliver the CUDA toolchain's wheels too")
    a = p.parse_args()
    runs = []
    with common.lab(HOSTS, "wheelbytes") as b:
        playbook = b.dir / "engine.yml"
        playbook.write_text(STEPS)
        ports = common.free_port_block(HOSTS, 40000, 41000)
        t0 = time.monotonic()
        common.first_deploy(b)  # everything once (push), not measured
        print(f"first deploy of {HOSTS} hosts: {time.monotonic() - t0:.0f}s", flush=True)
        for _ in range(a.reps):
            for mode in a.modes.split(","):
                for n in (1, HOSTS):
                    r = one(b, mode, n, playbook, ports, a.toolchain)
                    runs.append(r)
                    print(
                        f"  {mode:5} {n} host(s): control node sent {r['uploaded']:,} bytes "
                        f"({r['uploaded'] / n:,.0f}/host) in {r['wall']:.0f}s; wheels from: "
                        f"{json.dumps(sorted({json.dumps(w, sort_keys=True) for w in r['wheels'].values()}))}",
                        flush=True,
                    )
        load = os.getloadavg()
    rows, out = [], {"reps": a.reps, "toolchain": a.toolchain, "load_at_end": load, "runs": runs, "cases": {}}
    for mode in a.modes.split(","):
        by = {
            n: common.stats([r["uploaded"] for r in runs if r["mode"] == mode and r["hosts"] == n]) for n in (1, HOSTS)
        }
        ratio = by[HOSTS]["median"] / by[1]["median"] if by[1]["median"] else float("nan")
        out["cases"][mode] = {"1": by[1], str(HOSTS): by[HOSTS], "ratio": ratio}
        rows.append((mode, f"{by[1]['median']:,.0f}", f"{by[HOSTS]['median']:,.0f}", f"{ratio:.2f}"))
    common.table(
        f"bytes the control node sent to build a release, {a.reps} rep(s)"
        + (" (toolchain too)" if a.toolchain else ""),
        rows,
        ("wheel_source", "1 host", f"{HOSTS} hosts", f"{HOSTS}/1"),
    )
    common.write_result("wheel_bytes" + ("_toolchain" if a.toolchain else ""), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
