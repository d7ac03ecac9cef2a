#!/usr/bin/env python3
"""Reproducibly prepare the sglang 0.5.17 wheel bundle for the H200 device.

Run from the repo root:  python3 bench/device/prepare_bundle.py [--skip-download]
(writes into .device/ of the checkout, which .git/info/exclude should ignore: `echo /.device/ >> .git/info/exclude`)

Steps (all under the directory holding this script):
  dl/             download cache of the original wheels (pip download --no-deps)
  wheelhouse/     every wheel rewritten deterministically (ZIP_STORED, fixed
                  date 1980-01-01, members sorted, dist-info last), some slimmed
  wheelhouse.lock pip requirements with --hash of the wheels as written
  k26ops-deps/    k26ops runtime deps the device lacks (original wheels)
  bundle.tar.xz   tar -cJ of wheelhouse + wheelhouse.lock (xz -9e)

The pinned set below was resolved once with
  uv pip compile (sglang==0.5.17) --python-version 3.12
     --python-platform x86_64-manylinux_2_34 --override numba>=0.60,numpy==2.5.2
and then reduced by (1) what the device image already has at a satisfying
version (work/machine-has.txt, from .library/device/KINDS.md) and (2) what the
DFLASH + triton attention + pytorch sampling + grammar none path never
imports (EXCLUDED below).
"""

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / ".device"  # the ignored staging dir the device tool carries
HERE.mkdir(exist_ok=True)
DL = HERE / "dl"
WH = HERE / "wheelhouse"
KD = HERE / "k26ops-deps"
LOCK = HERE / "wheelhouse.lock"
BUNDLE = HERE / "bundle.tar.xz"
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
STRIPPED = []  # (wheel, member, old size, new size) after strip --strip-debug

PLATFORMS = [
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
    "any",
]

# sglang 0.5.17 runtime set for the device (cp312, manylinux x86_64).
WHEELS = """
annotated-types==0.8.0 anthropic==2.15.0 apache-tvm-ffi==0.1.11
asttokens==3.0.2 blobfile==3.0.0 cffi==2.1.1 compressed-tensors==0.20.1 cuda-python==13.4.4
cuda-tile==1.7.0 datasets==5.2.0 dill==0.4.1 distro==1.9.0
docstring-parser==0.18.0 easydict==1.14 executing==2.3.0 fastapi==0.165.0
flashinfer-python==0.6.15.post1 gguf==0.19.0 grpcio-health-checking==1.81.1
grpcio-reflection==1.81.1 httpcore2==2.16.2 httpx2==2.16.2 interegular==0.3.3 ipython==9.18.1
ipython-pygments-lexers==1.1.1 jedi==0.20.1 jiter==0.19.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 lark==1.3.1 loguru==0.7.3
matplotlib-inline==0.2.2 mistral-common==1.13.1 msgspec==0.23.0 multiprocess==0.70.19
nest-asyncio==1.6.0 openai==2.6.1 openai-harmony==0.0.4 opentelemetry-api==1.45.2
orjson==3.13.0 parso==0.8.7
partial-json-parser==0.2.1.1.post7 pexpect==4.9.0 prompt-toolkit==3.0.53 ptyprocess==0.7.0
pure-eval==0.2.4 pybase64==1.5.1 pycountry==26.2.16 pycparser==3.12
pydantic==2.14.4 pydantic-core==2.50.5 pydantic-extra-types==2.11.1
python-multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1
setproctitle==1.3.8 sglang==0.5.17 sglang-kernel==0.4.5 smg-grpc-proto==0.4.28
smg-grpc-servicer==0.14.1 sniffio==1.3.1 soundfile==0.13.1 stack-data==0.6.3 starlette==1.10.0
tokenizers==0.22.2 torch-c-dlpack-ext==0.1.5 torch-memory-saver==0.0.10
traitlets==5.16.1 transformers==5.12.1 truststore==0.10.5 typing-inspection==0.4.5
tzdata==2026.6 uvicorn==0.54.0 watchfiles==1.3.0 wcwidth==0.9.4 xgrammar==0.2.1
zstandard==0.25.0
""".split()

# Left out on purpose (see the lock header).
EXCLUDED = {
    "from the device image": "torch triton torchvision torchaudio nvidia-* (CUDA wheels) numba llvmlite numpy",
    "not on this path (field notes)": "tilelang z3-solver nvidia-cutlass-dsl(+libs) flash-attn-4 sgl-deep-gemm torchao",
    "not on this path (only quant/MoE/MLA/multimodal/modelscope code)": "humming-kernels pyelftools helion filecheck quack-kernels tokenspeed-mla tokenspeed-triton "
    "nccl4py torchcodec kernels kernels-data tomlkit modelscope modelscope-hub cryptography "
    "nvidia-cuda-nvcc/crt/nvvm/nvdisasm/cccl nvidia-mathdx nvidia-cudnn-frontend",
    "to fit the size budget (lazily imported; not on this path)": "py-spy (watchdog stack dumps only) llguidance outlines outlines-core airportsdata diskcache "
    "(grammar backends; --grammar-backend none) pycryptodomex (blobfile/azure connector) "
    "timm==1.0.16 (vision models; the image's own timm stands in)",
}


