"""The machine's kernel limits that a lab of N hosts needs, checked before any host boots.

Why: every lab host is a container whose systemd takes inotify instances from
root's per-user budget (fs.inotify.max_user_instances, 128 by default). With
too few, a host dies mid-boot with systemd's own message ("Attempted to remove
disk file system ..."), which names nothing. So `lab up` computes what N hosts
need on top of what root already uses (other labs share the budget), and as
root raises the short ones for its run, or refuses in one line naming the
limit and the sysctl command.

Per-host figures: measured on a booted lab host (Debian 12, systemd 252): 8
inotify instances, about 30 watches, 8 processes; a deployed host adds the
engine stand-in and its agent. They are taken with headroom for the boot's
transients and the services a deploy starts.

Several labs share one machine: the first lab that raises a limit records the
machine's own value, every lab up on a raised value is recorded as its holder
(in REGISTRY, under a file lock), and the value goes back when the last holder
goes down, whatever order the labs go down in (before, lab A down then lab B
down left the limit at A's raise for good).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from k26ops.errors import UserError

PROC_SYS = Path("/proc/sys")
REGISTRY = Path("/run/k26ops/lab-limits.json")  # {sysctl: {"original", "value", "labs"}}; machine-wide
MEM_PER_HOST = 64 << 20  # a deployed lab host: ~35 MB booted, the engine stand-in and agent on top


@dataclass(frozen=True)
class Limit:
    sysctl: str  # dotted name (fs.inotify.max_user_instances)
    per_host: int  # what one host needs, with headroom
    floor: int  # what this machine itself needs besides the lab (what root already uses is added)
    what: str

    @property
    def path(self) -> str:
        return self.sysctl.replace(".", "/")


LIMITS = (
    Limit("fs.inotify.max_user_instances", 12, 32, "inotify instances of root (each host's systemd takes ~8)"),
    Limit("fs.inotify.max_user_watches", 1024, 8192, "inotify watches of root"),
    Limit("kernel.pid_max", 256, 4096, "process ids (each host's systemd, sshd, shells, engine threads)"),
    Limit("kernel.threads-max", 256, 4096, "threads on the machine"),
    Limit("fs.file-max", 4096, 65536, "open files on the machine"),
    Limit("user.max_mnt_namespaces", 8, 64, "mount namespaces (unshare + nspawn per host)"),
    Limit("user.max_pid_namespaces", 4, 64, "pid namespaces (one per host)"),
)


@dataclass(frozen=True)
class Shortfall:
    limit: Limit
    have: int
    need: int

    def line(self, count: int) -> str:
        return (
            f"{self.limit.sysctl} is {self.have}, a lab of {count} hosts needs {self.need} "
            f"({self.limit.what}): raise it with `sysctl -w {self.limit.sysctl}={self.need}` as root"
        )


def needed(count: int, current: dict[str, int], in_use: dict[str, int]) -> list[Shortfall]:
    """Pure: each limit that `current` (the sysctl values) leaves too low for
    `count` more hosts on top of `in_use` (what root/the machine uses now)."""
    short = []
    for lim in LIMITS:
        have = current.get(lim.sysctl)
        if have is None:  # not on this kernel: nothing to check
            continue
        need = in_use.get(lim.sysctl, 0) + lim.floor + count * lim.per_host
        if have < need:
            short.append(Shortfall(lim, have, need))
    return short


def read(proc_sys: Path = PROC_SYS) -> dict[str, int]:
    out = {}
    for lim in LIMITS:
        try:
            out[lim.sysctl] = int((proc_sys / lim.path).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def in_use(proc: Path = Path("/proc")) -> dict[str, int]:
    """What is used now: root's inotify instances and watches (the per-user
    budget every lab on this machine shares), processes (pid and thread counts
    are bounded by pid_max/threads-max), open files (fs/file-nr)."""
    instances = watches = tasks = 0
    for p in proc.iterdir():
        if not p.name.isdigit():
            continue
        try:
            tasks += len(os.listdir(p / "task"))
            root = (p / "status").read_text().split("\nUid:", 1)[1].split()[0] == "0"
            fds = os.listdir(p / "fd") if root else []
        except (OSError, IndexError):
            continue
        for fd in fds:
            try:
                if os.readlink(p / "fd" / fd) != "anon_inode:inotify":
                    continue
                instances += 1
                watches += sum(1 for line in open(p / "fdinfo" / fd) if line.startswith("inotify wd:"))
            except OSError:
                continue
    try:
        files = int((proc / "sys/fs/file-nr").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        files = 0
    return {
        "fs.inotify.max_user_instances": instances,
        "fs.inotify.max_user_watches": watches,
        "kernel.pid_max": tasks,
        "kernel.threads-max": tasks,
        "fs.file-max": files,
    }


def mem_available(proc: Path = Path("/proc")) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def registry_path(proc_sys: Path) -> Path:
    """Where the labs on these limits record who raised what (a copy of /proc/sys: beside it)."""
    return REGISTRY if Path(proc_sys) == PROC_SYS else Path(proc_sys) / ".k26ops-lab-limits.json"


@contextlib.contextmanager
def _registry(proc_sys: Path):
    """The registry, locked against the other labs' `up` and `down`; written back on exit."""
    path = registry_path(proc_sys)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            reg = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            reg = {}
        yield reg
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(reg, indent=1))
        os.replace(tmp, path)


