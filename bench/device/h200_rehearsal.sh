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
source bench/device/install_release.sh
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