# (wheel name prefix, predicate on member name -> drop)
def _drop_sgl_kernel(n):
    return (
        n == "sgl_kernel/flash_ops.abi3.so"  # FA3, 1.12 GB
        or n.startswith("sgl_kernel/sm100/")  # Blackwell-only common ops
        or n.startswith("sgl_kernel/infllm_ops")  # InfLLM ops
        or n.startswith("sgl_kernel/flashmla_ops")  # FlashMLA ops
    )


def _drop_xgrammar(n):
    return n == "xgrammar/lib/libxgrammar.a"  # static library


def _drop_sglang(n):
    return n.startswith("sglang/multimodal_gen/")  # diffusion runtime (sglang serve/generate CLI only)


def _drop_mistral(n):
    return n.startswith("mistral_common/data/tekken_")  # bundled Mistral tekken vocabularies


def _drop_jedi(n):
    return n.startswith("jedi/third_party/")  # typeshed/django stubs (completion only)


def _drop_pycountry(n):
    return n.startswith("pycountry/locales/")  # translations (.mo)


def _drop_zstandard(n):
    return n.startswith("zstandard/_cffi")  # cffi backend; the C backend stays


SLIM = {
    "sglang_kernel-": _drop_sgl_kernel,
    "xgrammar-": _drop_xgrammar,
    "sglang-0": _drop_sglang,
    "mistral_common-": _drop_mistral,
    "jedi-": _drop_jedi,
    "pycountry-": _drop_pycountry,
    "zstandard-": _drop_zstandard,
}

K26OPS_DEPS = """
bcrypt==5.0.0 cffi==2.1.1 cryptography==50.0.2 decorator==5.3.1 deprecated==3.0.1
fabric==3.2.3 gitdb==4.0.12 gitpython==3.2.1 invoke==2.2.1 paramiko==5.1.0 pycparser==3.12
pynacl==1.6.2 smmap==5.0.3
""".split()


def sh(*a, **kw):
    return subprocess.run(list(a), check=True, **kw)


def norm(n):
    return n.lower().replace("_", "-").replace(".", "-")


