"""The CUDA 13 toolchain step: install (pip or apt method) and verify nvcc.

Verified means: `nvcc --version` reports the wanted release and a tiny kernel
compiles for sm_120 (RTX PRO 6000 Blackwell) and for the host's own GPU
architecture when it has one. Deploy never installs or changes GPU drivers
(`k26ops provision` does, with reboots); a driver older than the toolkit
needs stops the step before anything changes.

pip method: `cuda-toolkit[nvcc]==13.0.*` into <root>/toolchain/cuda-13.0 (a
venv), built beside the old one and renamed into place when verified; nvcc
lives in site-packages/nvidia/cu13/bin and is linked as <dir>/bin/nvcc.
apt method (Ubuntu): NVIDIA's repository via its cuda-keyring package, then
`cuda-toolkit-13-0` only, never the `cuda`/`cuda-13-0` driver metapackages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k26ops.engine.profile import inventory_recipe
from k26ops.facts.base import Fact, safe
from k26ops.host.preflight import driver_version
from k26ops.hostvars import Var, declare
from k26ops.layout import Layout
from k26ops.release import wheelhouse, wheelsource
from k26ops.runstate import HostState
from k26ops.shell import q
from k26ops.steps import Change, HostContext, Step, StepFailed, tied_to_channel

KERNEL = "__global__ void k26(float *x) { x[threadIdx.x] *= 2.0f; }\n"
MARKER = "k26ops-verified"
declare(
    __name__, "the CUDA toolchain", Var("cuda_method", "str", None, "how the CUDA toolkit is installed", "the recipe's")
)


host_recipe = inventory_recipe  # the name the steps know


def archs(facts: dict) -> list[str]:
    """sm_120 always, plus the host's own GPUs' architectures."""
    out = ["sm_120"]
    for g in (facts.get("gpus") or {}).get("gpus") or []:
        cc = str(g.get("compute_cap") or "")
        if cc.replace(".", "").isdigit():
            sm = "sm_" + cc.replace(".", "")
            if sm not in out:
                out.append(sm)
    return out


@dataclass
class ToolkitPlan(HostState):
    """What the toolchain step's plan settled for this host; its apply verifies that."""

    nvcc: str | None = None  # where nvcc is (or will be) for the planned method and version
    archs: list[str] = field(default_factory=list)  # sm_120 and the host's own GPUs' architectures


VERIFIED_FACT = "cuda_toolchains_verified"


def verified_fact(root: str) -> Fact:
    """{toolchain dir: the GPU architectures its marker says nvcc was verified for}."""
    tc = f"{root}/toolchain"
    cmd = (
        f'for f in {q(tc)}/*/{MARKER}; do [ -f "$f" ] && printf \'%s\\t%s\\n\' "${{f%/*}}" '
        "\"$(tr '\\n' ' ' < \"$f\")\"; done; true"
    )
    return Fact(
        VERIFIED_FACT,
        cmd,
        safe(
            lambda out, rc: {
                d: archs.split() for d, _, archs in (line.partition("\t") for line in out.splitlines()) if archs
            }
        ),
        10.0,
        own="toolchains_verified",
        own_args=(tc, MARKER),
    )


