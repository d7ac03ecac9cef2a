#!/usr/bin/env bash
# What the REAL engine (sglang 0.5.17 on the lent H200) does with inputs that k26ops'
# preflight refuses before a deploy touches the unit: a drafter whose block size
# differs from --speculative-dflash-block-size, a model path or drafter path that does
# not exist. Each start's log goes to $OUT/<case>.log with its exit (or ready) state,
# so the classifier and the preflight rules are tested on what the engine really says.
# CASES=oom: instead, the engine running out of GPU memory while it initialises its
# attention backend (issue 46: no public log of that phase had the whole traceback): a
# plain tiny Qwen3, the flashinfer backend, and --mem-fraction-static so high that the KV
# pool leaves less than the backend's workspace (512 MiB for Qwen3) free; FRACS fractions,
# in case one leaves room enough (the log names the phase either way).
# Carry what bench/device/h200_serve.sh carries.
set -uo pipefail
OUT=${OUT:-/tmp/k26out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
exec > >(tee -a "$OUT/device.txt") 2>&1
source bench/device/install_release.sh
PY=$REL/venv/bin/python
export PYTHONPATH=/tmp/k26site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/cache/triton TVM_FFI_CACHE_DIR=/tmp/cache/tvm-ffi
mkdir -p /tmp/cache
[ -f /models/tiny-qwen3/tokenizer.json ] || "$PY" bench/device/make_models.py playbooks/recipes/models /models/tiny-qwen3 /models/tiny-dflash
base() {  # $1 model, $2 drafter, $3 block size
  echo --model-path "$1" --load-format dummy --speculative-draft-load-format dummy \
       --speculative-algorithm DFLASH --speculative-draft-model-path "$2" --speculative-dflash-block-size "$3" \
       --attention-backend triton --cuda-graph-max-bs-decode 4 --cuda-graph-max-bs-prefill 256 --tp-size 1 \
       --trust-remote-code --host 127.0.0.1 --port 30000 --sampling-backend pytorch --grammar-backend none \
       --max-running-requests 4 --context-length 2048 --enable-metrics --mem-fraction-static 0.1
}
case_run() {  # $1 name, $2 seconds to wait, rest: args
  local name=$1 wait=$2; shift 2
  setsid "$PY" -m sglang.launch_server "$@" > "$OUT/$name.log" 2>&1 & local pid=$!
  local state=timeout
  for _ in $(seq "$wait"); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; state="exited $?"; break; fi
    if [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health)" = 200 ]; then
      state="ready; generate: $(curl -s -H 'Content-Type: application/json' \
        -d '{"text":"def main():","sampling_params":{"max_new_tokens":16,"temperature":0}}' \
        http://127.0.0.1:30000/generate | head -c 400)"
      break
    fi
    sleep 1
  done
  kill -TERM -- "-$pid" 2>/dev/null; for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  el "$name: $state"
}
plain_flashinfer() {  # $1 --mem-fraction-static
  echo --model-path /models/tiny-qwen3 --load-format dummy --attention-backend flashinfer \
       --sampling-backend pytorch --grammar-backend none --tp-size 1 --trust-remote-code --host 127.0.0.1 \
       --port 30000 --context-length 2048 --max-running-requests 4 --cuda-graph-max-bs-decode 4 \
       --mem-fraction-static "$1"
}
if [ "${CASES:-refusals}" = oom ]; then
  for frac in ${FRACS:-0.999 0.996}; do
    case_run "attn-init-oom-$frac" 240 $(plain_flashinfer "$frac")
    grep -n -i -E 'memory pool end|out of memory|init_attention|flashinfer_backend|Capture' "$OUT/attn-init-oom-$frac.log" | head -12
  done
  [ "${DFLASH:-1}" = 1 ] || { el done; exit 0; }
  # the same with the recipe's DFLASH drafter (its worker has an attention backend of its own); argparse's last wins
  case_run attn-init-oom-dflash-0.999 240 $(base /models/tiny-qwen3 /models/tiny-dflash 8) \
    --attention-backend flashinfer --mem-fraction-static 0.999
  grep -n -i -E 'memory pool end|out of memory|init_attention|flashinfer_backend|Capture' "$OUT/attn-init-oom-dflash-0.999.log" | head -12
else
  case_run model-path-missing 120 $(base /models/no-such-model /models/tiny-dflash 8)
  case_run drafter-path-missing 200 $(base /models/tiny-qwen3 /models/no-such-drafter 8)
  case_run drafter-block-size-4-vs-8 300 $(base /models/tiny-qwen3 /models/tiny-dflash 4)
fi
el done
