"""Case 4, wheelhouse: bytes downloaded from the package index for a deploy
to 1 host vs 4 hosts (must not depend on the host count).

Boots a 4-host lab. Each rep: every host is wiped to a fresh state (no
toolchain, release, unit or env file), then `k26ops deploy --limit lab1` runs
with an EMPTY wheelhouse (K26OPS_WHEELHOUSE = a new dir) and pip's own cache
off (PIP_NO_CACHE_DIR=1, so every byte really comes from the index); then the
hosts are wiped again and `k26ops deploy` runs on all 4 with another empty
wheelhouse. The bytes are the wheelhouse's downloads.log (one line per real
`pip download`, with the wheels' total size). Full first deploys of 1 + 4
hosts are heavy on a 2-core machine: default 2 reps.

    python bench/wheelhouse_bytes.py [--reps 2]
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import common

HOSTS = 4


def downloads(wh: Path) -> list[dict]:
    log = wh / "downloads.log"
    return [json.loads(l) for l in log.read_text().splitlines() if l.strip()] if log.exists() else []


def one(b: common.BenchLab, limit: str | None) -> dict:
    for n in b.names:
        b.wipe(n)
    wh = Path(tempfile.mkdtemp(prefix="k26bench-wheelhouse-", dir="/var/tmp"))
    try:
        t0 = time.monotonic()
        common.first_deploy(b, limit=limit, env={"K26OPS_WHEELHOUSE": str(wh), "PIP_NO_CACHE_DIR": "1"})
        wall = time.monotonic() - t0
        d = downloads(wh)
        pushed = sum(p.stat().st_size for p in wh.rglob("*.whl"))
        return {
            "hosts": 1 if limit else len(b.names),
            "wall": wall,
            "downloads": len(d),
            "bytes": sum(x["bytes"] for x in d),
            "by_request": {" ".join(x["requirements"]): x["bytes"] for x in d},
            "wheelhouse_bytes_on_disk": pushed,
        }
    finally:
        shutil.rmtree(wh, ignore_errors=True)


def main() -> int:
    reps = common.reps_arg(2)
    runs = {"1": [], str(HOSTS): []}
    with common.lab(HOSTS, "wheelhouse") as b:
        for i in range(reps):
            for key, limit in (("1", "lab1"), (str(HOSTS), None)):
                r = one(b, limit)
                runs[key].append(r)
                print(
                    f"  rep {i + 1}: {key} host(s): {r['bytes']:,} bytes in {r['downloads']} download(s) "
                    f"{r['by_request']}; deploy {r['wall']:.0f}s"
                )
    out = {"reps": reps, "cases": {}}
    rows = []
    for key, rs in runs.items():
        s = {
            "bytes": common.stats([r["bytes"] for r in rs]),
            "downloads": common.stats([r["downloads"] for r in rs]),
            "deploy_wall": common.stats([r["wall"] for r in rs]),
            "runs": rs,
        }
        out["cases"][key] = s
        rows.append(
            (
                f"{key} host(s)",
                f"{s['bytes']['median'] / 1e6:.1f} MB ({int(s['bytes']['min']):,}-{int(s['bytes']['max']):,} B)",
                f"{s['downloads']['median']:.0f}",
                common.fmt(s["deploy_wall"], digits=0),
            )
        )
    one_b = [r["bytes"] for r in runs["1"]]
    many_b = [r["bytes"] for r in runs[str(HOSTS)]]
    out["ratio_bytes"] = out["cases"][str(HOSTS)]["bytes"]["median"] / out["cases"]["1"]["bytes"]["median"]
    out["target"] = "bytes(4 hosts) == bytes(1 host)"
    out["met"] = set(one_b) == set(many_b) and len(set(one_b)) == 1
    common.table(
        f"wheelhouse downloads, fresh wheelhouse + fresh hosts, {reps} reps",
        rows,
        ("deploy to", "bytes from the index", "pip downloads", "first-deploy wall"),
    )
    print(
        f"  bytes {HOSTS} hosts / 1 host: {out['ratio_bytes']:.3f}  (independent of host count: "
        f"{'met' if out['met'] else 'MISSED'})"
    )
    common.write_result("wheelhouse", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
