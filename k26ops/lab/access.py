"""How a person, a test or a benchmark reaches a lab host: OpenSSH with the lab's key and
known_hosts and strict host key checking (the lab's keys are recorded when it boots, so
nothing is trusted on first use). Standard library only: tests and benchmarks use it
without loading the lab's machinery."""

from __future__ import annotations

from pathlib import Path


def ssh_argv(
    lab_dir: Path | str,
    port: int,
    *command: str,
    user: str = "root",
    known_hosts: Path | str | None = None,
    batch: bool = True,
    connect_timeout: int | None = 10,
) -> list[str]:
    """`ssh` to the lab host on loopback `port`, running `command` if given. `batch`: never prompt
    (scripts); `connect_timeout`: seconds for the TCP connect (None: OpenSSH's own)."""
    lab_dir = Path(lab_dir)
    argv = ["ssh", "-i", str(lab_dir / "id_ed25519")]
    argv += ["-o", f"UserKnownHostsFile={known_hosts or lab_dir / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes"]
    if batch:
        argv += ["-o", "BatchMode=yes"]
    if connect_timeout is not None:
        argv += ["-o", f"ConnectTimeout={connect_timeout}"]
    return argv + ["-p", str(port), f"{user}@127.0.0.1", *command]
