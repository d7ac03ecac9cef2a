#!/usr/bin/env bash
# The real-engine rehearsal on the lent H200 (device tool; no network, no systemd,
# no sshd): installs a release the way hosts do, then runs `k26ops rehearse`
# with `connection: local`, and writes what the real engine answered to $OUT.
#
# Needs, in the checkout (ignored path .device/, made by bench/device/prepare_bundle.py):
#   .device/bundle.tar.xz   wheelhouse/ (sglang 0.5.17's set for cp312, re-zipped
#                           stored, some slimmed) + wheelhouse.lock (sha256 of each)
#   .device/k26ops-deps/    k26ops' own dependencies the machine lacks (fabric, ...)
# The machine's own torch 2.11.0+cu130 / triton 3.6.0 stand in for the lock's
# torch, triton and nvidia-* wheels (its image at /opt/torch/.venv).
set -euo pipefail
OUT=${OUT:-/tmp/k26out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
exec > >(tee -a "$OUT/device.txt") 2>&1
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,compute_cap --format=csv,noheader
MODE=${MODE:-main}   # main: rehearse, then rehearse --probe; dsv3: a tiny DeepseekV3 (K2 family) pair
REL=/opt/k26ops/releases/h200-dflash-0.5.17
if [ -f "$REL/manifest.json" ]; then el "release already installed (warm machine)"; else
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k26site .device/k26ops-deps/*.whl
el "k26ops deps installed"
mkdir -p /tmp/wh "$REL"
tar -C /tmp/wh -xJf .device/bundle.tar.xz
el "bundle unpacked: $(ls /tmp/wh/wheelhouse | wc -l) wheels"
python3 -m venv --without-pip "$REL/venv"
SP=$("$REL/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# the release installs exactly the locked wheels, hash-checked, from the wheelhouse, with no index
python3 -m pip install -q --no-index --no-deps --require-hashes --no-compile --target "$SP" \
    -r /tmp/wh/wheelhouse.lock --find-links /tmp/wh/wheelhouse
# DEVICE ONLY: the image's torch/triton/nvidia-* after the release's own packages
python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' > "$SP/zz-device-torch.pth"
mkdir -p "$REL/k26ops"; cp k26ops/release/patchset.py "$REL/k26ops/patchset.py"
printf '{"site_packages": "%s", "engine": {"base": "sglang==0.5.17"}, "made_by": "bench/device/h200_rehearsal.sh"}\n' "$SP" > "$REL/manifest.json"
ln -sfn h200-dflash-0.5.17 /opt/k26ops/releases/current
el "release installed ($(du -sh "$SP" | cut -f1)); sglang $("$REL/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')"
fi
mkdir -p /tmp/cache
cat > /tmp/h200.yml <<INV
hosts:
  h200:
    connection: local
    vars:
      recipe: h200-dflash-0.5.17
      model_path: /models/tiny-qwen3
      engine_env: {HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1", XDG_CACHE_HOME: /tmp/cache,
                   TRITON_CACHE_DIR: /tmp/cache/triton, TVM_FFI_CACHE_DIR: /tmp/cache/tvm-ffi}
INV
export PYTHONPATH=/tmp/k26site:$PWD PYTHONUNBUFFERED=1
set +e
if [ "$MODE" = final ]; then
  nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1
  python3 -m k26ops -i /tmp/h200.yml --json rehearse --concurrency 1,4 --temperatures 0,0.7 \
      --input-len 64 --output-len 64 --request-timeout 300 --ready-timeout 420 --save-log "$OUT/r4" \
      > "$OUT/rehearse-final.json" 2> /tmp/rehearse.err
  echo "rehearse exit $?"; el "rehearse done"; tail -15 /tmp/rehearse.err
  for m in tiny-dsv3 tiny-dsv3-dflash; do mkdir -p /models/$m; cp bench/device/models/$m/config.json /models/$m/; done
  sed -i 's#model_path: /models/tiny-qwen3#model_path: /models/tiny-dsv3\n      draft_model_path: /models/tiny-dsv3-dflash#' /tmp/h200.yml
  python3 -m k26ops -i /tmp/h200.yml --json rehearse --layers 2 --no-bench --request-timeout 300 \
      --ready-timeout 300 --save-log "$OUT/r5" > "$OUT/rehearse-dsv3-layers2.json" 2> /tmp/rehearse.err
  echo "rehearse (dsv3 --layers 2) exit $?"; el "done"; tail -15 /tmp/rehearse.err
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  rm -f "$OUT"/r*/*.json; exit 0
fi
if [ "$MODE" = dsv3 ]; then
  for m in tiny-dsv3 tiny-dsv3-dflash; do mkdir -p /models/$m; cp bench/device/models/$m/config.json /models/$m/; done
  sed -i 's#model_path: /models/tiny-qwen3#model_path: /models/tiny-dsv3\n      draft_model_path: /models/tiny-dsv3-dflash#' /tmp/h200.yml
  python3 -m k26ops -i /tmp/h200.yml --json rehearse --concurrency 1,4 --temperatures 0,0.7 \
      --input-len 64 --output-len 64 --request-timeout 300 --ready-timeout 480 --save-log "$OUT/r3" ${REHEARSE_ARGS:-} \
      > "$OUT/rehearse-dsv3.json" 2> /tmp/rehearse.err
  echo "rehearse (dsv3) exit $?"; el "dsv3 rehearsal done"; tail -15 /tmp/rehearse.err
  rm -f "$OUT"/r*/*.json; exit 0
fi
python3 -m k26ops -i /tmp/h200.yml --json rehearse --concurrency 1,4 --temperatures 0,0.7 \
    --input-len 64 --output-len 64 --request-timeout 300 --ready-timeout 420 --save-log "$OUT/r1" \
    > "$OUT/rehearse.json" 2> /tmp/rehearse.err
echo "rehearse exit $?"; el "rehearse done"; tail -15 /tmp/rehearse.err
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 
if [ $(( $(date +%s) - T0 )) -lt ${PROBE_IF_UNDER:-400} ]; then
  python3 -m k26ops -i /tmp/h200.yml --json rehearse --probe --no-bench --request-timeout 200 \
      --ready-timeout 300 --save-log "$OUT/r2" > "$OUT/rehearse-probe.json" 2> /tmp/rehearse-probe.err
  echo "rehearse --probe exit $?"; el "probe rehearsal done"; tail -15 /tmp/rehearse-probe.err
fi
ls -la /tmp | grep -c k26ops-rehearse- || true
rm -f "$OUT"/r*/*.json
