"""Reboot one host and wait for it: the building block of rolling reboots.

Why a boot id: a host that has not gone down yet still answers SSH, so
"SSH answers" alone would pass before the reboot happened. The kernel's
/proc/sys/kernel/random/boot_id changes on every boot (nspawn gives each
container boot its own), so the host is back only when a new connection
reads a new one. Then systemd must finish booting (`is-system-running
--wait`): a host whose units failed is not healthy.

Never reboots a host whose engine unit is active unless allowed: rebooting a
serving engine drops every request in flight.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from k26ops import facts as facts_mod
from k26ops.errors import StepFailed
from k26ops.host import ownership
from k26ops.host.lock import HostLock
from k26ops.host.preflight import driver_version
from k26ops.interrupt import check as check_interrupted
from k26ops.layout import DEFAULT_UNIT, Layout, check_unit_name
from k26ops.shell import q
from k26ops.traffic import drain as drain_mod
from k26ops.transport.fleet import Outcome
from k26ops.transport.ssh import HostKeyRefused, Session, Unreachable, connect

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
DEFAULT_TIMEOUT = 900.0
POLL_S = 2.0
# While a host reboots, paramiko's transport thread logs each refused or reset
# connection with a traceback (through logging's last-resort handler, to
# stderr). The wait reports those in its own words; the traceback is noise.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def engine_serving(session: Session, hvars: dict) -> str | None:
    """The engine's unit name when it is active on the host, else None."""
    unit = check_unit_name(str(hvars.get("engine_unit") or DEFAULT_UNIT))
    res = session.run(f"systemctl is-active {q(unit)}")
    return unit if res.stdout.strip() in ("active", "activating", "reloading") else None


def refuse_serving(unit: str | None, allow: bool) -> None:
    if unit and not allow:
        raise StepFailed(f"{unit} is serving: not rebooting this host without --allow-reboot")


def reboot_and_wait(
    session: Session,
    *,
    accept_new: bool,
    connect_timeout: float,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[str], None] = lambda m: None,
) -> tuple[Session, str, float]:
    """Reboot, wait (deadline `timeout` s) for SSH with a new boot id and for
    systemd to finish booting. Returns (new session, systemd state, seconds).
    The old session is closed; the caller closes the new one."""
    host = session.host
    before = session.run(BOOT_ID, check=True).stdout.strip()
    progress("rebooting")
    last = "no answer yet"
    try:
        session.run("systemctl --no-block reboot", check=True)
    except Exception as exc:  # noqa: BLE001 - the connection may drop as it goes down
        last = f"reboot command: {exc}"  # the boot id says whether it happened
    session.close()
    t0 = time.monotonic()
    while True:
        check_interrupted("the wait for a reboot")
        elapsed = time.monotonic() - t0
        if elapsed > timeout:
            raise StepFailed(f"did not come back within {timeout:.0f}s after its reboot ({last})")
        progress(f"rebooting: waiting for SSH ({elapsed:.0f}s of {timeout:.0f}s)")
        try:
            new = connect(
                host, accept_new=accept_new, connect_timeout=max(1.0, min(connect_timeout, timeout - elapsed))
            )
        except HostKeyRefused:
            raise
        except Unreachable as exc:
            last = str(exc)
            time.sleep(POLL_S)
            continue
        try:
            now = new.run(BOOT_ID, timeout=30).stdout.strip()
        except Exception as exc:  # went down under us: try again
            new.close()
            last = str(exc) or type(exc).__name__
            time.sleep(POLL_S)
            continue
        if not now or now == before:
            new.close()
            last = "still up: the reboot has not begun"
            time.sleep(POLL_S)
            continue
        progress(f"back after {time.monotonic() - t0:.0f}s: waiting for systemd to finish booting")
        left = max(10.0, timeout - (time.monotonic() - t0))
        state = new.run(f"timeout {int(left)} systemctl is-system-running --wait", timeout=left + 10)
        return new, state.stdout.strip() or "unknown", time.monotonic() - t0