class CudaToolkit(Step):
    name = "cuda_toolkit"
    # archs and driver (the query; the engine's preflight adds -q, the driver's second source), installs
    fact_names = ("gpus", "cuda_toolkit", "python3", "os_release")

    def _spec(self, ctx):
        tk = host_recipe(ctx).toolkit
        method = self.params.get("method") or ctx.vars.get("cuda_method") or tk.method
        version = str(self.params.get("version") or tk.version)
        return method, version, int(ctx.vars.get("min_driver", tk.min_driver))

    def toolchain_dir(self, ctx, version) -> str:
        return f"{ctx.root}/toolchain/cuda-{version}"

    def facts(self, host_vars: dict) -> list:
        """The pip toolchains' verified-for markers, read in the playbook's one fact-gathering
        call (not a command of its own: a converged deploy makes none here)."""
        return [verified_fact(Layout.of(host_vars).root)]

    def plan(self, ctx: HostContext) -> list[Change]:
        method, version, min_driver = self._spec(ctx)
        _, major = driver_version(ctx.facts)
        if major is None:
            raise StepFailed(
                "no NVIDIA driver found (nvidia-smi): deploy never installs drivers; "
                f"`k26ops provision` installs an R{min_driver}+ driver first"
            )
        if major < min_driver:
            raise StepFailed(
                f"driver {major} is older than CUDA {version} needs (>= {min_driver}); "
                "deploy never changes drivers: `k26ops provision` upgrades it (with a reboot)"
            )
        want_archs = archs(ctx.facts)
        tp = ToolkitPlan(archs=want_archs).put(ctx)
        if method == "pip":
            d = self.toolchain_dir(ctx, version)
            tp.nvcc = f"{d}/bin/nvcc"
            tk = ctx.facts.get("cuda_toolkit") or {}
            here = [i for i in tk.get("installs", []) if i.get("path") == f"{d}/bin/nvcc"]
            if here and here[0].get("release") == version:
                verified = ctx.facts.get(VERIFIED_FACT)
                if not isinstance(verified, dict) or "error" in verified:  # not gathered: read it now
                    verified = {d: ctx.run(f"cat {q(d)}/{MARKER} 2>/dev/null").stdout.split()}
                if verified.get(d) == want_archs:
                    return []
            return [Change(f"install CUDA {version} toolkit (pip) into {d}, verify nvcc for " + ", ".join(want_archs))]
        if method == "apt":
            tk = ctx.facts.get("cuda_toolkit") or {}
            d = f"/usr/local/cuda-{version}"
            tp.nvcc = f"{d}/bin/nvcc"
            if any(i.get("path") == f"{d}/bin/nvcc" and i.get("release") == version for i in tk.get("installs", [])):
                return []
            return [Change(f"install cuda-toolkit-{version.replace('.', '-')} (apt, NVIDIA repository)")]
        raise StepFailed(f"unknown CUDA toolkit method {method!r} (pip or apt)")

    def apply(self, ctx: HostContext, changes: list[Change]) -> None:
        method, version, _ = self._spec(ctx)
        if method == "pip":
            self._apply_pip(ctx, version)  # builds, verifies, then renames into place
        else:
            self._apply_apt(ctx, version)
            self._verify(ctx, ToolkitPlan.of(ctx).nvcc, version)

    def _apply_pip(self, ctx, version):
        r = host_recipe(ctx)
        py = (ctx.facts.get("python3") or {}).get("version", "3.11")
        ctx.progress("downloading the CUDA toolkit wheels (once for all hosts)")
        wheels = wheelhouse.ensure([r.toolkit.pip_spec], no_deps=False, python=".".join(py.split(".")[:2]))
        wh = f"{ctx.root}/wheelhouse"
        wheelsource.deliver(ctx, wheels, wh)
        d = self.toolchain_dir(ctx, version)
        part = f"{d}.partial"
        wheelhouse.need_free(
            ctx.session, ctx.root, 3 * sum(w.size for w in wheels), f"the CUDA {version} toolkit (about 3x its wheels)"
        )
        ctx.progress(f"installing CUDA {version} (pip) into {d}")
        script = (
            f"set -e; rm -rf {q(part)}; python3 -m venv {q(part)}; "
            f"{q(part)}/bin/pip install -q --no-index --find-links {q(wh)} {q(r.toolkit.pip_spec)}; "
            f"n=$(ls -d {q(part)}/lib/python3*/site-packages/nvidia/cu*/bin/nvcc | head -1); "
            # nvcc finds its profile and headers from the path it was run by,
            # so bin/nvcc is a wrapper that runs the real one (not a symlink).
            # Its dir from $0 by the shell itself, not dirname: every deploy's
            # facts run `nvcc --version` (issue 31: host CPU per deploy).
            f'mkdir -p {q(part)}/bin; rel="${{n#{part}/}}"; '
            "printf '#!/bin/sh\\n# k26ops: CUDA toolkit (pip method)\\n"
            'case "$0" in */*) d="${0%%/*}";; *) d=.;; esac\\n'
            'exec "$d/../%s" "$@"\\n\' "$rel" > ' + q(part) + "/bin/nvcc; "
            f"chmod 755 {q(part)}/bin/nvcc"
        )
        res = ctx.run(tied_to_channel(script), timeout=1800)  # pip dies with the run
        if not res.ok:
            ctx.run(f"rm -rf {q(part)}")
            tail = (res.stderr.replace("\0", "").strip() or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise StepFailed(f"installing the CUDA {version} toolkit failed: {tail[0]}")
        try:
            self._verify(ctx, f"{part}/bin/nvcc", version)
        except StepFailed:
            ctx.run(f"rm -rf {q(part)}")
            raise
        # Only a verified toolchain takes the place of the old one. (nvcc does
        # not care where its venv lives; pip's script shebangs are not used.)
        ctx.run(
            f"set -e; rm -rf {q(d)}.old; if [ -e {q(d)} ]; then mv {q(d)} {q(d)}.old; fi; "
            f"mv {q(part)} {q(d)}; rm -rf {q(d)}.old; "
            f"printf '%s\\n' {q(' '.join(ToolkitPlan.of(ctx).archs))} > {q(d)}/{MARKER}",
            check=True,
        )

    def _apply_apt(self, ctx, version):
        osr = ctx.facts.get("os_release") or {}
        if osr.get("id") != "ubuntu":
            raise StepFailed(f"apt method needs Ubuntu (NVIDIA's repository), host is {osr.get('pretty_name')}")
        dist = "ubuntu" + str(osr.get("version_id", "")).replace(".", "")
        repo = f"https://developer.download.nvidia.com/compute/cuda/repos/{dist}/x86_64"
        pkg = f"cuda-toolkit-{version.replace('.', '-')}"
        ctx.run(
            "set -e; export DEBIAN_FRONTEND=noninteractive; t=$(mktemp -d); "
            f'curl -fsSL -o "$t/keyring.deb" {q(repo + "/cuda-keyring_1.1-1_all.deb")}; '
            'dpkg -i "$t/keyring.deb"; rm -rf "$t"; apt-get update -qq; '
            f"apt-get install -y -qq --no-install-recommends {q(pkg)}",
            timeout=3600,
            check=True,
        )

    def _verify(self, ctx, nvcc: str, version: str) -> None:
        want = ToolkitPlan.of(ctx).archs
        arch_flags = " ".join(f"-gencode arch=compute_{a[3:]},code={a}" for a in want)
        res = ctx.run(
            f"set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; {q(nvcc)} --version; "
            f'printf %s {q(KERNEL)} > "$t/k.cu"; {q(nvcc)} {arch_flags} -c -o "$t/k.o" "$t/k.cu"',
            timeout=600,
        )
        if res.exited != 0 or f"release {version}" not in res.stdout:
            tail = (res.stderr.replace("\0", "").strip() or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise StepFailed(f"CUDA {version} toolkit did not verify: {tail[0]}")
