"""The lab's stand-ins run here as programs: the kernel log, nvidia-smi, the engine stand-in."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from k26ops.engine import launch
from labtools import REPO
from labtools.ports import free_port


def lab_kernel_log(tmp_path: Path, name: str, at: float, command: str | None = None) -> str:
    """What `command` (default `journalctl -k -o short-iso`) prints on a lab host whose
    journalctl stand-in replays recorded kernel log tests/data/facts/`name` stamped `at`
    (the stand-ins run here as programs: k26ops/lab/fixtures on PATH, the lab's nvidia-smi)."""
    fixtures = REPO / "k26ops" / "lab" / "fixtures"
    log = tmp_path / name
    log.write_bytes((REPO / "tests" / "data" / "facts" / name).read_bytes())
    os.utime(log, (at, at))
    env = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_LAB_")}
    env.update(PATH=f"{fixtures}:{env['PATH']}", K26OPS_LAB_KERNEL_LOG=str(log))
    cmd = (command or "journalctl -k -o short-iso").replace("journalctl", str(fixtures / "journalctl"))
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=30)
    return p.stdout + p.stderr


def lab_bus_ids() -> str:
    """The lab nvidia-smi's `--query-gpu=index,pci.bus_id --format=csv,noheader`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_LAB_")}
    p = subprocess.run(
        [
            str(REPO / "k26ops" / "lab" / "fixtures" / "nvidia-smi"),
            "--query-gpu=index,pci.bus_id",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    return p.stdout


STANDIN = REPO / "k26ops/lab/fixtures/engine_standin.py"


class Standin:
    def __init__(self, tmp: Path, *flags: str, env: dict | None = None, python: str = sys.executable, **profile):
        self.port = free_port()
        self.out, self.err = tmp / f"out-{self.port}.log", tmp / f"err-{self.port}.log"
        argv = launch.engine_argv(
            {
                "python": python,
                "model_path": "/models/Kimi-K2.6",
                "draft_model_path": "/models/draft",
                "speculative_ddtree_budget": 32,
                "speculative_dflash_block_size": 8,
                "cuda_graph_max_bs_decode": 8,
                "port": self.port,
                "extra_args": list(flags),
                **profile,
            }
        )
        argv[1:3] = [str(STANDIN)]  # the lab runs it as a module; here as a script
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "K26OPS_STANDIN_LOAD_SECONDS": "0.2",
            "SGLANG_CACHE_DIR": str(tmp / "engine-cache"),
            **(env or {}),
        }
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(argv, stdout=o, stderr=e, env=full_env, stdin=subprocess.DEVNULL)

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 5):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(
                method,
                path,
                body=json.dumps(body) if body is not None else None,
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, (json.loads(data) if data and data[:1] in b"{[" else data.decode())
        finally:
            conn.close()

    def status(self, path: str = "/health") -> int | None:
        try:
            return self.request("GET", path, timeout=2)[0]
        except OSError:
            return None

    def wait_ready(self, deadline: float = 15) -> list[int | None]:
        seen, end = [], time.monotonic() + deadline
        while time.monotonic() < end:
            code = self.status()
            seen.append(code)
            if code == 200:
                return seen
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.err.read_text()}")
            time.sleep(0.05)
        raise AssertionError(f"not ready in {deadline}s: {seen[-5:]}")

    def wait_exit(self, timeout: float = 15) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
