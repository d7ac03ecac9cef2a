"""The driver step: the pinned NVIDIA driver branch with the open kernel
modules, nvidia-persistenced, and nvidia-fabricmanager of the same version on
NVSwitch hosts. Run by `k26ops provision` (playbooks/provision.yml), not by
`deploy`: a driver change needs a reboot, and reboots roll over the fleet in
canary batches (k26ops/host/reboot.py), which a deploy never does.

Idempotent: a host whose running driver is on the branch, with open (or not
proprietary) modules, persistence on and, on NVSwitch hosts, the fabric
manager running, changes nothing. `--check` lists the repository, pin,
packages (from `apt-get install --simulate` where the source is configured),
services and the reboot. A lab host plans only: a container cannot load
kernel modules, so applying is refused there (no fake install).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from k26ops import facts as facts_mod
from k26ops.errors import UserError
from k26ops.host.preflight import driver_version
from k26ops.host.reboot import engine_serving
from k26ops.hostvars import Var, declare
from k26ops.runstate import HostState
from k26ops.shell import q
from k26ops.steps import Change, HostContext, Step, StepFailed, text_diff, tied_to_channel
from k26ops.steps import driver_plan as dp

DEFAULT_BRANCH = 580  # CUDA 13.x needs >= 580 (CUDA minor version compatibility table)
FM_UNIT = "nvidia-fabricmanager.service"
PD_UNIT = "nvidia-persistenced.service"
declare(
    __name__,
    "the driver layer (k26ops provision)",
    Var(
        "nvidia_driver_branch",
        "int",
        DEFAULT_BRANCH,
        "NVIDIA driver branch provision installs and holds (>= 580: CUDA 13)",
    ),
    Var(
        "nvidia_driver_source",
        "distro|nvidia",
        None,
        "where the driver packages come from: the distribution or NVIDIA's CUDA apt repository",
        "distro on Ubuntu; nvidia on Debian",
    ),
    Var(
        "nvidia_fabricmanager",
        "auto|bool",
        "auto",
        "install and run nvidia-fabricmanager of the driver's version",
        "auto (when NVSwitches are found)",
    ),
)


def want(hvars: dict, params: dict) -> dict:
    """Branch, source and fabric-manager choice from params / host vars (raises ValueError on bad ones)."""
    branch = params.get("branch", hvars.get("nvidia_driver_branch", DEFAULT_BRANCH))
    if isinstance(branch, bool) or not str(branch).isdigit() or int(branch) < DEFAULT_BRANCH:
        raise ValueError(
            f"nvidia_driver_branch {branch!r}: a driver branch number >= {DEFAULT_BRANCH} (CUDA 13 needs 580 or newer)"
        )
    source = params.get("source", hvars.get("nvidia_driver_source"))
    if source not in (None, "distro", "nvidia"):
        raise ValueError(f"nvidia_driver_source {source!r}: distro or nvidia")
    fm = params.get("fabricmanager", hvars.get("nvidia_fabricmanager", "auto"))
    if fm not in ("auto", True, False):
        raise ValueError(f"nvidia_fabricmanager {fm!r}: auto, true or false")
    return {"branch": int(branch), "source": source, "fabricmanager": fm}


def unit_state(facts: dict, unit: str) -> dict:
    return ((facts.get("nvidia_services") or {}).get("units") or {}).get(unit) or {}


def running(u: dict) -> bool:
    return u.get("ActiveState") == "active"


def needs_fabric(facts: dict, fm) -> bool:
    return bool((facts.get("nvswitch") or {}).get("present")) if fm == "auto" else bool(fm)


def verify(facts: dict, w: dict, gpus_expected=None) -> list[str]:
    """What must hold on a provisioned host (after its reboot): [] when healthy."""
    problems = []
    drv, major = driver_version(facts)
    if major != w["branch"]:
        problems.append(f"nvidia-smi reports driver {drv or 'none'}, want branch {w['branch']}")
    count = (facts.get("gpus") or {}).get("count")
    if gpus_expected is not None and count != int(gpus_expected):
        problems.append(f"{count if count is not None else 'no'} GPUs, want {gpus_expected}")
    if (facts.get("nvidia_module") or {}).get("flavour") == "proprietary":
        problems.append("the proprietary kernel modules are loaded; Blackwell needs the open ones")
    if needs_fabric(facts, w["fabricmanager"]) and not running(unit_state(facts, FM_UNIT)):
        problems.append(f"{FM_UNIT} is {unit_state(facts, FM_UNIT).get('ActiveState', 'missing')}")
    return problems


@dataclass
class DriverPlan(HostState):
    """What the driver step's plan found to do on this host; its apply does exactly that."""

    branch: int = 0
    source: str | None = None  # distro or nvidia
    fabric: bool = False  # an NVSwitch host: the fabric manager too
    running: str | None = None  # the driver version nvidia-smi reports
    packages: list[str] = field(default_factory=list)
    repo: str | None = None  # NVIDIA's apt repository, when that is the source
    services: list[str] = field(default_factory=list)  # units to enable (and start)
    reboot: str | None = None  # why the host must reboot, if it must


