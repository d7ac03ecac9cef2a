"""Boot, watch and stop the lab's nspawn hosts; record them in the lab dir.

Layout of a lab dir:
  lab.json            the hosts this lab started (name, port, pid, start time)
  id_ed25519[.pub]    the per-lab client key
  known_hosts         each host's real host key, for strict checking
  inventory.yml       the lab's inventory (what k26ops uses by default)
  hosts/NAME/         per-host files bound into the host (sshd drop-in, host key,
                      hostname, hosts) and its console log
  hosts/NAME/root/    the host's root: an overlay of the shared rootfs (upper
                      holds what the host wrote; see overlay_boot), with the
                      cached deployed layer between them for `up(deployed=True)`
  drafter/config.json the lab drafter's config, bound into every host
`lab down --purge` removes exactly these (Lab.purge).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from k26ops.errors import UserError
from k26ops.lab import DEFAULT_BASE_PORT, engine_source_fixture, limits, model_fixture, rootfs
from k26ops.lab import deployed as deployed_layer
from k26ops.layout import DEFAULT_ROOT, DEFAULT_UNIT, UNIT_DIR
from k26ops.shell import q

FIXTURES = Path(__file__).parent / "fixtures"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Lab fixture: where the lab recipe's drafter lives on a lab host, and its config
# (the keys sglang's parse_dflash_draft_config reads; no weights: the engine is the stand-in).
LAB_DRAFTER = "/models/Kimi-K2.6-DFlash"
LAB_SOURCE_URL = "file:///var/lib/k26ops-lab/sglang-0.5.23-ddtree-lab"  # the lab recipe's engine.source.git
DRAFTER_CONFIG = (
    '{"k26ops_lab_fixture": "a DFlash drafter config for the lab; no weights",\n'
    ' "architectures": ["DFlashDraftModel"], "num_hidden_layers": 6,\n'
    ' "dflash_config": {"block_size": 8}}\n'
)
# Lab fixture: the lab model at the lab inventory's model_path: a real small model (the
# recipe's K2.6 config.json, an index and three safetensors shards of random tensors,
# k26ops/lab/model_fixture.py; the engine stand-in reads no weights), the bytes the lab
# recipe's model manifest (playbooks/recipes/lab.model) lists.
LAB_MODEL = "/models/Kimi-K2.6"
LAB_MODEL_FILES = model_fixture.FILES
# Hosts share this machine's network: each engine listens on its own loopback
# port, derived from the host's sshd port so that two labs never clash.
ENGINE_PORT_OFFSET = 20000
# Lab knob: while hosts/NAME/hold-down exists, a host that reboots stays off.
HOLD_DOWN = "hold-down"


@dataclass
class LabHost:
    name: str
    port: int
    pid: int
    started: str  # /proc start time of the nspawn process, to recognise pid reuse
    engine_port: int


def _proc_start(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return None


def _is_ours(h: LabHost) -> bool:
    if _proc_start(h.pid) != h.started:
        return False
    try:
        return b"systemd-nspawn" in Path(f"/proc/{h.pid}/cmdline").read_bytes()
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _banner(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


class Lab:
    def __init__(self, directory: Path, proc_sys: Path = limits.PROC_SYS):
        self.dir = Path(directory)
        self.proc_sys = Path(proc_sys)  # where the kernel limits are read and raised (tests: a copy)

    # -- state ---------------------------------------------------------------
    @property
    def _id(self) -> str:
        """This lab, as the holder of kernel limits that labs raised (limits.release)."""
        return str(self.dir.resolve())

    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    @property
    def inventory_file(self) -> Path:
        return self.dir / "inventory.yml"

    def hosts(self) -> list[LabHost]:
        if not self.state_file.exists():
            return []
        data = json.loads(self.state_file.read_text())
        return [LabHost(**h) for h in data.get("hosts", [])]

    def _save(self, hosts: list[LabHost], image: Path, raised: dict | None = None, layer: Path | None = None) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "rootfs": str(image),
                    "deployed_layer": str(layer) if layer else None,
                    "hosts": [asdict(h) for h in hosts],
                    "raised_limits": raised or {},
                },
                indent=1,
            )
        )
        tmp.replace(self.state_file)

    def raised_limits(self) -> dict:
        """The kernel limits this lab raised: {sysctl: [old, new]}."""
        if not self.state_file.exists():
            return {}
        return json.loads(self.state_file.read_text()).get("raised_limits") or {}

    def status(self) -> list[dict]:
        out = []
        for h in self.hosts():
            alive = _is_ours(h)
            out.append({**asdict(h), "running": alive, "ssh": alive and _banner(h.port)})
        return out

    # -- up ------------------------------------------------------------------
    def up(
        self,
        count: int = 2,
        base_port: int = DEFAULT_BASE_PORT,
        log=print,
        raise_limits: bool = True,
        deployed: bool = False,
        limits_use: dict[str, int] | None = None,
    ) -> list[LabHost]:
        """Boot `count` hosts; with `deployed`, on the cached deployed layer (k26ops/lab/deployed.py:
        the lab recipe already deployed and its engine serving), built first if missing.
        `limits_use`: what the machine's processes hold, for the limits check (read live when not
        given: a test passes one reading, as other labs boot and stop meanwhile)."""
        _preflight()
        existing = self.hosts()
        if existing:
            alive = [h for h in existing if _is_ours(h)]
            if len(alive) == len(existing) and len(existing) == count:
                log(f"lab already up in {self.dir} ({count} hosts); nothing to do")
                return existing
            if len(alive) == len(existing):
                raise UserError(
                    f"lab in {self.dir} is up with {len(existing)} hosts, not {count}: run `k26ops lab down` first"
                )
            raise UserError(
                f"lab in {self.dir} is half-started ({len(alive)} of {len(existing)} hosts "
                "running): run `k26ops lab down` first"
            )
        if any(c in str(self.dir.resolve()) for c in ",:\\"):
            raise UserError(
                f"lab dir {self.dir}: a path with ',', ':' or '\\' cannot hold an overlay root; choose another --dir"
            )
        if count < 1 or count > 64:
            raise UserError(f"--hosts {count}: must be between 1 and 64")
        if base_port < 1024 or base_port + count - 1 + ENGINE_PORT_OFFSET > 65535:
            raise UserError(
                f"--base-port {base_port}: the hosts' ports and their engine ports (+{ENGINE_PORT_OFFSET}) "
                f"must lie in 1024-65535: pick a base port up to {65535 - ENGINE_PORT_OFFSET - count + 1}"
            )
        ports = [base_port + i for i in range(count)]
        for p in ports + [p + ENGINE_PORT_OFFSET for p in ports]:
            if not _port_free(p):
                raise UserError(f"port 127.0.0.1:{p} is in use: stop what listens there or pass --base-port")
        layer = None
        if deployed:  # before this lab raises limits or boots: the build boots a lab of its own
            layer = deployed_layer.ensure(rootfs.ensure(log=log), build_layer, log=log)
        raised = limits.ensure(
            count, may_raise=raise_limits, proc_sys=self.proc_sys, log=log, lab=self._id, use=limits_use
        )
        started: list[LabHost] = []
        try:
            image = rootfs.ensure(log=log)
            self.dir.mkdir(parents=True, exist_ok=True)
            self._client_key()
            known = []
            for i, port in enumerate(ports):
                name = f"lab{i + 1}"
                h, key_line = self._boot(name, port, port + ENGINE_PORT_OFFSET, image, layer)
                started.append(h)
                known.append(key_line)
                self._save(started, image, raised, layer)
            (self.dir / "known_hosts").write_text("".join(known))
            self._wait_ssh(started)
            self.source_url = engine_source_fixture.ensure()[0]
            self._write_inventory(started)
        except BaseException:
            self._stop(started)
            for h in started:
                remove_cgroups(self._machine(h.name))
            self.state_file.unlink(missing_ok=True)
            limits.release(self._id, self.proc_sys, log=log, raised=raised)
            raise
        return started

    def _client_key(self) -> None:
        key = self.dir / "id_ed25519"
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "k26ops-lab", "-f", str(key)], check=True
            )
        auth = self.dir / "authorized_keys"
        auth.write_text((self.dir / "id_ed25519.pub").read_text())
        auth.chmod(0o600)

    def _boot(
        self, name: str, port: int, engine_port: int, image: Path, layer: Path | None = None
    ) -> tuple[LabHost, str]:
        hdir = self.dir / "hosts" / name
        if hdir.exists():
            shutil.rmtree(hdir)
        (hdir / "ssh").mkdir(parents=True)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"{name}-hostkey",
                "-f",
                str(hdir / "ssh/ssh_host_ed25519_key"),
            ],
            check=True,
        )
        (hdir / "sshd.conf").write_text(
            f"# k26ops lab host {name}\nPort {port}\nListenAddress 127.0.0.1\n"
            "HostKey /etc/ssh/k26ops/ssh_host_ed25519_key\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nMaxSessions 100\nMaxStartups 100:30:200\nUseDNS no\n"
        )
        (hdir / "hostname").write_text(name + "\n")
        # As on a real install: the host resolves its own name (sudo warns on
        # every command otherwise: "unable to resolve host").
        (hdir / "hosts").write_text(
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        pub = (hdir / "ssh/ssh_host_ed25519_key.pub").read_text().split()
        key_line = f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n"
        binds = [
            f"--bind-ro={hdir / 'sshd.conf'}:/etc/ssh/sshd_config.d/k26ops-lab.conf",
            f"--bind={hdir / 'ssh'}:/etc/ssh/k26ops",
            f"--bind-ro={hdir / 'hostname'}:/etc/hostname",
            f"--bind-ro={hdir / 'hosts'}:/etc/hosts",
        ]
        # GPU stand-ins: fixtures/, gpufaults.py (nvidia-smi-q.txt: the recorded -q nvidia-smi replays)
        for tool in ("nvidia-smi", "nvidia-smi-q.txt", "journalctl", "nv-fabricmanager"):
            if (FIXTURES / tool).exists():
                binds.append(f"--bind-ro={FIXTURES / tool}:/usr/local/bin/{tool}")
        drafter = self.dir / "drafter"
        if not (drafter / "config.json").exists():  # lab fixture: a drafter's config, no weights
            drafter.mkdir(exist_ok=True)
            (drafter / "config.json").write_text(DRAFTER_CONFIG)
        binds.append(f"--bind-ro={drafter}:{LAB_DRAFTER}")
        binds.append(f"--bind-ro={self._model_fixture()}:{LAB_MODEL}")
        if CA_BUNDLE.exists():
            binds.append(f"--bind-ro={CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt")
        root = hdir / "root"
        for sub in ("upper", "work", "merged"):
            (root / sub).mkdir(parents=True)
        # Each host its own machine id (the rootfs has one, from debootstrap, that every host
        # would share): written into its upper dir before the overlay is mounted.
        (root / "upper" / "etc").mkdir()
        (root / "upper" / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")
        (root / "upper" / "etc" / "machine-id").chmod(0o444)
        # The lab's client key, in the host's own writable authorized_keys (as on a real host,
        # where `k26ops model sync` adds and removes its one-run restricted keys).
        ssh_dir = root / "upper" / "root" / ".ssh"
        ssh_dir.mkdir(parents=True)
        (root / "upper" / "root").chmod(0o700)
        ssh_dir.chmod(0o700)
        shutil.copyfile(self.dir / "authorized_keys", ssh_dir / "authorized_keys")
        (ssh_dir / "authorized_keys").chmod(0o600)
        lower = str(image)
        if layer is not None:  # overlayfs stacks lower dirs, leftmost on top
            deployed_layer.place_host_unit(layer, root / "upper", engine_port)
            lower = f"{layer}:{image}"
        machine = self._machine(name)
        nspawn = [
            "systemd-nspawn",
            "--register=no",
            "--keep-unit",
            "--quiet",
            "-D",
            str(root / "merged"),
            "-b",
            f"--machine={machine}",
            "--console=read-only",
            *binds,
        ]
        cmd = overlay_boot(lower, root, nspawn, own_cgroups(machine), metacopy=layer is not None)
        with open(hdir / "console.log", "wb") as console:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True
            )
        time.sleep(0.05)
        return LabHost(name, port, proc.pid, _proc_start(proc.pid) or "", engine_port), key_line

    def _model_fixture(self) -> Path:
        """The lab model dir (LAB_MODEL_FILES): built once per machine, shared read-only."""
        return model_fixture.ensure()

    def _machine(self, name: str) -> str:
        return f"k26lab-{self.dir.name[-8:]}-{name}".replace("_", "-")

    def _wait_ssh(self, hosts: list[LabHost], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        pending = list(hosts)
        while pending:
            for h in list(pending):
                if not _is_ours(h):
                    log = (self.dir / "hosts" / h.name / "console.log").read_text(errors="replace")
                    tail = " | ".join(log.strip().splitlines()[-3:])
                    raise UserError(f"lab host {h.name} exited while booting: {tail}")
                if _banner(h.port):
                    pending.remove(h)
            if pending and time.monotonic() > deadline:
                raise UserError(
                    f"lab hosts {', '.join(h.name for h in pending)} did not answer ssh within {timeout:.0f}s"
                )
            time.sleep(0.2)

    def _write_inventory(self, hosts: list[LabHost]) -> None:
        inv = {
            "vars": {
                "gpus_per_host": 8,
                "compute_capability": "12.0",
                "recipe": "lab",
                # The lab has no model weights; the engine stand-in needs none.
                "model_path": LAB_MODEL,
                "model_size_gb": 1,
                "disk_margin_gb": 1,
                "release_size_gb": 1,
                # Lab fixture: the engine is the stand-in (k26ops/lab/fixtures/
                # engine_standin.py) installed as this module; never outside the lab.
                "lab": True,
                "launch_module": "k26ops_lab_engine",
                # Lab fixture: the lab recipe's pinned commit, fetched from the
                # local repository (k26ops/lab/engine_source_fixture.py) as from a mirror.
                "engine_source_mirrors": {LAB_SOURCE_URL: self.source_url},
            },
            "hosts": {
                h.name: {
                    "address": "127.0.0.1",
                    "port": h.port,
                    "user": "root",
                    "identity_file": str(self.dir / "id_ed25519"),
                    "known_hosts": str(self.dir / "known_hosts"),
                    "vars": {"engine_port": h.engine_port},
                }
                for h in hosts
            },
            "groups": {"lab": {"hosts": [h.name for h in hosts]}},
        }
        header = "# k26ops lab inventory, written by `k26ops lab up`; hosts are local nspawn containers.\n"
        self.inventory_file.write_text(header + yaml.safe_dump(inv, sort_keys=False))

    # -- down ----------------------------------------------------------------
    def down(self, log=print) -> list[str]:
        hosts = self.hosts()
        raised = self.raised_limits()
        self._stop(hosts)
        for h in hosts:
            remove_cgroups(self._machine(h.name))
        limits.release(self._id, self.proc_sys, log=log, raised=raised)
        self.state_file.unlink(missing_ok=True)
        self.inventory_file.unlink(missing_ok=True)
        return [h.name for h in hosts]

    # Files `up` writes at the top of the lab dir; purge removes these and
    # nothing else (the dir may be one the user chose, holding their own files).
    MADE = (
        "lab.json",
        "lab.tmp",
        "inventory.yml",
        "known_hosts",
        "authorized_keys",
        "id_ed25519",
        "id_ed25519.pub",
        "drafter/config.json",
        *(f"model/{name}" for name in LAB_MODEL_FILES),
    )

    def purge(self) -> tuple[list[str], int]:
        """After `down`: remove what `up` made here (host dirs with their overlay
        upper layers, keys, inventory); the dir itself only if then empty.
        Returns (removed paths, bytes freed)."""
        running = [h.name for h in self.hosts() if _is_ours(h)]
        if running:
            raise UserError(f"lab in {self.dir}: {', '.join(running)} still running; not purged")
        removed, freed = [], 0
        hosts_dir = self.dir / "hosts"
        made = [self.dir / f for f in self.MADE]
        if hosts_dir.is_dir() and not hosts_dir.is_symlink():
            made += [d for d in sorted(hosts_dir.iterdir()) if _is_lab_host_dir(d)]
        for path in made:
            if not path.exists() and not path.is_symlink():
                continue
            if path.is_dir() and not path.is_symlink():
                mounted = [m for m in (path / "root" / "merged", path / "root") if os.path.ismount(m)]
                if mounted:
                    raise UserError(f"lab host dir {path}: {mounted[0]} is still mounted; not purged")
                freed += _size(path)
                shutil.rmtree(path)
            else:
                freed += path.lstat().st_size
                path.unlink()
            removed.append(str(path))
        for d in (self.dir / "drafter", self.dir / "model", hosts_dir, self.dir):  # only when left empty
            try:
                d.rmdir()
                removed.append(str(d))
            except OSError:
                pass
        return removed, freed

    def hold_down(self, name: str, hold: bool = True) -> None:
        """Lab knob: keep host `name` off after its next reboot (hold=False lets it boot)."""
        f = self.dir / "hosts" / name / HOLD_DOWN
        if hold:
            f.touch()
        else:
            f.unlink(missing_ok=True)

    def stop_host(self, name: str) -> None:
        """Stop one host's container (as a crash would: the host disappears)."""
        self._stop([h for h in self.hosts() if h.name == name])
        remove_cgroups(self._machine(name))

    @staticmethod
    def _stop(hosts: list[LabHost], timeout: float = 20.0) -> None:
        """SIGTERM to nspawn (it powers the host off), then SIGKILL to the
        recorded `unshare`, which takes nspawn and every process of the host
        with it (see overlay_boot)."""
        ours = [h for h in hosts if _is_ours(h)]
        for h in ours:
            for pid in _children(h.pid) or [h.pid]:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for h in ours:
            while _is_ours(h) and time.monotonic() < deadline:
                _reap(h.pid)
                time.sleep(0.1)
            if _is_ours(h):
                try:
                    os.kill(h.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                for _ in range(50):
                    _reap(h.pid)
                    if not _is_ours(h):
                        break
                    time.sleep(0.1)


def _is_lab_host_dir(d: Path) -> bool:
    """hosts/NAME as `_boot` made it: its sshd drop-in says so."""
    conf = d / "sshd.conf"
    try:
        return d.is_dir() and not d.is_symlink() and conf.read_text().startswith("# k26ops lab host ")
    except OSError:
        return False


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):  # kernels without CONFIG_PROC_CHILDREN: scan
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(stat.parent.name))
            except (OSError, ValueError, IndexError):
                continue
        return found


CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def own_cgroups(machine: str) -> list[Path]:
    """One cgroup per host, in each hierarchy systemd uses (cgroup v1's
    name=systemd and the unified one on a hybrid machine; the one tree on v2).

    Why: nspawn --keep-unit puts its container in `payload` under its own
    cgroup. Started from the same cgroup, every host shares one `payload`,
    so their systemds create and remove the same /system.slice/X.service
    dirs: at 64 hosts a few units failed to start with 219/CGROUP ("Failed
    to attach to cgroup ... No such file or directory") and hosts came up
    degraded. In a cgroup of its own, each host's tree is its own."""
    hier = [r for r in CGROUP_ROOTS[:2] if (r / "cgroup.procs").exists()]
    if not hier and (CGROUP_ROOTS[2] / "cgroup.controllers").exists():
        hier = [CGROUP_ROOTS[2]]
    return [r / "k26ops-lab" / machine for r in hier]


def remove_cgroups(machine: str) -> None:
    """Remove a stopped host's cgroups, deepest first (an empty cgroup is removed by rmdir)."""
    for top in own_cgroups(machine):
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in dirs + [top]:
            try:
                d.rmdir()
            except OSError:
                pass


def overlay_boot(
    image: Path | str, root: Path, nspawn: list[str], cgroups: list[Path] = (), metacopy: bool = False
) -> list[str]:
    """The command that boots one host on a copy-on-write view of the shared rootfs.

    Why not `nspawn --ephemeral`: off btrfs it copies the whole rootfs (about
    760 MB) per host, and a host killed before it shuts down leaves its copy
    behind for good. Here the overlay is mounted in a private mount namespace
    and the host's writes live in root/upper inside the lab dir (gone with it).

    Why a PID namespace too: a SIGKILLed nspawn leaves its container running
    (systemd, sshd, the engine, still on their ports, reparented to init).
    With `--pid --fork --kill-child`, nspawn is PID 1 of its own namespace,
    so when it or the recorded `unshare` dies, the kernel kills everything in
    it, the host included, and the overlay mount goes with the last process.
    `unshare` ignores SIGTERM while it waits, so a clean stop signals the
    shell below it, which passes it on to nspawn.
    `cgroups`: the shell (and so nspawn) starts in these (see own_cgroups).
    `image` may be several lower dirs, `top:...:rootfs` (the deployed layer, deployed.py).
    `metacopy` (hosts on the deployed layer): a hard link to a lower file copies up
    its metadata only, not its data. A release build links every file of the
    layer's uv store (~6000 files, 90 MB) into its venv; without it each host
    copied the whole store up at its first new release (30 s under load, for
    nothing the host changes). Every layer is k26ops' own (the kernel's caveat
    is for untrusted lower dirs); the layer's builder boots bare, so no layer
    holds a metacopy entry.

    Why a loop: `systemctl reboot` inside a host makes nspawn exit with status
    133 (its "reboot" code; systemd-nspawn@.service restarts on it). Like a
    machine's firmware, the loop boots the host again on the same overlay, so
    a lab host really reboots: its systemd, sshd and units start afresh. Any
    other exit, or SIGTERM from `lab down`, ends it. While the lab's
    hold-down file exists (`Lab.hold_down`, a lab knob) the host stays off
    after a reboot, as a host that does not come back would. /proc is mounted
    afresh for the PID namespace: a second nspawn, no longer its PID 1, finds
    its container's init by pid in /proc ("Failed to get container cgroup
    path: No such process" with the outer namespace's /proc).
    """
    join = "".join(f"mkdir -p {q(str(c))} && echo $$ > {q(str(c / 'cgroup.procs'))} && " for c in cgroups)
    meta = ",metacopy=on,redirect_dir=on" if metacopy else ""
    script = join + (
        f'mount -t overlay k26ops-lab -o "lowerdir=$1,upperdir=$2,workdir=$3{meta}" "$4" && shift 4 || exit 1; '
        "mount -t proc proc /proc || exit 1; hold=\"$1\"; shift; stop=0; trap 'stop=1; kill -TERM $c 2>/dev/null' TERM INT HUP; "
        'while :; do "$@" & c=$!; rc=0; wait $c || rc=$?; '
        "while kill -0 $c 2>/dev/null; do rc=0; wait $c || rc=$?; done; "
        '[ "$stop" = 0 ] && [ "$rc" = 133 ] || exit "$rc"; '
        'echo "k26ops lab: the host rebooted; booting it again" >&2; '
        'while [ -e "$hold" ] && [ "$stop" = 0 ]; do sleep 0.5; done; '
        '[ "$stop" = 0 ] || exit 0; done'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "--",
        "sh",
        "-c",
        script,
        "k26ops-lab-boot",
        str(image),
        str(root / "upper"),
        str(root / "work"),
        str(root / "merged"),
        str(root.parent / HOLD_DOWN),
        *nspawn,
    ]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _preflight() -> None:
    if os.geteuid() != 0:
        raise UserError("the lab needs root (systemd-nspawn boots containers): run as root")
    if not shutil.which("systemd-nspawn"):
        raise UserError("systemd-nspawn is missing: apt-get install systemd-container")
    if not shutil.which("debootstrap"):
        raise UserError("debootstrap is missing: apt-get install debootstrap")
    if not shutil.which("unshare"):
        raise UserError("unshare is missing: apt-get install util-linux")
    if not shutil.which("ssh-keygen"):
        raise UserError("ssh-keygen is missing: apt-get install openssh-client")


