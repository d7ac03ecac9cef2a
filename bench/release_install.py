"""Case: a real engine release installed on a host, pip vs uv (issue 31.3).

The real sglang 0.5.23 lock (playbooks/recipes/k26-tp8-dflash-0.5.23.py3.12.lock:
206 wheels, ~4.3 GB, cp312) on one lab host. Not a test: it needs the wheels
(downloaded once on the control node into WHEELS, `pip download --no-deps
--require-hashes -r`) and minutes of host time.

    python bench/release_install.py --wheels /var/tmp/k26-real-wheels [--reps 1]

WHEELS holds wheels/ (the locked files), alt/ (one other wheel: the second
release differs from the first by it) and uvwheel/ (uv's PyPI wheel: its
static binary is what hosts run), made once with
    grep -v '^#' playbooks/recipes/k26-tp8-dflash-0.5.23.py3.12.lock > req.txt
    pip download --no-deps --require-hashes -r req.txt -d WHEELS/wheels --only-binary=:all: \
        --implementation cp --python-version 3.12 --platform manylinux_2_35_x86_64 (... _2_17 to _2_39)
    pip download --no-deps tqdm==4.67.1 -d WHEELS/alt
    pip download --no-deps uv==0.13.9 -d WHEELS/uvwheel --only-binary=:all: --platform manylinux_2_17_x86_64 The lab hosts are Debian 12 (python 3.11);
the lock is for 3.12, so the control node's python 3.12 is copied to the
host at the same path (a pyenv build for the same Debian release).

Per installer, on the same host, the same pushed wheelhouse, no index:
  first release     empty store (uv) / nothing (pip)
  second release    the lock with one wheel changed, previous release kept
  rollback          the first release pruned (and the store's entries that only
                    it held), then installed again
Time is the install command's wall time (venv creation included); disk is
what the release alone holds (files with one link, `du` of the release dir
for pip) and the store's growth.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import common

LOCK = common.REPO / "playbooks/recipes/k26-tp8-dflash-0.5.23.py3.12.lock"
PY = "/root/.pyenv/versions/3.12.1"
ROOT = "/opt/k26bench"
WH = f"{ROOT}/wheelhouse"
# bytes deleting a dir frees: its directories and its files nothing else links (as the store agent's `alone`)
ALONE = (
    "python3 -c 'import os,sys\nt=0\nfor d,_,fs in os.walk(sys.argv[1]):\n t+=os.lstat(d).st_blocks*512\n for f in fs:\n"
    "  s=os.lstat(os.path.join(d,f))\n  t+=s.st_blocks*512 if s.st_nlink==1 else 0\nprint(t)' "
)


def lock_lines(text: str) -> list[str]:
    return [m.group(0) for m in re.finditer(r"^[A-Za-z0-9][^\n]*\\\n\s+--hash=sha256:[0-9a-f]{64}", text, re.M)]


def push(b, host: str, src: Path, dest: str) -> None:
    """tar over ssh (setup, not timed)."""
    from k26ops.lab.access import ssh_argv

    ssh = ssh_argv(
        b.dir,
        b.port(host),
        f"mkdir -p {shlex.quote(dest)} && tar -C {shlex.quote(dest)} -xf -",
        connect_timeout=None,
    )
    tar = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(ssh, stdin=tar.stdout, check=True)
    tar.wait()


LOADS: list[dict] = []  # the control node's load average around every timed install (the hosts share its cores)


def timed(b, host: str, cmd: str, label: str = "") -> float:
    l0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    b.ssh(host, cmd, timeout=3600)
    took = time.perf_counter() - t0
    LOADS.append({"what": label, "s": took, "load1_before": l0, "load1_after": os.getloadavg()[0]})
    return took


def install_cmd(tool: str, rel: str, req: str) -> str:
    """The release build's own install command (k26ops.release.installer), in a
    venv of the host's python 3.12 (made as the release build makes it)."""
    from k26ops.release import installer

    r = shlex.quote(rel)
    return (
        f"rm -rf {r} && mkdir -p {r}/k26ops && cp {shlex.quote(req)} {r}/k26ops/requirements.txt && cd {r} && "
        f"{PY}/bin/python3.12 -m venv venv && {installer.install_command(tool, ROOT, WH, False)}"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheels", default="/var/tmp/k26-real-wheels")
    ap.add_argument("--only", default="uv,pip")
    ap.add_argument("--first-only", action="store_true", help="time only the first release (a re-measure)")
    ap.add_argument(
        "--reps",
        type=int,
        default=1,
        help="with --first-only: interleaved reps (uv,pip then pip,uv, ...); the ratio is of the medians",
    )
    ap.add_argument(
        "--pip-rollback",
        default="no",
        choices=("yes", "no"),
        help="also time pip's rollback (the same full install as its first release)",
    )
    a = ap.parse_args()
    src = Path(a.wheels)
    alt = sorted((src / "alt").glob("*.whl"))[0]
    alt_name, alt_ver = alt.name.split("-")[:2]
    lines = lock_lines(LOCK.read_text())
    import hashlib

    alt_sha = hashlib.sha256(alt.read_bytes()).hexdigest()
    second = [l for l in lines if not l.lower().startswith(alt_name.lower() + "==")]
    assert len(second) == len(lines) - 1, alt_name
    second.append(f"{alt_name}=={alt_ver} \\\n    --hash=sha256:{alt_sha}")
    reqs = src / "reqs"
    reqs.mkdir(exist_ok=True)
    (reqs / "first.txt").write_text("\n".join(lines) + "\n")
    (reqs / "second.txt").write_text("\n".join(second) + "\n")
    results = {}
    with common.lab(1, "relinstall") as b:
        host = b.names[0]
        t0 = time.monotonic()
        push(b, host, Path(PY), PY)
        push(b, host, src / "wheels", WH)
        push(b, host, src / "alt", WH)
        push(b, host, reqs, f"{ROOT}/reqs")
        push(b, host, src / "uvwheel", f"{ROOT}/uvwheel")
        from k26ops.inventory import load
        from k26ops.release import installer
        from k26ops.transport import agents
        from k26ops.transport.ssh import connect

        uvw = installer.uv_wheel()
        session = connect(load(b.inventory).hosts[host])
        try:  # the host agent the release build runs: hash-checked, atomic
            assert agents.run(
                session,
                "store",
                "uv",
                wheel=f"{ROOT}/uvwheel/{uvw.name}",
                sha256=uvw.sha256,
                dest=installer.uv_path(ROOT),
            )["ok"]
        finally:
            session.close()
        print(f"setup (python 3.12, {len(lines)} wheels, uv pushed): {time.monotonic() - t0:.0f}s", flush=True)
        free0 = int(b.ssh(host, f"df -P -B1 {ROOT} | awk 'NR==2 {{print $3}}'").strip())
        order = a.only.split(",")
        tools = (
            order if not a.first_only else [t for i in range(a.reps) for t in (order if i % 2 == 0 else order[::-1])]
        )
        for tool in tools:
            rel = f"{ROOT}/{tool}"
            res = {}
            store = installer.store_dir(ROOT)

            def disk(path):
                return int(b.ssh(host, ALONE + shlex.quote(path)).strip() or 0)

            def store_bytes():
                return int(b.ssh(host, f"du -sB1 {store} 2>/dev/null | cut -f1; true").strip() or 0)

            s0 = store_bytes()
            res["first_s"] = timed(b, host, install_cmd(tool, f"{rel}/r1", f"{ROOT}/reqs/first.txt"), f"{tool} first")
            res["first_alone_bytes"], s1 = disk(f"{rel}/r1"), store_bytes()
            res["first_store_bytes"] = s1 - s0
            print(
                f"  {tool} first: {res['first_s']:.1f}s, release alone {res['first_alone_bytes'] / 1e9:.2f} GB, "
                f"store +{(s1 - s0) / 1e9:.2f} GB",
                flush=True,
            )
            if a.first_only:
                b.ssh(host, f"rm -rf {rel} {store}", timeout=3600)
                runs = results.setdefault(tool, {"first_runs": []})["first_runs"]
                runs.append(res)
                results[tool]["first"] = common.stats([r["first_s"] for r in runs])
                continue
            res["second_s"] = timed(b, host, install_cmd(tool, f"{rel}/r2", f"{ROOT}/reqs/second.txt"))
            res["second_alone_bytes"], s2 = disk(f"{rel}/r2"), store_bytes()
            res["second_store_bytes"] = s2 - s1
            # du counts a file once however many links it has: both releases and the store, together
            res["du_both"] = int(b.ssh(host, f"du -csB1 {rel} {store} 2>/dev/null | tail -1 | cut -f1").strip())
            print(
                f"  {tool} second (one wheel differs): {res['second_s']:.1f}s, release alone "
                f"{res['second_alone_bytes'] / 1e6:.1f} MB, store +{(s2 - s1) / 1e6:.1f} MB, "
                f"both releases + store {res['du_both'] / 1e9:.2f} GB",
                flush=True,
            )
            # prune r1: its dir, then the store's entries no release links any more
            if tool == "pip" and a.pip_rollback == "no":  # a pip rollback is a full install again
                results[tool] = res
                b.ssh(host, f"rm -rf {rel}", timeout=3600)
                common.write_result("release_install", {"lock": LOCK.name, "partial": True, **results})
                continue
            used0 = res["du_both"]
            b.ssh(host, f"rm -rf {rel}/r1")
            session = connect(load(b.inventory).hosts[host])
            try:  # prune's second half: the store files no release links any more
                res["gc"] = agents.run(session, "store", "gc", 600, store=store)
            finally:
                session.close()
            used1 = int(b.ssh(host, f"du -csB1 {rel} {store} 2>/dev/null | tail -1 | cut -f1").strip())
            res["prune_freed_bytes"] = used0 - used1
            res["rollback_s"] = timed(b, host, install_cmd(tool, f"{rel}/r1", f"{ROOT}/reqs/first.txt"))
            print(
                f"  {tool} prune r1 freed {res['prune_freed_bytes'] / 1e9:.2f} GB; rollback (reinstall r1): "
                f"{res['rollback_s']:.1f}s",
                flush=True,
            )
            b.ssh(host, f"rm -rf {rel} {store}", timeout=3600)
            results[tool] = res
            common.write_result("release_install", {"lock": LOCK.name, "partial": True, **results})
        results["setup_used_bytes"] = free0
    results["loads"] = LOADS
    if "pip" in results and "uv" in results and a.first_only:
        results["ratio_first"] = results["uv"]["first"]["median"] / results["pip"]["first"]["median"]
        print(
            f"uv/pip wall, first release (medians of {a.reps} interleaved): {results['ratio_first']:.2f}; "
            f"load1 during the runs {min(x['load1_before'] for x in LOADS):.1f}-{max(x['load1_after'] for x in LOADS):.1f}"
        )
    if "pip" in results and "uv" in results and not a.first_only:
        results["ratio_first"] = results["uv"]["first_s"] / results["pip"]["first_s"]
        pip_rb = results["pip"].get("rollback_s", results["pip"]["first_s"])  # pip rebuilds in full
        results["ratio_rollback"] = results["uv"]["rollback_s"] / pip_rb
        results["second_extra_disk_uv"] = (
            results["uv"]["second_alone_bytes"] + results["uv"]["second_store_bytes"]
        ) / (results["uv"]["first_alone_bytes"] + results["uv"]["first_store_bytes"])
        print(
            f"uv/pip wall: first {results['ratio_first']:.2f}, rollback {results['ratio_rollback']:.2f}; "
            f"uv second release extra disk {100 * results['second_extra_disk_uv']:.1f}%"
        )
    common.write_result("release_install", {"lock": LOCK.name, "wheels": len(lines), "alt": alt.name, **results})
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main())
