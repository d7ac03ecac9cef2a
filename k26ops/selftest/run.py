"""The self-test's workflow on one host, with no output: ship the payload
(k26ops/selftest/payload.py) to a private directory, run it under the host's deadline with
the release's python (else python3), read its JSON document back, and judge the fleet's
results (classify, exit_code). `k26ops selftest` (k26ops.cli.commands.selftest) prints them."""

from __future__ import annotations

import json
from pathlib import Path

from k26ops.errors import EXIT_HOST_FAILED, EXIT_NO_GPU, EXIT_OK
from k26ops.host import preflight
from k26ops.hostvars import Var, declare
from k26ops.layout import Layout
from k26ops.selftest import payload as payload_mod
from k26ops.selftest.report import headline, validate
from k26ops.shell import q
from k26ops.transport.fleet import FAILED, OK, HostResult, Outcome

NO_GPU = "no-gpu"
PAYLOAD = Path(payload_mod.__file__)
MARGIN_S = 120.0

declare(
    __name__,
    "the self-test",
    Var("nvcc", "path", None, "nvcc for the self-test", "{k26ops_root}/toolchain/cuda-*/bin/nvcc"),
    Var("selftest_min_tflops", "number", None, "lowest acceptable matmul TFLOPS"),
    Var("selftest_min_busbw", "number", None, "lowest acceptable NCCL bus bandwidth (GB/s)"),
)


class SelftestFailed(Exception):
    """The payload ran and reported failing checks (data kept for the report)."""


def default_host_timeout(gpus: int, scale: float) -> float:
    """The payload's worst case: every check's own timeout, for `gpus` GPUs."""
    total = sum(base + per * max(gpus, 1) for base, per in payload_mod.TIMEOUTS.values())
    return total * scale + MARGIN_S


def payload_args(hv: dict, nvcc: str | None, opts: dict) -> list[str]:
    """The payload's command line from the host's expectations."""
    e = preflight.expectations(hv)
    cc = e["compute_capability"]
    cc = ",".join(map(str, cc)) if isinstance(cc, (list, tuple)) else str(cc)
    args = [
        "--expect-gpus",
        str(int(e["gpus_per_host"])),
        "--expect-cc",
        cc,
        "--min-driver",
        str(int(e["min_driver"])),
        "--timeout-scale",
        str(opts["timeout_scale"]),
    ]
    if nvcc:
        args += ["--nvcc", nvcc]
    tflops = opts.get("min_tflops") or hv.get("selftest_min_tflops")
    busbw = opts.get("min_busbw") or hv.get("selftest_min_busbw")
    if tflops is not None:
        args += ["--min-tflops", str(float(tflops))]
    if busbw is not None:
        args += ["--min-busbw", str(float(busbw))]
    if opts.get("checks"):
        args += ["--checks", opts["checks"]]
    return args


def _probe(session, python: str | None) -> dict:
    """One round trip: temp dir, python to use, nvcc, timeout(1)."""
    hv = session.host.vars
    layout = Layout.of(hv)
    root = layout.root
    rel_py = f"{layout.current}/venv/bin/python"
    nvcc = hv.get("nvcc")
    script = (
        f"d=$(mktemp -d {q(root + '/state/selftest.XXXXXX')} 2>/dev/null "
        '|| mktemp -d /tmp/k26ops-selftest.XXXXXX) || exit 1; echo "dir=$d"; '
        + (
            f"if [ -x {q(python)} ] || command -v {q(python)} >/dev/null 2>&1; then echo python={q(python)}; "
            "echo src=--python; fi; "
            if python
            else f"if [ -x {q(rel_py)} ]; then echo python={q(rel_py)}; echo src=release; "
            'elif p=$(command -v python3); then echo "python=$p"; echo src=python3; fi; '
        )
        + (
            f"[ -x {q(nvcc)} ] && echo nvcc={q(nvcc)}; "
            if nvcc
            else f"n=$(ls -d {q(root)}/toolchain/cuda-*/bin/nvcc 2>/dev/null | tail -1); "
            '[ -n "$n" ] && echo "nvcc=$n"; '
        )
        + "command -v timeout >/dev/null 2>&1 && echo timeout=yes; true"
    )
    res = session.run(script, timeout=60)
    found = {}
    for line in res.stdout.splitlines():
        k, _, v = line.partition("=")
        found.setdefault(k, v)
    if not found.get("dir"):
        detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.exited}").splitlines()[-1]
        raise RuntimeError(f"cannot make a temp dir on the host: {detail}")
    found["release_python"] = rel_py
    return found


def make_work(opts: dict):
    payload = PAYLOAD.read_bytes()

    def work(session):
        hv = session.host.vars
        p = _probe(session, opts.get("python"))
        d = p["dir"]
        if not p.get("python"):
            session.run(f"rm -rf {q(d)}", timeout=30)
            raise RuntimeError(
                f"no python to run the self-test: {opts['python'] + ' not found' if opts.get('python') else 'no release python at ' + p['release_python'] + ' and no python3'}"
            )
        python, source = p["python"], p.get("src")
        used = f"{python} ({'release' if source == 'release' else 'fallback: python3, no release python' if source == 'python3' else '--python'})"
        gpus = int(preflight.expectations(hv)["gpus_per_host"])
        limit = opts["host_timeout"] or default_host_timeout(gpus, opts["timeout_scale"])
        args = payload_args(hv, p.get("nvcc"), opts)
        remote = f"{d}/payload.py"
        ran = False
        try:
            session.put(payload, remote, 0o755)
            guard = f"timeout -k 15 {int(limit)} " if p.get("timeout") else ""
            cmd = f"{guard}{q(python)} {q(remote)} {' '.join(q(a) for a in args)}; rc=$?; rm -rf {q(d)}; exit $rc"
            res = session.run(cmd, timeout=limit + 30)
            ran = True
        except TimeoutError:
            raise RuntimeError(f"host deadline of {limit:.0f}s exceeded (--host-timeout)") from None
        finally:
            if not ran:  # the command's own cleanup did not run
                try:
                    session.run(f"rm -rf {q(d)}", timeout=30)
                except Exception:
                    pass
        if res.exited in (124, 137):
            raise RuntimeError(f"host deadline of {limit:.0f}s exceeded on the host (--host-timeout)")
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            tail = [ln for ln in (res.stderr + res.stdout).strip().splitlines() if ln.strip()]
            raise RuntimeError(
                f"payload with {used} exited {res.exited} without a result" + (f": {tail[-1][:300]}" if tail else "")
            ) from None
        problems = validate(doc)
        if problems:
            raise RuntimeError(f"payload output invalid: {'; '.join(problems[:3])}")
        return Outcome(python=python, python_source=source, python_used=used, selftest=doc, headline=headline(doc))

    return work


def classify(results: list[HostResult]) -> None:
    """Fleet status -> self-test status: ok only when the payload passed."""
    for r in results:
        doc = r.data.get("selftest")
        if r.status != OK or not doc:
            continue
        if doc.get("status") == "no-gpu":
            r.status, r.error = NO_GPU, f"no GPU: {doc.get('reason')}"
        elif doc.get("status") != "pass":
            r.status, r.error = FAILED, doc.get("reason") or "a check failed"


def exit_code(results: list[HostResult]) -> int:
    if any(r.status not in (OK, NO_GPU) for r in results):
        return EXIT_HOST_FAILED
    return EXIT_NO_GPU if any(r.status == NO_GPU for r in results) else EXIT_OK