def build_layer(dest: Path, log) -> dict:
    """Boot a 1-host lab on the bare rootfs, deploy the lab recipe to it with the
    real CLI (`k26ops deploy`, as a user would), power it off, and move what
    deployed_layer.KEEP names from its upper dir into `dest`. Returns the layer's META."""
    log("building the deployed lab layer: one lab host, one first deploy (once per release and k26ops version)")
    work = Path(tempfile.mkdtemp(prefix="k26ops-layer-", dir="/var/tmp"))
    lab = Lab(work)
    try:
        port = next(
            p
            for p in (random.randrange(40000, 45000) for _ in range(200))
            if _port_free(p) and _port_free(p + ENGINE_PORT_OFFSET)
        )
        lab.up(1, port, log=log)
        pkg_parent = Path(__file__).resolve().parent.parent.parent
        env = {k: v for k, v in os.environ.items() if not k.startswith("K26OPS_")}
        env.update(K26OPS_CONFIG=os.devnull, K26OPS_LAB_DIR=str(work))
        proc = subprocess.run(
            [sys.executable, "-m", "k26ops", "-i", str(lab.inventory_file), "--json", "deploy"],
            capture_output=True,
            text=True,
            env=env,
            cwd=pkg_parent,
            timeout=1800,
        )
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:])
            raise UserError(f"building the deployed lab layer: the deploy failed (exit {proc.returncode}): {tail}")
        lab.down(log=log)
        upper = work / "hosts" / "lab1" / "root" / "upper"
        for rel in deployed_layer.KEEP:
            src = upper / rel
            if src.exists() or src.is_symlink():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dest / rel)  # same filesystem: modes, owners and xattrs kept
        for rel in deployed_layer.DROP:
            p = dest / DEFAULT_ROOT.lstrip("/") / rel
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        if not (dest / deployed_layer.UNIT_PATH).is_file():
            raise UserError(f"building the deployed lab layer: the deploy wrote no {UNIT_DIR}/{DEFAULT_UNIT}")
        return {"engine_port": port + ENGINE_PORT_OFFSET, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    finally:
        lab.down(log=lambda m: None)
        shutil.rmtree(work, ignore_errors=True)
