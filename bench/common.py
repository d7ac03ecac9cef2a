"""Shared helpers for the benchmarks: a private lab per script, running the real
k26ops CLI in a subprocess, ssh with the lab's key, stats, tables, JSON results.

Every script boots its OWN lab (a fresh dir under /var/tmp, its own free block
of loopback ports for sshd and for the engines) and always stops it in
`finally`. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
UNIT = "k26-engine.service"
ENV_FILE = "/etc/k26ops/sglang.env"

sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------- ports


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_block(count: int, start: int, stop: int) -> int:
    """First port of `count` consecutive free loopback ports in [start, stop)
    (the tests use 23000-29000 and 31000-35000; the benches stay out of those)."""
    port = start + (os.getpid() * 13) % max(1, (stop - start) // 2)
    tried = 0
    while tried < (stop - start):
        if port + count >= stop:
            port = start
        if all(_free(p) for p in range(port, port + count)):
            return port
        port += count + 1
        tried += count + 1
    raise RuntimeError(f"no free block of {count} ports in {start}-{stop}")


# ---------------------------------------------------------------- lab


class BenchLab:
    """A lab of `count` hosts in its own dir and port blocks; engine ports free too."""

    def __init__(self, count: int, tag: str, log=print):
        from k26ops.lab.machines import Lab

        self.count = count
        self.dir = Path(tempfile.mkdtemp(prefix=f"k26bench-{tag}-", dir="/var/tmp"))
        self.lab = Lab(self.dir)
        self.log = log
        self.hosts = []
        self.base_port = free_port_block(count, 41000, 45000)
        self.engine_base = free_port_block(count, 45000, 49000)

    def up(self) -> "BenchLab":
        t0 = time.monotonic()
        self.hosts = self.lab.up(self.count, self.base_port, log=lambda m: None)
        inv = yaml.safe_load(self.inventory.read_text())
        for i, h in enumerate(self.hosts):
            inv["hosts"][h.name]["vars"]["engine_port"] = self.engine_base + i
        self.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
        self.log(
            f"lab: {self.count} host(s) up in {time.monotonic() - t0:.1f}s "
            f"({self.dir}, ssh ports {self.base_port}-{self.base_port + self.count - 1})"
        )
        return self

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def port(self, name: str) -> int:
        return next(h.port for h in self.hosts if h.name == name)

    def engine_port(self, name: str) -> int:
        return self.engine_base + self.names.index(name)

    def write_inventory(self, name: str, **host_vars) -> Path:
        """A copy of the lab inventory with extra vars per host ({host: {var: value}})."""
        inv = yaml.safe_load(self.inventory.read_text())
        for host, extra in host_vars.items():
            inv["hosts"][host]["vars"].update(extra)
        path = self.dir / f"{name}.yml"
        path.write_text(yaml.safe_dump(inv, sort_keys=False))
        return path

    def ssh(self, name: str, command: str, check: bool = True, timeout: float = 120) -> str:
        from k26ops.lab.access import ssh_argv

        res = subprocess.run(
            ssh_argv(self.dir, self.port(name), command),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"ssh {name} {command!r}: rc {res.returncode}: {res.stderr.strip()[-300:]}")
        return res.stdout

    def wipe(self, name: str) -> None:
        """Make a host fresh again: no engine, no unit/env file, nothing under /opt/k26ops."""
        self.ssh(
            name,
            f"systemctl disable --now {UNIT} >/dev/null 2>&1; rm -f /etc/systemd/system/{UNIT} "
            f"{ENV_FILE}; rm -rf /etc/k26ops /opt/k26ops; systemctl daemon-reload; "
            f"systemctl reset-failed {UNIT} 2>/dev/null; true",
        )

    def down(self) -> None:
        try:
            self.lab.down()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.log(f"lab: down ({self.dir})")


@contextmanager
def lab(count: int, tag: str):
    b = BenchLab(count, tag)
    try:
        yield b.up()
    finally:
        b.down()


# ---------------------------------------------------------------- k26ops

_PYCACHE: dict = {}


def installed_env() -> dict:
    """The environment k26ops runs in here, as installed: with its modules' bytecode.

    pip compiles a package's modules at install (as it did Ansible's and every library's
    in site-packages), but this machine sets PYTHONDONTWRITEBYTECODE=1, so a k26ops started
    from the checkout compiled the ~100 modules a deploy imports on every start (0.17-0.26
    CPU-s here, 40 % of its start-up) while Ansible read its bytecode. So k26ops gets a bytecode cache of its own
    (PYTHONPYCACHEPREFIX in a private dir, removed at exit), compiled before anything is
    timed; the libraries it imports are compiled there on their first import, by the untimed
    first deploy or warm-up run every bench makes. K26BENCH_PYCACHE=0: the old way."""
    if os.environ.get("K26BENCH_PYCACHE", "1") == "0":
        return dict(os.environ)
    if not _PYCACHE:
        import atexit

        d = tempfile.mkdtemp(prefix="k26bench-pycache-", dir="/var/tmp")
        atexit.register(shutil.rmtree, d, True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = d
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "-j", "0", "k26ops"],
            env=env,
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [sys.executable, "-m", "k26ops", "--help"], env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL
        )  # the libraries the CLI imports at start
        _PYCACHE.update(env)
    return dict(_PYCACHE)


def k26ops(*args: str, env: dict | None = None, timeout: float = 900) -> tuple[subprocess.CompletedProcess, float]:
    """Run the real CLI as a user would (as installed: installed_env); (process, wall seconds)."""
    import resource

    full = {**installed_env(), **(env or {})}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "k26ops", *args], capture_output=True, text=True, env=full, timeout=timeout, cwd=REPO
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the k26ops process (control node): user + system
    proc.cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return proc, wall


def deploy_json(inventory: Path, *extra: str, env: dict | None = None, timeout: float = 900):
    """`k26ops --json -i INV deploy ...`: (rc, data, wall seconds)."""
    proc, wall = k26ops("--json", "-i", str(inventory), *extra, "deploy", env=env, timeout=timeout)
    try:
        data = json.loads(proc.stdout)
        data["_cpu"] = proc.cpu
    except json.JSONDecodeError:
        raise RuntimeError(
            f"deploy printed no JSON (rc {proc.returncode}): {proc.stdout[-500:]!r} {proc.stderr[-1500:]!r}"
        ) from None
    return proc.returncode, data, wall


def first_deploy(b: BenchLab, limit: str | None = None, env: dict | None = None) -> float:
    """Deploy from scratch (toolchain, release, service); fail loudly if it does not converge."""
    extra = ("--limit", limit) if limit else ()
    rc, data, wall = deploy_json(b.inventory, *extra, env=env, timeout=1800)
    bad = {h: (r["status"], r["error"]) for h, r in data["hosts"].items() if r["status"] not in ("ok", "changed")}
    if rc != 0 or bad:
        raise RuntimeError(f"first deploy failed: {bad}")
    return wall


# ---------------------------------------------------------------- numbers


def stats(values: list[float]) -> dict:
    v = [float(x) for x in values]
    if not v:
        return {"n": 0}
    return {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}


def fmt(s: dict, unit: str = "s", digits: int = 3) -> str:
    if not s.get("n"):
        return "-"
    return f"{s['median']:.{digits}f} {unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f})".replace(" ()", "")


def table(title: str, rows: list[tuple], header: tuple = ("case", "median (min-max)")) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("  " + "  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def machine() -> dict:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "cpus": os.cpu_count(),
        "loadavg_at_end": load,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def write_result(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc = {"bench": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(), **data}
    path = RESULTS / f"{name}-{stamp}.json"
    text = json.dumps(doc, indent=1, default=str)
    path.write_text(text)
    (RESULTS / f"{name}-latest.json").write_text(text)
    print(f"\nwrote {path.relative_to(REPO)}")
    return path


def reps_arg(default: int) -> int:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=int(os.environ.get("K26BENCH_REPS", default)))
    return p.parse_args().reps
