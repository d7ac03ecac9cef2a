"""`k26ops provision` on one host: the provision playbook's steps, then, when the
driver step asks for it, the reboot, the wait and the verification. Orchestration
(it runs a playbook and a reboot), so it sits above the steps, not in one."""

from __future__ import annotations

from k26ops.host.reboot import reboot_verified
from k26ops.orchestrate import playbook
from k26ops.steps import RunOptions
from k26ops.steps.driver import driver_version, verify, want
from k26ops.transport.fleet import Outcome


def provision_work(steps, *, check: bool, allow_reboot: bool, timeout: float, accept_new: bool, connect_timeout: float):
    """Rollout work for `k26ops provision`: the playbook's steps, then, when the
    driver step asks for it, the reboot, the wait and the verification."""
    step = next((s for s in steps if s.name == "driver"), None)

    def work(session, progress):
        out = playbook.run_on_host(
            session,
            steps,
            check=check,
            progress=progress,
            purpose="provision",
            options=RunOptions(allow_reboot=allow_reboot),
        )
        why = out.get("reboot")
        if check or not why:
            if check and why:
                out["reboot"] = "would reboot"
            return out
        w = want(session.host.vars, step.params if step else {})
        after, secs = reboot_verified(
            session,
            purpose="provision",
            accept_new=accept_new,
            connect_timeout=connect_timeout,
            timeout=timeout,
            progress=progress,
            check=lambda f: verify(f, w, session.host.vars.get("gpus_per_host")),
        )
        res = Outcome(
            changed=True,
            steps=out.get("steps", []),
            reboot=f"rebooted, back in {secs:.0f}s",
            driver=driver_version(after)[0],
        )
        if after.get("traffic"):  # drained around the reboot (k26ops.traffic.drain)
            res["traffic"] = after["traffic"]
        return res

    return work
