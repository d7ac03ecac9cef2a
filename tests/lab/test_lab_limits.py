"""`lab up` checks the machine's kernel limits for N hosts before booting any,
raises them as root for its run (and `lab down` puts them back), or refuses
in one line naming the limit and the sysctl command."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from k26ops.errors import UserError
from k26ops.lab import limits
from k26ops.lab.machines import Lab, own_cgroups
from labtools.ports import free_port_block

INOTIFY = "fs.inotify.max_user_instances"
BOOTED = {INOTIFY: 0, "fs.inotify.max_user_watches": 0, "kernel.pid_max": 0, "kernel.threads-max": 0, "fs.file-max": 0}
DEBIAN_DEFAULTS = {
    INOTIFY: 128,
    "fs.inotify.max_user_watches": 192530,
    "kernel.pid_max": 32768,
    "kernel.threads-max": 192726,
    "fs.file-max": 2466126,
    "user.max_mnt_namespaces": 96363,
    "user.max_pid_namespaces": 96363,
}


def test_needed_names_inotify_instances_for_a_64_host_lab_on_debian_defaults():
    short = limits.needed(64, DEBIAN_DEFAULTS, BOOTED)
    assert [s.limit.sysctl for s in short] == [INOTIFY]
    s = short[0]
    assert s.have == 128 and s.need == 32 + 64 * 12
    line = s.line(64)
    assert "fs.inotify.max_user_instances is 128" in line and "64 hosts" in line
    assert f"sysctl -w fs.inotify.max_user_instances={s.need}" in line and "\n" not in line


def test_needed_counts_what_other_labs_already_use():
    assert limits.needed(8, DEBIAN_DEFAULTS, BOOTED) == []  # 32 + 8 * 12 = 128 fits
    busy = {**BOOTED, INOTIFY: 40}  # another lab's hosts hold root's instances too
    (s,) = limits.needed(8, DEBIAN_DEFAULTS, busy)
    assert s.need == 40 + 32 + 8 * 12


def test_needed_skips_limits_this_kernel_lacks_and_checks_each_limit():
    assert limits.needed(64, {}, BOOTED) == []
    low = {**DEBIAN_DEFAULTS, INOTIFY: 100000, "kernel.pid_max": 4200, "user.max_pid_namespaces": 10}
    names = {s.limit.sysctl for s in limits.needed(64, low, BOOTED)}
    assert names == {"kernel.pid_max", "user.max_pid_namespaces"}


def test_in_use_sees_this_machines_inotify_instances():
    import os

    fd = os.open("/proc/self", os.O_RDONLY)  # any fd: in_use must count inotify ones only
    try:
        use = limits.in_use()
    finally:
        os.close(fd)
    assert use["kernel.pid_max"] > 0 and use["fs.file-max"] > 0
    assert use[INOTIFY] >= 0


def _sys_copy(value: int) -> Path:
    """A copy of this machine's limits (a /proc/sys tree) with inotify instances set
    to `value`: the lab reads and raises it as it would /proc/sys, and no other
    lab on this machine is touched."""
    root = Path(tempfile.mkdtemp(prefix="k26ops-test-procsys-", dir="/var/tmp"))
    for lim in limits.LIMITS:
        src = Path("/proc/sys") / lim.path
        if src.exists():
            (root / lim.path).parent.mkdir(parents=True, exist_ok=True)
            (root / lim.path).write_text(src.read_text())
    (root / limits.LIMITS[0].path).write_text(f"{value}\n")
    return root


def test_lab_refuses_up_front_or_raises_for_its_run_and_puts_back():
    lab_dir = Path(tempfile.mkdtemp(prefix="k26ops-test-limits-", dir="/var/tmp"))
    now = limits.in_use()  # read once: other workers' labs boot and stop meanwhile (a full run: 60, then 49)
    use = now[INOTIFY]
    old = use + 20  # what root uses now fits, one more host (12 + 32 floor) does not
    proc_sys = _sys_copy(old)
    inotify_file = proc_sys / limits.LIMITS[0].path
    lab = Lab(lab_dir, proc_sys=proc_sys)
    port = free_port_block(1)
    try:
        with pytest.raises(UserError) as exc:
            lab.up(1, port, log=lambda m: None, raise_limits=False, limits_use=now)
        msg = str(exc.value)
        assert f"fs.inotify.max_user_instances is {old}" in msg and "sysctl -w fs.inotify.max_user_instances=" in msg
        assert lab.hosts() == [] and not lab.state_file.exists()  # refused before any host booted
        assert inotify_file.read_text().strip() == str(old)

        said = []
        hosts = lab.up(1, port, log=said.append, limits_use=now)
        assert len(hosts) == 1 and lab.status()[0]["ssh"]
        raised = int(inotify_file.read_text())
        assert raised >= use + 32 + 12
        assert f"raised fs.inotify.max_user_instances from {old} to {raised}" in "\n".join(said)
        assert lab.raised_limits() == {INOTIFY: [old, raised]}
        # each host in a cgroup of its own (hosts sharing nspawn's `payload` raced on
        # /system.slice/X.service and came up degraded at 64 hosts), removed by down
        cgroups = own_cgroups(lab._machine("lab1"))
        assert cgroups and all((c / "payload").is_dir() for c in cgroups)
        said.clear()
        lab.down(log=said.append)
        assert inotify_file.read_text().strip() == str(old), said
        assert f"put fs.inotify.max_user_instances back from {raised} to {old}" in said
        assert not any(c.exists() for c in cgroups)
    finally:
        lab.down(log=lambda m: None)
        shutil.rmtree(lab_dir, ignore_errors=True)
        shutil.rmtree(proc_sys, ignore_errors=True)


def test_two_labs_put_a_limit_back_whichever_goes_down_first():
    """Lab A raises inotify instances, lab B (more hosts) raises it again; A goes
    down first. The limit stays while B runs, and B's down puts back the machine's
    own value (it used to stay at A's raise for good)."""
    use = limits.in_use()  # read once: other tests boot hosts meanwhile (CI failed on a live re-read)
    old = use[INOTIFY] + 40  # 1 host (use + 32 + 12) needs a raise; 3 hosts need more again
    for first, second in (("A", "B"), ("B", "A")):
        proc_sys = _sys_copy(old)
        inotify = proc_sys / limits.LIMITS[0].path
        try:
            said = []
            a = limits.ensure(1, may_raise=True, proc_sys=proc_sys, log=said.append, lab="A", use=use)
            b = limits.ensure(3, may_raise=True, proc_sys=proc_sys, log=said.append, lab="B", use=use)
            assert a[INOTIFY][0] == old and b[INOTIFY][0] == a[INOTIFY][1] < b[INOTIFY][1], (a, b)
            limits.release(first, proc_sys, log=said.append)
            assert int(inotify.read_text()) == b[INOTIFY][1], said  # the other lab still runs on it
            limits.release(second, proc_sys, log=said.append)
            assert int(inotify.read_text()) == old, said
            assert f"put {INOTIFY} back from {b[INOTIFY][1]} to {old}" in said
            assert json.loads(limits.registry_path(proc_sys).read_text()) == {}
        finally:
            shutil.rmtree(proc_sys, ignore_errors=True)


def test_a_base_port_whose_engine_ports_overflow_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"--base-port 46000: .* pick a base port up to 45534"):
        Lab(tmp_path).up(2, 46000, log=lambda m: None)


def test_cli_no_raise_limits_refuses_in_one_line_naming_the_sysctl(tmp_path):
    from labtools.invoke import cli

    if not limits.needed(64, limits.read(), limits.in_use()):
        pytest.skip("this machine's limits already fit 64 more lab hosts (raised by hand?)")
    proc = cli(
        "lab",
        "up",
        "--hosts",
        "64",
        "--no-raise-limits",
        "--dir",
        str(tmp_path / "lab"),
        "--base-port",
        str(free_port_block(64)),
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith("k26ops: error: fs.inotify.max_user_instances is ")
    assert "a lab of 64 hosts needs" in line and "sysctl -w fs.inotify.max_user_instances=" in line
    assert not (tmp_path / "lab" / "lab.json").exists()
