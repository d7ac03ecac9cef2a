#!/usr/bin/env python3
"""k26ops self-test payload: can this GPU host run the TP8 engine?

Shipped to a host and run, as a file, with the engine release's python
(torch and triton from the engine recipe; both imported lazily, so the script
still answers on a host without them). Stdlib only otherwise.

    python3 payload.py [--expect-gpus N] [--expect-cc 12.0,10.x] [--nvcc PATH]

Every check runs in its own subprocess (this file, re-executed with
``--_child NAME``) under a timeout, in its own process group, so a hung
driver call, a wedged NCCL rendezvous or a compiler that never returns turns
into a ``timeout`` result instead of a hung self-test.

Checks, in order:
  gpus        GPUs visible to torch: count and compute capability vs expected
  versions    driver version (NVML), CUDA driver API vs torch's CUDA runtime
  cuda_graph  capture + replay on every GPU, and a mismatched-buffer copy
              (33 tokens into a buffer for 8) raising the engine's
              "The size of tensor a (8) must match the size of tensor b (33)"
  triton      a tiny Triton kernel compiled and run on every GPU
  matmul      bf16 matmul TFLOP/s on every GPU
  allreduce   NCCL all-reduce bus bandwidth across all GPUs, one process per
              GPU (skipped with a reason on a 1-GPU host)
  nvcc        nvcc compiles a kernel for this GPU's own sm_XY and runs it

Output: ONE JSON document on stdout (progress goes to stderr):

    {
      "schema": "k26ops.selftest/1",
      "status": "pass" | "fail" | "no-gpu",
      "reason": str | null,            # why no-gpu / what failed, one line
      "host": str, "started": ISO-8601 UTC, "duration_s": float,
      "python": {"version": str, "executable": str},
      "expected": {"gpus": int|null, "compute_cap": [str]|null},
      "checks": [
        {"name": str,
         "status": "pass" | "fail" | "skip" | "timeout" | "error",
         "figure": number | null,      # the headline number of the check
         "unit": str | null,           # "GPUs", "TFLOP/s", "GB/s", ...
         "expected": {"min": num|null, "max": num|null, "text": str|null} | null,
         "detail": str,                # one line, human readable
         "duration_s": float,
         "data": {...},                # check-specific, e.g. "per_gpu": [...]
        }, ...
      ]
    }

Exit codes: 0 all checks pass or skip; 1 a check failed / timed out / errored;
2 usage error; 3 no GPU (torch missing or it sees no CUDA device).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

SCHEMA = "k26ops.selftest/1"
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
RESULT_MARK = "K26OPS_SELFTEST_RESULT "
CHECKS = ["gpus", "versions", "cuda_graph", "triton", "matmul", "allreduce", "nvcc"]
# Base timeout (s) and extra seconds per GPU, per check.
TIMEOUTS = {
    "gpus": (90, 0),
    "versions": (60, 0),
    "cuda_graph": (60, 20),
    "triton": (120, 30),
    "matmul": (60, 20),
    "allreduce": (300, 15),
    "nvcc": (240, 0),
}
# Rough dense bf16 floors (TFLOP/s) per compute capability major.minor: about
# half the datasheet dense rate, so a healthy card passes and a throttled or
# misconfigured one (wrong clocks, PCIe-starved, MIG slice) does not.
MATMUL_FLOOR = {"9.0": 450.0, "10.0": 1000.0, "10.3": 1000.0, "12.0": 150.0}
TOOLCHAIN_GLOBS = ["/opt/k26ops/toolchain", "/usr/local"]


# ----------------------------------------------------------------- helpers


def _result(status, figure=None, unit=None, expected=None, detail="", **data):
    return {"status": status, "figure": figure, "unit": unit, "expected": expected, "detail": detail, "data": data}


def _expect(lo=None, hi=None, text=None):
    return {"min": lo, "max": hi, "text": text}


def _cc_matches(cc: str, patterns) -> bool:
    """'12.0' matches '12.0', '12.x', '12'."""
    major = cc.split(".")[0]
    for p in patterns:
        p = p.strip()
        if p == cc or p in (major, major + ".x", major + ".*"):
            return True
    return False


def _err_line(exc: BaseException) -> str:
    return (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:500]


def _torch():
    import torch  # lazily: the parent never imports it

    return torch


# ------------------------------------------------------------------ checks
# Each check_* runs in a child process and returns a _result(...) dict.


def check_gpus(args):
    try:
        torch = _torch()
    except Exception as e:  # ImportError, or a broken install
        return _result("no-gpu", detail="torch not importable with %s: %s" % (sys.executable, _err_line(e)))
    if not torch.cuda.is_available():
        return _result(
            "no-gpu",
            detail="torch %s sees no CUDA device "
            "(torch.cuda.is_available() is False; CUDA_VISIBLE_DEVICES=%r)"
            % (torch.__version__, os.environ.get("CUDA_VISIBLE_DEVICES")),
        )
    n = torch.cuda.device_count()
    gpus = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": p.name,
                "compute_cap": "%d.%d" % (p.major, p.minor),
                "memory_mib": p.total_memory // (1 << 20),
                "sm_count": p.multi_processor_count,
            }
        )
    problems = []
    if args.expect_gpus is not None and n != args.expect_gpus:
        problems.append("%d GPUs visible, expected %d" % (n, args.expect_gpus))
    if args.expect_cc:
        bad = sorted({g["compute_cap"] for g in gpus if not _cc_matches(g["compute_cap"], args.expect_cc)})
        if bad:
            problems.append("compute capability %s, expected %s" % (",".join(bad), ",".join(args.expect_cc)))
    names = sorted({"%s (cc %s)" % (g["name"], g["compute_cap"]) for g in gpus})
    exp = _expect(
        args.expect_gpus,
        args.expect_gpus,
        "%s GPUs, cc %s"
        % (
            args.expect_gpus if args.expect_gpus is not None else "any",
            ",".join(args.expect_cc) if args.expect_cc else "any",
        ),
    )
    return _result(
        "fail" if problems else "pass",
        n,
        "GPUs",
        exp,
        "; ".join(problems) if problems else "%d x %s" % (n, ", ".join(names)),
        per_gpu=gpus,
        torch=torch.__version__,
    )


def _nvml_driver_version():
    # lazy: runs on the host; the CLI imports this file for its tables only
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        return None, "libnvidia-ml.so.1: %s" % e
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        return None, "nvmlInit_v2 returned %d" % rc
    buf = ctypes.create_string_buffer(96)
    rc = nvml.nvmlSystemGetDriverVersion(buf, 96)
    nvml.nvmlShutdown()
    return (buf.value.decode(), None) if rc == 0 else (None, "nvmlSystemGetDriverVersion returned %d" % rc)


def _cuda_driver_api_version():
    # lazy: runs on the host; the CLI imports this file for its tables only
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return None, "libcuda.so.1: %s" % e
    v = ctypes.c_int(0)
    rc = cuda.cuDriverGetVersion(ctypes.byref(v))
    if rc != 0:
        return None, "cuDriverGetVersion returned %d" % rc
    return "%d.%d" % (v.value // 1000, (v.value % 1000) // 10), None


def check_versions(args):
    torch = _torch()
    driver, derr = _nvml_driver_version()
    if driver is None:  # NVML missing in the container: ask nvidia-smi
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode == 0 and out.stdout.strip():
                driver, derr = out.stdout.split()[0], None
        except (OSError, subprocess.TimeoutExpired) as e:
            derr = "%s; nvidia-smi: %s" % (derr, e)
    cuda_driver, cerr = _cuda_driver_api_version()
    runtime = torch.version.cuda
    triton_v = None
    try:
        # host: triton is in the engine's python on a GPU host, never on the control node
        import triton

        triton_v = triton.__version__
    except Exception:
        pass
    problems = []
    if driver is None:
        problems.append("driver version unknown (%s)" % derr)
    elif int(driver.split(".")[0]) < args.min_driver:
        problems.append("driver %s < %d" % (driver, args.min_driver))
    if cuda_driver is None:
        problems.append("CUDA driver API version unknown (%s)" % cerr)
    elif runtime and tuple(map(int, cuda_driver.split("."))) < tuple(map(int, runtime.split(".")[:2])):
        problems.append("driver supports CUDA %s < torch's CUDA runtime %s" % (cuda_driver, runtime))
    detail = "driver %s, CUDA driver API %s, torch %s (CUDA runtime %s), triton %s" % (
        driver,
        cuda_driver,
        torch.__version__,
        runtime,
        triton_v,
    )
    return _result(
        "fail" if problems else "pass",
        None,
        None,
        _expect(text="driver >= %d, driver CUDA >= runtime CUDA" % args.min_driver),
        "; ".join(problems) + " | " + detail if problems else detail,
        driver=driver,
        cuda_driver_api=cuda_driver,
        cuda_runtime=runtime,
        torch=torch.__version__,
        triton=triton_v,
        cudnn=(torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None),
        nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
    )


MISMATCH_RE = re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def each_gpu(torch):
    """Each visible GPU in turn, made the current device: (index, device)."""
    for d in range(torch.cuda.device_count()):
        dev = torch.device("cuda", d)
        torch.cuda.set_device(dev)
        yield d, dev


def check_cuda_graph(args):
    torch = _torch()
    per_gpu, problems = [], []
    for d, dev in each_gpu(torch):
        row = {"index": d}
        try:
            # The engine's shape: a static input_ids buffer for max_bs requests
            # of 8 tokens each (DDTree budget 8); the graph reads a slice of it.
            max_bs, tok_per_req, hidden = 4, 8, 256
            input_ids = torch.zeros(max_bs * tok_per_req, dtype=torch.int64, device=dev)
            emb = torch.randn(1024, hidden, device=dev, dtype=torch.float32)
            w = torch.randn(hidden, hidden, device=dev, dtype=torch.float32)
            n = tok_per_req  # one request
            s = torch.cuda.Stream(device=dev)
            s.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(s):
                for _ in range(3):
                    out = torch.relu(emb[input_ids[:n]] @ w)
            torch.cuda.current_stream(dev).wait_stream(s)
            g = torch.cuda.CUDAGraph()
            # An explicit capture stream on this GPU: torch.cuda.graph's default
            # capture stream is created once, on the first GPU used.
            with torch.cuda.graph(g, stream=torch.cuda.Stream(device=dev)):
                out = torch.relu(emb[input_ids[:n]] @ w)
            ok = True
            for trial in range(3):
                new = torch.randint(0, 1024, (n,), device=dev)
                input_ids[:n].copy_(new)
                g.replay()
                torch.cuda.synchronize(dev)
                ref = torch.relu(emb[new] @ w)
                ok = ok and torch.allclose(out, ref, rtol=1e-3, atol=1e-3)
            row["replay_ok"] = bool(ok)
            # Mismatch: a 33-tokens-per-request batch copied into the slice
            # sized for 8 tokens per request must raise, not corrupt silently.
            bad = torch.randint(0, 1024, (33,), device=dev)
            try:
                input_ids[:n].copy_(bad)
                row["mismatch"] = None
            except RuntimeError as e:
                row["mismatch"] = str(e).splitlines()[0]
            m = MISMATCH_RE.search(row["mismatch"] or "")
            row["mismatch_detected"] = bool(m and m.groups() == ("8", "33"))
            del g
            if not ok:
                problems.append("GPU %d: replay gave wrong results" % d)
            if not row["mismatch_detected"]:
                problems.append("GPU %d: mismatched copy not detected as expected (%r)" % (d, row["mismatch"]))
        except Exception as e:
            row["error"] = _err_line(e)
            problems.append("GPU %d: %s" % (d, row["error"]))
        per_gpu.append(row)
    ok_n = sum(1 for r in per_gpu if r.get("replay_ok") and r.get("mismatch_detected"))
    msg = per_gpu[0].get("mismatch") if per_gpu else None
    return _result(
        "fail" if problems else "pass",
        ok_n,
        "GPUs ok",
        _expect(len(per_gpu), len(per_gpu), "capture+replay ok and 8-vs-33 mismatch raised on every GPU"),
        "; ".join(problems) if problems else "capture+replay ok on %d GPU(s); mismatch raised: %s" % (ok_n, msg),
        per_gpu=per_gpu,
    )


def check_triton(args):
    torch = _torch()
    global triton, tl  # the kernel's globals must see them (triton reads fn.__globals__)
    # host: triton is in the engine's python on a GPU host, never on the control node
    import triton
    import triton.language as tl

    @triton.jit
    def _axpy(x_ptr, y_ptr, out_ptr, n, a, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, a * x + y, mask=mask)

    per_gpu, problems = [], []
    for d, dev in each_gpu(torch):
        row = {"index": d}
        try:
            n = 100_003
            x = torch.randn(n, device=dev)
            y = torch.randn(n, device=dev)
            out = torch.empty_like(x)
            t0 = time.perf_counter()
            _axpy[(triton.cdiv(n, 1024),)](x, y, out, n, 2.5, BLOCK=1024)
            torch.cuda.synchronize(dev)
            row["first_call_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            # FMA in the kernel vs two rounded ops in torch: compare loosely.
            row["max_abs_err"] = float((out - (2.5 * x + y)).abs().max().item())
            row["ok"] = row["max_abs_err"] < 1e-4
            if not row["ok"]:
                row["sample"] = {"got": out[:4].tolist(), "want": (2.5 * x + y)[:4].tolist()}
                problems.append("GPU %d: wrong result (max abs error %g)" % (d, row["max_abs_err"]))
        except Exception as e:
            row["error"] = _err_line(e)
            problems.append("GPU %d: %s" % (d, row["error"]))
        per_gpu.append(row)
    ok_n = sum(1 for r in per_gpu if r.get("ok"))
    return _result(
        "fail" if problems else "pass",
        ok_n,
        "GPUs ok",
        _expect(len(per_gpu), len(per_gpu), "kernel compiles and is correct on every GPU"),
        "; ".join(problems)
        if problems
        else "triton %s kernel ok on %d GPU(s), first call (compile) %s ms"
        % (triton.__version__, ok_n, per_gpu[0].get("first_call_ms") if per_gpu else None),
        per_gpu=per_gpu,
        triton=triton.__version__,
    )


def check_matmul(args):
    torch = _torch()
    size = args.matmul_size
    per_gpu, problems = [], []
    floor_all = []
    for d, dev in each_gpu(torch):
        p = torch.cuda.get_device_properties(d)
        cc = "%d.%d" % (p.major, p.minor)
        floor = args.min_tflops if args.min_tflops is not None else MATMUL_FLOOR.get(cc)
        floor_all.append(floor)
        row = {"index": d, "name": p.name, "compute_cap": cc, "size": size, "floor": floor}
        try:
            a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
            b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
            for _ in range(3):
                c = a @ b
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            iters = 10
            start.record()
            for _ in range(iters):
                c = a @ b
            end.record()
            torch.cuda.synchronize(dev)
            ms = start.elapsed_time(end) / iters
            row["ms"] = round(ms, 3)
            row["tflops"] = round(2 * size**3 / (ms * 1e-3) / 1e12, 1)
            del a, b, c
            torch.cuda.empty_cache()
            if floor is not None and row["tflops"] < floor:
                problems.append("GPU %d: %.1f TFLOP/s < %.0f" % (d, row["tflops"], floor))
        except Exception as e:
            row["error"] = _err_line(e)
            problems.append("GPU %d: %s" % (d, row["error"]))
        per_gpu.append(row)
    vals = [r["tflops"] for r in per_gpu if "tflops" in r]
    worst = min(vals) if vals else None
    floors = [f for f in floor_all if f is not None]
    exp = _expect(
        min(floors) if floors else None,
        None,
        "bf16 %dx%dx%d, per-GPU minimum" % (size, size, size)
        if floors
        else "no floor known for this GPU (pass --min-tflops)",
    )
    return _result(
        "fail" if problems else "pass",
        worst,
        "TFLOP/s",
        exp,
        "; ".join(problems)
        if problems
        else "bf16 %d^3: min %s, max %s TFLOP/s over %d GPU(s)" % (size, worst, max(vals) if vals else None, len(vals)),
        per_gpu=per_gpu,
    )


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_allreduce(args):
    torch = _torch()
    n = torch.cuda.device_count()
    if n < 2:
        return _result("skip", None, "GB/s", None, "1 GPU visible: no all-reduce to measure")
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast from a probe
    port = _free_port()
    procs = []
    outdir = tempfile.mkdtemp(prefix="k26ops-allreduce-")
    for r in range(n):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_rank",
            "%d,%d,%d" % (r, n, port),
            "--allreduce-mb",
            str(args.allreduce_mb),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=open(os.path.join(outdir, "r%d.out" % r), "w"), stderr=subprocess.STDOUT
            )
        )
    rcs = [p.wait() for p in procs]
    with open(os.path.join(outdir, "r0.out")) as f:
        out0 = f.read()
    res = None
    for line in out0.splitlines():
        if line.startswith(RESULT_MARK):
            res = json.loads(line[len(RESULT_MARK) :])
    if res is None or any(rcs):
        tails = []
        for r in range(n):
            with open(os.path.join(outdir, "r%d.out" % r)) as f:
                t = f.read().strip().splitlines()
            tails.append("rank %d rc %d: %s" % (r, rcs[r], t[-1] if t else ""))
        return _result("error", None, "GB/s", None, "; ".join(tails)[:1500])
    floor = args.min_busbw
    bw = res["busbw_gbps"]
    ok = res["correct"] and (floor is None or bw >= floor)
    detail = "%d GPUs, %s MiB bf16: bus bandwidth %.1f GB/s (alg %.1f GB/s), small-message latency %.1f us" % (
        n,
        args.allreduce_mb,
        bw,
        res["algbw_gbps"],
        res["sizes"][0]["us"],
    )
    if not res["correct"]:
        detail = "WRONG SUM; " + detail
    elif not ok:
        detail = "bus bandwidth %.1f GB/s < %.1f; %s" % (bw, floor, detail)
    return _result(
        "pass" if ok else "fail",
        bw,
        "GB/s",
        _expect(floor, None, "NCCL all-reduce bus bandwidth, %d MiB bf16" % args.allreduce_mb),
        detail,
        world_size=n,
        **res,
    )


def allreduce_rank(rank, world, port, mb):
    """One rank of the all-reduce benchmark (its own process, its own GPU)."""
    torch = _torch()
    # host: torch is in the engine's python on a GPU host, never on the control node
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, world_size=world, rank=rank, device_id=dev)
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    correct = bool(torch.all(t == world * (world + 1) / 2).item())
    sizes = []
    for nbytes in (32 << 10, 1 << 20, 16 << 20, mb << 20):
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev)
        iters = 20 if nbytes >= (16 << 20) else 50
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        sec = (time.perf_counter() - t0) / iters
        algbw = nbytes / sec / 1e9
        sizes.append(
            {
                "bytes": nbytes,
                "us": round(sec * 1e6, 1),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 2),
            }
        )
    dist.destroy_process_group()
    if rank == 0:
        last = sizes[-1]
        print(
            RESULT_MARK
            + json.dumps(
                {
                    "correct": correct,
                    "busbw_gbps": last["busbw_gbps"],
                    "algbw_gbps": last["algbw_gbps"],
                    "sizes": sizes,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                }
            ),
            flush=True,
        )


CU_SRC = r"""
#include <cstdio>
__global__ void sq(int *o, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = i * i; }
int main() {
  const int n = 1000; int *d, h[n];
  if (cudaMalloc(&d, n * sizeof(int)) != cudaSuccess) { printf("cudaMalloc failed\n"); return 2; }
  sq<<<(n + 255) / 256, 256>>>(d, n);
  cudaError_t e = cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) { printf("error %s\n", cudaGetErrorString(e)); return 3; }
  long s = 0; for (int i = 0; i < n; i++) s += h[i];
  printf("sum %ld\n", s); return s == 332833500L ? 0 : 4;
}
"""


def find_nvcc(given=None):
    """The nvcc to test: --nvcc, else PATH, else the k26ops toolchain / /usr/local/cuda*."""
    if given:
        return given if os.path.exists(given) else None
    found = shutil.which("nvcc")
    if found:
        return found
    for pat in (
        "/opt/k26ops/toolchain/cuda-*/bin/nvcc",
        "/opt/k26ops/toolchain/*/bin/nvcc",
        "/usr/local/cuda/bin/nvcc",
        "/usr/local/cuda-*/bin/nvcc",
    ):
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def check_nvcc(args):
    torch = _torch()
    nvcc = find_nvcc(args.nvcc)
    if nvcc is None:
        st = "fail" if args.nvcc else "skip"
        return _result(
            st, None, None, None, "nvcc not found (%s)" % (args.nvcc or "PATH, /opt/k26ops/toolchain, /usr/local/cuda*")
        )
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", ver)
    version = m.group(2) if m else None
    p = torch.cuda.get_device_properties(0)
    arch = "sm_%d%d" % (p.major, p.minor)
    work = tempfile.mkdtemp(prefix="k26ops-nvcc-")
    src, exe = os.path.join(work, "sq.cu"), os.path.join(work, "sq")
    with open(src, "w") as f:
        f.write(CU_SRC)
    cmd = [nvcc, "-arch=" + arch, "-o", exe, src]
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "lib")
    if os.path.isdir(libdir) and not os.path.isdir(libdir + "64"):  # pip cuda-toolkit layout
        cmd += ["-L" + libdir]
    t0 = time.perf_counter()
    c = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_nvcc)
    compile_s = round(time.perf_counter() - t0, 2)
    if c.returncode != 0:
        err = (c.stderr or c.stdout).strip().splitlines()
        return _result(
            "fail",
            None,
            None,
            None,
            "nvcc %s -arch=%s failed: %s" % (version, arch, err[-1] if err else c.returncode),
            nvcc=nvcc,
            version=version,
            arch=arch,
        )
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    ok = r.returncode == 0
    return _result(
        "pass" if ok else "fail",
        compile_s,
        "s compile",
        None,
        "nvcc %s built %s and it ran: %s" % (version, arch, r.stdout.strip())
        if ok
        else "nvcc %s built %s but it exited %d: %s"
        % (version, arch, r.returncode, (r.stdout + r.stderr).strip()[:300]),
        nvcc=nvcc,
        version=version,
        arch=arch,
    )


# ------------------------------------------------------------------ driver


def run_child(name, args, argv):
    """Run one check in a subprocess with a timeout; never raises, never hangs."""
    base, per = TIMEOUTS[name]
    timeout = (base + per * max(args.gpu_count_hint, 1)) * args.timeout_scale
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", name] + argv
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the check and anything it started
        except ProcessLookupError:
            pass
        p.communicate()
        res = _result("timeout", detail="no answer within %.0f s" % timeout)
    else:
        res = None
        for line in out.splitlines():
            if line.startswith(RESULT_MARK):
                res = json.loads(line[len(RESULT_MARK) :])
        if res is None:
            tail = [l for l in (err or out).strip().splitlines() if l.strip()]
            res = _result("error", detail="exit %d: %s" % (p.returncode, tail[-1][:500] if tail else "no output"))
    res = {"name": name, **res, "duration_s": round(time.perf_counter() - t0, 2)}
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="payload.py",
        description="k26ops self-test: checks this GPU host can run the engine; prints one JSON document "
        "(schema in the module docstring). Exit 0 pass, 1 fail, 2 usage, 3 no GPU.",
    )
    ap.add_argument("--expect-gpus", type=int, default=None, help="GPUs the host must have (e.g. 8)")
    ap.add_argument(
        "--expect-cc",
        type=lambda s: [p for p in s.split(",") if p],
        default=None,
        help="allowed compute capabilities, comma-separated: 12.0,10.x",
    )
    ap.add_argument("--min-driver", type=int, default=580, help="minimum driver major (580 for CUDA 13)")
    ap.add_argument(
        "--nvcc", default=None, help="nvcc to test (default: PATH, /opt/k26ops/toolchain, /usr/local/cuda*)"
    )
    ap.add_argument("--matmul-size", type=int, default=8192, help="bf16 matmul M=N=K")
    ap.add_argument("--min-tflops", type=float, default=None, help="per-GPU bf16 floor (default by compute capability)")
    ap.add_argument("--allreduce-mb", type=int, default=256, help="largest all-reduce message in MiB")
    ap.add_argument(
        "--min-busbw",
        type=float,
        default=10.0,
        help="all-reduce bus bandwidth floor in GB/s (default 10: a sick PCIe host; raise it for NVLink hosts)",
    )
    ap.add_argument(
        "--checks",
        type=lambda s: [p for p in s.split(",") if p],
        default=CHECKS,
        help="comma-separated subset of: " + ",".join(CHECKS),
    )
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every per-check timeout")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_rank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_gpus", type=int, default=1, dest="gpu_count_hint", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        ap.error("unknown check(s): %s (known: %s)" % (",".join(unknown), ",".join(CHECKS)))
    args.timeout_nvcc = 180 * args.timeout_scale
    return args


def child_main(args):
    fn = globals()["check_" + args._child]
    try:
        res = fn(args)
    except Exception as e:
        res = _result("error", detail=_err_line(e))
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args._rank:
        r, w, port = map(int, args._rank.split(","))
        allreduce_rank(r, w, port, args.allreduce_mb)
        return 0
    if args._child:
        return child_main(args)
    if not os.path.isfile(os.path.abspath(__file__)):
        print(json.dumps({"schema": SCHEMA, "status": "fail", "reason": "run payload.py as a file, not from stdin"}))
        return EXIT_USAGE
    t0 = time.perf_counter()
    doc = {
        "schema": SCHEMA,
        "status": None,
        "reason": None,
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_s": None,
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "expected": {"gpus": args.expect_gpus, "compute_cap": args.expect_cc},
        "checks": [],
    }
    checks = ["gpus"] + [c for c in args.checks if c != "gpus"]
    for name in checks:
        print("k26ops selftest: %s ..." % name, file=sys.stderr, flush=True)
        res = run_child(name, args, argv + ["--_gpus", str(args.gpu_count_hint)])
        if name == "gpus":
            if res["status"] == "no-gpu":
                doc.update(status="no-gpu", reason=res["detail"])
                res["status"] = "fail"
                doc["checks"].append(res)
                break
            args.gpu_count_hint = res["figure"] or 1
        doc["checks"].append(res)
        print("k26ops selftest: %s %s: %s" % (name, res["status"], res["detail"]), file=sys.stderr, flush=True)
    if doc["status"] is None:
        bad = [c for c in doc["checks"] if c["status"] not in ("pass", "skip")]
        doc["status"] = "fail" if bad else "pass"
        doc["reason"] = "; ".join("%s %s: %s" % (c["name"], c["status"], c["detail"]) for c in bad) or None
    doc["duration_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(doc, indent=1))
    return {"pass": EXIT_OK, "fail": EXIT_FAIL, "no-gpu": EXIT_NO_GPU}[doc["status"]]


if __name__ == "__main__":
    sys.exit(main())