def download(req, dest):
    args = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--index-url",
        "https://pypi.org/simple",
        "-d",
        str(dest),
    ]
    for p in PLATFORMS:
        args += ["--platform", p]
    env = dict(os.environ, PIP_CONSTRAINT="", PIP_FIND_LINKS="")
    subprocess.run(args + [req], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def find_wheel(d, req):
    name, ver = req.split("==")
    for f in sorted(d.glob("*.whl")):
        parts = f.name.split("-")
        if norm(parts[0]) == norm(name) and parts[1] == ver:
            return f
    raise SystemExit(f"wheel for {req} not found in {d}")


def rewrite(src: Path, dst: Path):
    """Re-zip deterministically, dropping slimmed members and their RECORD lines."""
    drop = next((fn for pre, fn in SLIM.items() if src.name.startswith(pre)), None)
    removed = []
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        keep = []
        for i in infos:
            if drop and drop(i.filename):
                removed.append((i.filename, i.file_size))
            else:
                keep.append(i)
        dist_info = [i for i in keep if ".dist-info/" in i.filename and i.filename.split("/")[0].endswith(".dist-info")]
        rec_name = next(i.filename for i in dist_info if i.filename.endswith("/RECORD"))
        gone = {n for n, _ in removed}
        keep.sort(key=lambda i: (i in dist_info, i.filename))
        stripped = {}
        for i in keep:
            if i.filename.endswith(".so"):
                new = strip_debug(i.filename, zin.read(i.filename))
                if new is not None:
                    stripped[i.filename] = new
                    STRIPPED.append((src.name, i.filename, i.file_size, len(new)))
        tmp = dst.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
            for i in keep:
                data = stripped.get(i.filename) or zin.read(i.filename)
                if i.filename == rec_name and (gone or stripped):
                    lines = data.decode().splitlines(keepends=True)
                    out = []
                    for l in lines:
                        path = l.split(",")[0]
                        if path in gone:
                            continue
                        if path in stripped:
                            b = stripped[path]
                            l = f"{path},{_record_hash(b)},{len(b)}\n"
                        out.append(l)
                    data = "".join(out).encode()
                zi = zipfile.ZipInfo(i.filename, date_time=FIXED_DATE)
                zi.compress_type = zipfile.ZIP_STORED
                zi.create_system = 3
                mode = (i.external_attr >> 16) & 0o777
                if i.is_dir():
                    zi.external_attr = (0o40755 << 16) | 0x10
                else:
                    zi.external_attr = (0o100755 if mode & 0o111 else 0o100644) << 16
                zout.writestr(zi, data)
        tmp.replace(dst)
    return removed


def _record_hash(data):
    import base64

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def strip_debug(name, data):
    """strip --strip-debug an ELF shared object carrying debug sections; else None."""
    if not name.endswith(".so") or data[:4] != b"\x7fELF" or len(data) < (1 << 20):
        return None
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as t:
        t.write(data)
    try:
        subprocess.run(
            ["strip", "--strip-debug", t.name], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        out = Path(t.name).read_bytes()
    finally:
        os.unlink(t.name)
    return out if len(out) < 0.95 * len(data) else None


def sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-download", action="store_true")
    ap.add_argument("--no-bundle", action="store_true")
    a = ap.parse_args()
    DL.mkdir(exist_ok=True)
    KD.mkdir(exist_ok=True)
    if not a.skip_download:
        todo = [r for r in WHEELS if not _have(DL, r)]
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda r: download(r, DL), todo))
        todo = [r for r in K26OPS_DEPS if not _have(KD, r)]
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda r: download(r, KD), todo))
    WH.mkdir(exist_ok=True)
    for f in WH.glob("*"):
        f.unlink()
    slimmed = {}
    lock = []
    for r in sorted(WHEELS, key=norm):
        src = find_wheel(DL, r)
        dst = WH / src.name
        removed = rewrite(src, dst)
        if removed:
            slimmed[src.name] = removed
        lock.append(f"{r} --hash=sha256:{sha256(dst)}")
    hdr = [
        "# wheelhouse.lock - sglang 0.5.17 runtime for the H200 device (cp312, manylinux x86_64)",
        "# generated by .device/prepare.py; hashes are of the wheels AS WRITTEN in wheelhouse/",
        "# (re-zipped: ZIP_STORED, date 1980-01-01, members sorted, dist-info last).",
        "# install: pip install --no-index --no-deps --require-hashes -r wheelhouse.lock --find-links wheelhouse",
        "# torch 2.11.0+cu130, triton 3.6.0, torchvision, torchaudio, numpy, numba/llvmlite and the",
        "# nvidia-* CUDA wheels come from the machine's image (/opt/torch/.venv), not from here.",
        "# Left out:",
    ]
    for k, v in EXCLUDED.items():
        hdr.append(f"#   {k}: {v}")
    hdr.append("# Slimmed (files removed; RECORD lines dropped):")
    for w, rem in slimmed.items():
        tot = sum(s for _, s in rem)
        hdr.append(f"#   {w}: {len(rem)} files, {tot} bytes ({tot / 2**20:.1f} MiB)")
        for n, s in sorted(rem):
            hdr.append(f"#     - {n} ({s} bytes)")
    strip_ver = subprocess.run(["strip", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    hdr.append(f"# Debug info stripped (strip --strip-debug, {strip_ver}; RECORD hash/size updated):")
    for w, n, a0, a1 in STRIPPED:
        hdr.append(f"#   {w}: {n} {a0} -> {a1} bytes")
    LOCK.write_text("\n".join(hdr + lock) + "\n")
    print(f"{len(lock)} wheels in {WH}")
    if not a.no_bundle:
        if BUNDLE.exists():
            BUNDLE.unlink()
        # deterministic tar: sorted names, fixed owner/mtime
        tar = subprocess.run(
            [
                "tar",
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@315532800",
                "-C",
                str(HERE),
                "-cf",
                "-",
                "wheelhouse",
                "wheelhouse.lock",
            ],
            check=True,
            stdout=subprocess.PIPE,
        ).stdout
        with open(BUNDLE, "wb") as f:
            subprocess.run(["xz", "-9e", "-T2", "-c"], input=tar, stdout=f, check=True)
        print(f"bundle {BUNDLE.stat().st_size} bytes ({BUNDLE.stat().st_size / 2**20:.2f} MiB)")
    kd = sum(p.stat().st_size for p in KD.glob("*.whl"))
    print(f"k26ops-deps {kd} bytes ({kd / 2**20:.2f} MiB), {len(list(KD.glob('*.whl')))} wheels")


def _have(d, r):
    try:
        find_wheel(d, r)
        return True
    except SystemExit:
        return False


if __name__ == "__main__":
    main()
