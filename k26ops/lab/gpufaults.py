"""Lab only: make a lab host replay recorded GPU fault outputs (never used outside the lab).

Why: the lab has no GPU, so `facts`, `check`, `status` and the health parsers are proven on a
lab host by its stand-ins replaying recorded real outputs (k26ops/lab/fixtures/): nvidia-smi
replays a recorded `-q` (K26OPS_LAB_SMI_Q), journalctl replays a recorded kernel log for `-k`
(K26OPS_LAB_KERNEL_LOG), and a real systemd unit runs the nv-fabricmanager stand-in, which
prints a recorded fabric manager's lines and exits 1, so systemd marks it failed and journald
holds its lines as on a real host. `install(...)` returns one shell command that sets these up
(recorded texts travel base64-encoded); `clear()` undoes them.
"""

from __future__ import annotations

import base64

from k26ops.shell import q

KNOBS = "/etc/k26ops-lab"
FM_UNIT = "/etc/systemd/system/nvidia-fabricmanager.service"
# The stand-in's unit (lab fixture): the real package's description, ExecStart and type (forking:
# systemd's lines then read "Starting NVIDIA fabric manager service..." and "Control process
# exited" as on the recorded hosts).
FM_UNIT_TEXT = """[Unit]
Description=NVIDIA fabric manager service

[Service]
Type=forking
ExecStart=/usr/local/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
SyslogIdentifier=nv-fabricmanager
"""


def _put(path: str, text: str) -> str:
    b64 = base64.b64encode(text.encode()).decode()
    return f"echo {b64} | base64 -d > {q(path)}"


def install(*, smi_q: str | None = None, kernel_log: str | None = None, fabric_manager_log: str | None = None) -> str:
    """One shell command (run as root on a lab host) that makes it replay these recorded texts."""
    cmds = [f"mkdir -p {KNOBS}"]
    if smi_q is not None:
        cmds += [_put(f"{KNOBS}/q.txt", smi_q), f"echo K26OPS_LAB_SMI_Q={KNOBS}/q.txt > {KNOBS}/nvidia-smi.env"]
    if kernel_log is not None:
        cmds += [
            _put(f"{KNOBS}/kernel.log", kernel_log),
            f"echo K26OPS_LAB_KERNEL_LOG={KNOBS}/kernel.log > {KNOBS}/kernel.env",
        ]
    if fabric_manager_log is not None:
        cmds += [
            _put(f"{KNOBS}/fabricmanager.log", fabric_manager_log),
            f"echo K26OPS_LAB_FM_LOG={KNOBS}/fabricmanager.log > {KNOBS}/fabricmanager.env",
            _put(FM_UNIT, FM_UNIT_TEXT),
            "systemctl daemon-reload",
            "systemctl start nvidia-fabricmanager.service >/dev/null 2>&1; true",
        ]
    return " && ".join(cmds)


def clear() -> str:
    """The shell command that puts a lab host back to healthy stand-ins."""
    return (
        f"rm -f {KNOBS}/nvidia-smi.env {KNOBS}/kernel.env {KNOBS}/fabricmanager.env {FM_UNIT}; "
        "systemctl reset-failed nvidia-fabricmanager.service >/dev/null 2>&1; systemctl daemon-reload"
    )