class Driver(Step):
    name = "driver"

    def before_hosts(self, hosts) -> None:
        for h in hosts:
            try:
                want(h.vars, self.params)
            except ValueError as exc:
                raise UserError(f"host {h.name}: {exc}") from None

    def plan(self, ctx: HostContext) -> list[Change]:
        w = want(ctx.vars, self.params)
        try:
            dist = dp.distribution(ctx.facts.get("os_release") or {})
        except dp.PlanError as exc:
            raise StepFailed(str(exc)) from None
        source = w["source"] or dp.default_source(dist)
        fabric = needs_fabric(ctx.facts, w["fabricmanager"])
        drv, major = driver_version(ctx.facts)
        mod = ctx.facts.get("nvidia_module") or {}
        on_branch = major == w["branch"] and mod.get("flavour") != "proprietary"
        info = DriverPlan(branch=w["branch"], source=source, fabric=fabric, running=drv).put(ctx)
        changes: list[Change] = []
        reboot = None
        if not on_branch:
            changes += self._package_plan(ctx, dist, source, w["branch"], fabric, info)
            flavour = f", {mod['flavour']} modules" if mod.get("flavour") else ""
            reboot = f"driver {drv or 'none'}{flavour} -> branch {w['branch']} (open modules)"
        elif mod.get("mismatch"):
            reboot = f"module {mod['loaded_version']} is loaded, {mod['installed_version']} installed"
        elif (ctx.facts.get("reboot_required") or {}).get("required") and any(
            "nvidia" in p for p in (ctx.facts.get("reboot_required") or {}).get("packages", [])
        ):
            reboot = "the NVIDIA packages ask for it (/var/run/reboot-required)"
        if not running(unit_state(ctx.facts, PD_UNIT)) and not (on_branch and self._persistence_on(ctx)):
            info.services.append(PD_UNIT)
            changes.append(Change(f"enable and start {PD_UNIT} (keeps the driver loaded between jobs)"))
        if fabric:
            changes += self._fabric_plan(ctx, on_branch, drv, source, w["branch"], info)
        if reboot:
            info.reboot = ctx.report["reboot"] = reboot
            unit = self._serving(ctx)
            if unit and not ctx.options.allow_reboot:
                if not ctx.check:
                    raise StepFailed(
                        f"{unit} is serving and the driver change needs a reboot ({reboot}): "
                        "nothing changed; pass --allow-reboot"
                    )
                changes.append(Change(f"reboot ({reboot}): REFUSED while {unit} is serving; pass --allow-reboot"))
            else:
                changes.append(Change(f"reboot ({reboot}), one canary batch at a time"))
        ctx.report["driver"] = drv or "none"
        return changes

    # -- planning helpers ------------------------------------------------------------
    def _package_plan(self, ctx, dist, source, branch, fabric, info) -> list[Change]:
        changes = []
        try:
            pkgs = dp.packages(dist, source, branch, fabric)
        except dp.PlanError as exc:
            own = dp.parse_policy(ctx.run("apt-cache policy nvidia-driver nvidia-open-kernel-dkms 2>&1").stdout)
            cand = (own.get("nvidia-driver") or {}).get("candidate") or "none"
            raise StepFailed(f"{exc} (this host's apt sources offer nvidia-driver: {cand})") from None
        info.packages = pkgs
        configured = True
        if source == "nvidia":
            url = dp.repo_url(dist)
            info.repo = url
            res = ctx.run(
                "grep -rlsF "
                + q("developer.download.nvidia.com/compute/cuda/repos")
                + " /etc/apt/sources.list /etc/apt/sources.list.d"
            )
            if not res.stdout.strip():
                configured = False
                changes.append(Change(f"add NVIDIA's CUDA apt repository {url}/ (its {dp.KEYRING})", action="add_repo"))
            old = ctx.run(f"cat {q(dp.PIN_FILE)} 2>/dev/null").stdout
            if old != dp.pin_text(branch):
                changes.append(
                    Change(
                        f"pin the driver to branch {branch}: {dp.PIN_FILE}",
                        text_diff(dp.PIN_FILE, old or None, dp.pin_text(branch)),
                    )
                )
        policy = dp.parse_policy(ctx.run("apt-cache policy " + " ".join(q(p) for p in pkgs) + " 2>&1").stdout)
        for p in pkgs:
            cand = (policy.get(p) or {}).get("candidate")
            if configured and not cand:
                raise StepFailed(
                    f"{p} has no candidate in this host's apt sources"
                    + (" (Ubuntu's restricted component enabled?)" if source == "distro" else "")
                )
            if configured and source == "distro" and dp.branch_of(cand) != branch:
                raise StepFailed(f"{p}'s candidate is {cand}, not branch {branch}")
        if configured:
            sim = ctx.run(
                "apt-get install --simulate -q --no-install-recommends " + " ".join(q(p) for p in pkgs) + " 2>&1",
                timeout=300,
            )
            inst = re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", sim.stdout, re.M)
            if sim.exited != 0:
                tail = (sim.stdout.strip().splitlines() or ["no output"])[-1]
                raise StepFailed(f"apt-get install --simulate {' '.join(pkgs)} failed: {tail}")
            listed = ", ".join(f"{n} {v}" for n, v in inst[:12]) + (
                f", ... ({len(inst)} in all)" if len(inst) > 12 else ""
            )
            changes.append(
                Change(f"install {' '.join(pkgs)} (branch {branch}, open kernel modules): {listed or 'nothing new'}")
            )
        else:
            changes.append(
                Change(
                    f"install {' '.join(pkgs)} (branch {branch}, open kernel modules; "
                    "the exact versions are known once the repository is added)"
                )
            )
        return changes

    def _fabric_plan(self, ctx, on_branch, drv, source, branch, info) -> list[Change]:
        changes = []
        if on_branch:
            fm_pkgs = {
                n: v
                for n, v in ((ctx.facts.get("driver_packages") or {}).get("installed") or {}).items()
                if "fabricmanager" in n and "-dev" not in n
            }
            same = any(drv and v.split(":", 1)[-1].startswith(drv) for v in fm_pkgs.values())
            if not same:
                name = (
                    f"nvidia-fabricmanager-{branch}" if source == "distro" else f"cuda-drivers-fabricmanager-{branch}"
                )
                res = ctx.run(f"apt-cache madison {q(name)} 2>&1")
                versions = [c[1].strip() for c in (ln.split("|") for ln in res.stdout.splitlines()) if len(c) >= 2]
                match = [v for v in versions if v.split(":", 1)[-1].startswith(f"{drv}-") or v.split(":", 1)[-1] == drv]
                if not match:
                    raise StepFailed(
                        f"{name} {drv} (the running driver's version) is not in this host's apt "
                        f"sources (offered: {', '.join(versions[:4]) or 'none'}); the fabric manager "
                        "must match the driver"
                    )
                info.packages.append(f"{name}={match[0]}")
                have = ", ".join(f"{n} {v}" for n, v in fm_pkgs.items()) or "none"
                changes.append(
                    Change(f"install {name}={match[0]} (the fabric manager must match the driver; installed: {have})")
                )
        if not running(unit_state(ctx.facts, FM_UNIT)):
            info.services.append(FM_UNIT)
            changes.append(Change(f"enable and start {FM_UNIT} (NVSwitch host: CUDA needs it running)"))
        return changes

    def _persistence_on(self, ctx) -> bool:
        """Persistence already on for every GPU (another way than the daemon): nothing to do."""
        res = ctx.run("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader 2>&1")
        values = [v.strip() for v in res.stdout.splitlines() if v.strip()]
        return res.exited == 0 and bool(values) and all(v == "Enabled" for v in values)

    def _serving(self, ctx) -> str | None:
        return engine_serving(ctx.session, ctx.vars)

    # -- apply -------------------------------------------------------------------------
    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        if ctx.vars.get("lab"):
            raise StepFailed(
                "lab host: a container cannot load kernel modules, so the driver step only "
                "plans here (--check); nothing changed"
            )
        info = DriverPlan.of(ctx)
        reboot = info.reboot
        if info.repo and any(c.action == "add_repo" for c in changes):
            ctx.progress("adding NVIDIA's CUDA apt repository")
            ctx.run(
                "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
                f'curl -fsSL -o "$t/k.deb" {q(info.repo + "/" + dp.KEYRING)}; dpkg -i "$t/k.deb"',
                timeout=300,
                check=True,
            )
        if info.repo:
            ctx.session.put(dp.pin_text(info.branch).encode(), dp.PIN_FILE, 0o644)
        if info.packages:
            ctx.progress(f"installing {' '.join(info.packages)}")
            res = ctx.run(
                tied_to_channel(
                    "set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; "
                    "apt-get install -y -q --no-install-recommends " + " ".join(q(p) for p in info.packages)
                ),
                timeout=3600,
            )
            if not res.ok:
                tail = (res.stdout.strip().splitlines() or ["no output"])[-1]
                raise StepFailed(f"installing {' '.join(info.packages)} failed: {tail}")
        for unit in info.services:
            # started now only when no reboot is pending: the new modules load at boot
            ctx.run(f"systemctl enable {'' if reboot else '--now '}{q(unit)}", check=True)
        if not reboot:
            problems = verify(
                facts_mod.gather(ctx.session), {**want(ctx.vars, self.params)}, ctx.vars.get("gpus_per_host")
            )
            if problems:
                raise StepFailed("driver did not verify: " + "; ".join(problems))
