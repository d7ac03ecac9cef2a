"""Test helpers around the lab: free ports, ssh with the lab's key, running k26ops."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port_block(count: int, start: int = 23000, stop: int = 29000) -> int:
    """The first port of `count` consecutive free loopback ports."""
    port = start + (os.getpid() * 7) % 3000
    while port + count < stop:
        ok = True
        # the sshd ports and the engine ports the lab derives from them
        for p in [*range(port, port + count), *range(port + 20000, port + 20000 + count)]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
        port += count + 1
    raise RuntimeError("no free port block")


def lab_ssh(lab_dir: Path, port: int, command: str, timeout: float = 60,
            user: str = "root") -> subprocess.CompletedProcess:
    """OpenSSH with the lab's key and known_hosts, strict host key checking."""
    return subprocess.run(
        ["ssh", "-i", str(lab_dir / "id_ed25519"), "-o", f"UserKnownHostsFile={lab_dir / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
         "-p", str(port), f"{user}@127.0.0.1", command],
        capture_output=True, text=True, timeout=timeout)


def k26ops(*args: str, env: dict | None = None, timeout: float = 600, input: str | None = None):
    """Run the real CLI in a subprocess (as a user would)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "k26ops", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO, input=input)


def k26ops_json(*args: str, **kw) -> tuple[int, dict]:
    proc = k26ops("--json", *args, **kw)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc {proc.returncode}): {proc.stdout!r} {proc.stderr!r}")


def recipe_with_extra_patch(d: Path, label: str) -> Path:
    """The lab recipe plus one harmless patch (a comment line in
    sglang/version.py): a second, different release of the same engine."""
    import yaml

    import sglang_release

    series = d / "patches" / "series"
    series.parent.mkdir(parents=True)
    first = (sglang_release.site_packages() / "sglang/version.py").read_text().splitlines()[0]
    (series.parent / f"{label}.patch").write_text(
        f"Base: sglang==0.5.23 (PyPI)\nA harmless test patch ({label}).\n"
        "--- a/sglang/version.py\n+++ b/sglang/version.py\n"
        f"@@ -1,1 +1,2 @@\n {first}\n+# k26ops {label} patch\n")
    series.write_text(f"{REPO}/patches/sglang-0.5.23/ddtree-verify-graph-tokens.patch\n{label}.patch\n")
    doc = yaml.safe_load((REPO / "playbooks/recipes/lab.yml").read_text())
    doc["patches"]["series"] = str(series)
    (d / "changed.yml").write_text(yaml.safe_dump(doc))
    return d / "changed.yml"