def _now(proc_sys: Path, name: str) -> int | None:
    try:
        return int((Path(proc_sys) / name.replace(".", "/")).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def ensure(
    count: int,
    *,
    may_raise: bool,
    proc_sys: Path = PROC_SYS,
    log=print,
    lab: str = "",
    use: dict[str, int] | None = None,
) -> dict[str, list[int]]:
    """Check the limits for `count` hosts; raise the short ones when allowed
    (root, and /proc/sys writable), else refuse with one line. Returns what
    was changed: {sysctl: [old, new]}. `lab` (its directory) becomes a holder
    of every limit that labs raised and that it now runs on; `release(lab)`
    puts them back once no lab holds them. `use`: what the machine's processes
    hold now (read live when not given)."""
    avail = mem_available()
    if avail is not None and avail < count * MEM_PER_HOST:
        raise UserError(
            f"a lab of {count} hosts needs about {count * MEM_PER_HOST >> 20} MB of memory, "
            f"{avail >> 20} MB is available: boot fewer hosts (--hosts)"
        )
    short = needed(count, read(proc_sys), in_use() if use is None else use)
    if short and not may_raise:
        raise UserError(short[0].line(count))
    changed: dict[str, list[int]] = {}
    if not short and not registry_path(proc_sys).exists():
        return changed  # nothing raised, by this lab or any other
    with _registry(proc_sys) as reg:
        for s in short:
            try:
                (proc_sys / s.limit.path).write_text(f"{s.need}\n")
            except OSError as exc:
                _restore(reg, lab, proc_sys, lambda m: None)
                raise UserError(f"{s.line(count)} (could not raise it here: {exc.strerror})") from None
            entry = reg.get(s.limit.sysctl)
            if not entry or entry["value"] != s.have:  # not a lab's raise (any more): this is the machine's value
                entry = reg[s.limit.sysctl] = {"original": s.have, "labs": []}
            entry["value"] = s.need
            changed[s.limit.sysctl] = [s.have, s.need]
            log(
                f"raised {s.limit.sysctl} from {s.have} to {s.need} for this lab of {count} hosts "
                "(`k26ops lab down` puts it back)"
            )
        if lab:
            for name, entry in list(reg.items()):
                if _now(proc_sys, name) == entry["value"] and lab not in entry["labs"]:
                    entry["labs"].append(lab)
    return changed


def release(lab: str, proc_sys: Path = PROC_SYS, log=print, raised: dict | None = None) -> None:
    """`lab` is going down: each limit it holds goes back to the machine's value
    when no other lab holds it. `raised`: the lab's own record, for a lab booted
    before the registry (put back as before)."""
    if not registry_path(proc_sys).exists():
        put_back(raised or {}, proc_sys, log=log)
        return
    with _registry(proc_sys) as reg:
        if not any(lab in e["labs"] for e in reg.values()):
            put_back(raised or {}, proc_sys, log=log)
            return
        _restore(reg, lab, proc_sys, log)


def _restore(reg: dict, lab: str, proc_sys: Path, log) -> None:
    """Drop `lab` from the registry's holders; put back what no lab holds any more."""
    for name, entry in list(reg.items()):
        if lab not in entry["labs"]:
            continue
        entry["labs"].remove(lab)
        if entry["labs"]:
            log(f"kept {name} at {entry['value']}: {len(entry['labs'])} other lab(s) still run on it")
            continue
        del reg[name]
        put_back({name: [entry["original"], entry["value"]]}, proc_sys, log=log)


def put_back(changed: dict[str, list[int]], proc_sys: Path = PROC_SYS, log=print) -> None:
    """Restore what `ensure` raised, where the value is still ours and what is
    in use now fits under the old value (another lab may have booted on it)."""
    use = in_use() if changed else {}
    for name, (old, new) in changed.items():
        lim = next((x for x in LIMITS if x.sysctl == name), None)
        path = proc_sys / name.replace(".", "/")
        now = _now(proc_sys, name)
        if now is None:
            continue
        if now != new:
            log(f"left {name} at {now}: changed by someone else since the lab raised it")
            continue
        if lim and use.get(name, 0) > old:
            log(f"left {name} at {now}: {use[name]} in use now (other labs) would not fit under {old}")
            continue
        try:
            path.write_text(f"{old}\n")
            log(f"put {name} back from {new} to {old}")
        except OSError as exc:
            log(f"could not put {name} back to {old}: {exc.strerror}")