def take_lock(session: Session, purpose: str):
    """The host lock (as a deploy takes it): a host another k26ops run is
    changing is never rebooted under it. The lock dies with the reboot; the
    caller takes it again on the new session and releases it cleanly, so no
    stale owner record is left behind."""
    layout = Layout.of(session.host.vars)
    root = layout.root
    st = ownership.state(session, root, "root")
    why = ownership.refusal(root, "root", st)
    if why:
        raise StepFailed(why)
    lock = HostLock(session, layout.state_dir, purpose)
    lock.acquire()
    if st["state"] != "owned":
        ownership.claim(session, root)
    return lock


def failed_units(session: Session) -> list[str]:
    res = session.run("systemctl --failed --plain --no-legend --no-pager")
    return [line.split()[0] for line in res.stdout.splitlines() if line.split()]


def same_host(before: dict, after: dict) -> list[str]:
    """What a plain reboot must not change: GPU count and driver version."""
    problems = []
    gb, ga = (before.get("gpus") or {}).get("count"), (after.get("gpus") or {}).get("count")
    if gb is not None and ga != gb:
        problems.append(f"{ga if ga is not None else 'no'} GPUs after the reboot, {gb} before")
    db, da = driver_version(before)[0], driver_version(after)[0]
    if db and da != db:
        problems.append(f"driver {da or 'none'} after the reboot, {db} before")
    return problems


def reboot_verified(
    session: Session,
    *,
    purpose: str,
    accept_new: bool,
    connect_timeout: float,
    timeout: float,
    progress,
    check,
    names=None,
) -> tuple[dict, float]:
    """Lock, reboot, wait, lock again (released cleanly), re-gather facts and
    run `check(after) -> [problems]`; StepFailed when the host came back unhealthy.
    Returns (the facts after, seconds it took)."""
    unit = engine_serving(session, session.host.vars)
    drain = drain_mod.for_session(session, progress) if unit else None
    if drain:  # out of rotation and drained before the reboot stops the engine
        drain.take_out()
    try:
        take_lock(session, purpose)  # let go by the reboot itself
    except BaseException:
        if drain:
            drain.put_back()  # nothing was stopped
        raise
    failed_before = set(failed_units(session))
    new, state, secs = reboot_and_wait(
        session, accept_new=accept_new, connect_timeout=connect_timeout, timeout=timeout, progress=progress
    )
    try:
        take_lock(new, purpose).release()
        progress("re-gathering facts")
        after = facts_mod.gather(new, names)
        problems = check(after)
        if state != "running":
            # degraded by the same units as before the reboot: not this reboot's doing
            newly = [u for u in failed_units(new) if u not in failed_before]
            if state != "degraded" or newly:
                problems.append(f"systemd is {state} (failed: {', '.join(newly) or 'none'})")
        if drain and not problems:  # the engine starts at boot: back into rotation once it answers
            drain_mod.back_when_healthy(drain, new, unit, float(session.host.vars.get("health_timeout") or 1800))
            after["traffic"] = drain.record
    finally:
        new.close()
    if problems:
        raise StepFailed("came back unhealthy after its reboot: " + "; ".join(problems))
    return after, secs


def reboot_work(
    *, accept_new: bool, connect_timeout: float, check: bool, allow_reboot: bool, timeout: float = DEFAULT_TIMEOUT
):
    """Rollout work for `k26ops reboot`: refuse a serving engine, reboot, wait,
    re-gather facts and check the host came back as it was."""
    names = ["gpus", "nvidia_smi", "nvidia_module", "nvidia_services", "nvswitch"]

    def work(session: Session, progress):
        progress("gathering facts")
        before = facts_mod.gather(session, names)
        unit = engine_serving(session, session.host.vars)
        if check:
            would = f"would refuse: {unit} is serving (--allow-reboot)" if unit and not allow_reboot else "would reboot"
            return Outcome(changed=False, reboot=would)
        refuse_serving(unit, allow_reboot)
        after, secs = reboot_verified(
            session,
            purpose="reboot",
            accept_new=accept_new,
            connect_timeout=connect_timeout,
            timeout=timeout,
            progress=progress,
            check=lambda after: same_host(before, after),
            names=names,
        )
        out = Outcome(changed=True, reboot=f"rebooted, back in {secs:.0f}s")
        if after.get("traffic"):
            out["traffic"] = after["traffic"]
        return out

    return work
