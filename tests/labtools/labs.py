"""Private labs (booted by the `lab`/`scratch_lab` fixtures and by tests that need their own hosts;
conftest marks a test that calls private_lab(...) `lab`), and the real sglang-router on loopback."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labtools.invoke import lab_ssh
from labtools.ports import free_port, free_port_block


class RunningLab:
    def __init__(self, directory: Path, count: int, deployed: bool = False):
        from k26ops.lab.machines import Lab

        self.lab = Lab(directory)
        self.dir = directory
        self.base_port = free_port_block(count)
        self.hosts = self.lab.up(count, self.base_port, log=lambda m: None, deployed=deployed)
        self.inventory = directory / "inventory.yml"

    def env(self) -> dict:
        return {"K26OPS_INVENTORY": str(self.inventory), "K26OPS_LAB_DIR": str(self.dir)}

    def port(self, name: str) -> int:
        return next(h.port for h in self.hosts if h.name == name)

    def ssh(self, host: str, command: str, timeout: float = 60) -> str:
        """`command`'s stdout on lab host `host` (OpenSSH, the lab's key, strict host key
        checking); a non-zero exit fails the test. The one way tests run a command on a lab host."""
        proc = lab_ssh(self.dir, self.port(host), command, timeout=timeout)
        assert proc.returncode == 0, (host, command, proc.stdout, proc.stderr)
        return proc.stdout

    def down(self) -> None:
        self.lab.down()


@contextlib.contextmanager
def sglang_router(workdir: Path, *extra: str):
    """The real SGLang Model Gateway (PyPI sglang-router) on loopback, with an admin key for
    its worker API: {"url", "port", "key", "log"}; stopped (its process group) after the block."""
    import secrets
    import signal
    import urllib.request

    port, key, log = free_port(), secrets.token_hex(12), workdir / "router.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # loopback only
    with open(log, "w") as out:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warn",
                "--control-plane-api-keys",
                f"t:test:admin:{key}",
                *extra,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        end = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > end or p.poll() is not None:
                raise AssertionError(f"sglang-router did not answer /health: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "key": key, "log": log}
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


@contextlib.contextmanager
def private_lab(count: int, tag: str, deployed: bool = False):
    """Boot a lab of `count` hosts for the duration of the block; always torn
    down (also on failure, Ctrl-C, or, through atexit, a dying interpreter).
    `deployed=True`: the hosts boot with the lab recipe already deployed and its
    engine serving (the cached deployed layer, k26ops/lab/deployed.py), for tests
    that need a converged host, not a first deploy; keep a bare host (the default)
    for what a first deploy does (wheel bytes, first-deploy faults, custom roots)."""
    if os.geteuid() != 0:
        pytest.fail("lab tests need root (systemd-nspawn); run the test suite as root")
    directory = Path(tempfile.mkdtemp(prefix=f"k26ops-{tag}-", dir="/var/tmp"))
    try:
        running = RunningLab(directory, count, deployed)  # a failed `up` stops what it started
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise

    def cleanup():
        running.down()
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(cleanup)
    try:
        yield running
    finally:
        cleanup()
        atexit.unregister(cleanup)
