#!/usr/bin/env bash
# The service around the engine, recorded on the lent GPU (device tool; no systemd, no sshd):
# cold start, SIGTERM drain with a stream in flight, warm restart with the same cache dir, and
# sglang-router 0.3.2 in front of it (bench/device/record_service.py says what each part does).
# Results to $OUT: service-record.json, engine-{cold,warm}.log, router.log, router-help.txt,
# metrics-full.txt, device.txt.
#
# Needs what bench/device/h200_rehearsal.sh needs (carry .device/bundle.tar.xz, .device/k26ops-deps)
# and the sglang-router wheel staged at /root/stage by an earlier call on the same warm machine
# (the bundle and the 30 MB router wheel do not fit the 64 MiB of one call):
#   call 1 (carry .whl):  mkdir -p /root/stage && cp .whl/sglang_router-*.whl /root/stage/
#   call 2 (carry .device): bash bench/device/service_record.sh
set -uo pipefail
OUT=${OUT:-/tmp/k26out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
exec > >(tee -a "$OUT/device.txt") 2>&1
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,compute_cap --format=csv,noheader
source bench/device/install_release.sh
PY=$REL/venv/bin/python
python3 -m pip install -q --no-index --no-deps --target /tmp/router /root/stage/sglang_router-*.whl && el "router unpacked"
"$PY" bench/device/make_models.py playbooks/recipes/models /models/tiny-qwen3 /models/tiny-dflash
el "model dirs written"
CACHE=/tmp/engine-cache; rm -rf "$CACHE"; mkdir -p "$CACHE"
# every cache variable 0.5.17's stack reads, under one dir (0.5.23 adds SGLANG_CACHE_DIR)
export PYTHONPATH=/tmp/router:/tmp/k26site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       XDG_CACHE_HOME=$CACHE TRITON_CACHE_DIR=$CACHE/triton TVM_FFI_CACHE_DIR=$CACHE/tvm-ffi \
       FLASHINFER_WORKSPACE_BASE=$CACHE CUDA_CACHE_PATH=$CACHE/nv TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor \
       SGLANG_CACHE_DIR=$CACHE/sglang
python3 bench/device/record_service.py --py "$PY" --cache "$CACHE" --out "$OUT" ${RECORD_ARGS:-} -- \
  --model-path /models/tiny-qwen3 --load-format dummy --speculative-draft-load-format dummy \
  --speculative-algorithm DFLASH --speculative-draft-model-path /models/tiny-dflash \
  --speculative-dflash-block-size 8 --attention-backend triton --cuda-graph-max-bs-decode 4 \
  --cuda-graph-max-bs-prefill 256 --tp-size 1 --trust-remote-code --host 127.0.0.1 --port 30000 \
  --sampling-backend pytorch --grammar-backend none --max-running-requests 4 --context-length 4096 \
  --enable-metrics --mem-fraction-static 0.1
el "record done (rc $?)"
find "$CACHE" -type f | sed "s#$CACHE/##" | awk -F/ '{print $1"/"$2}' | sort | uniq -c | sort -rn | head -20
