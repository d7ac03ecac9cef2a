#!/usr/bin/env bash
# The SERVING path on the lent H200 (device tool; no systemd, no sshd): the real
# engine started with the recipe's flags as the unit runs them, its API key in a
# root-only --config file (never argv), then `k26ops bench` through SGLang's own
# serving benchmark and through k26ops' load generator, with `connection: local`.
# What it answers goes to $OUT (device.txt, engine logs, the bench JSON).
#
# 1. the RELEASED 0.5.17 engine (no patch): does its start-up log carry the key?
# 2. the redaction patch applied with the release's own patchset.py (as hosts do)
# 3. the patched engine: key absent from argv (ps) and from the log; /generate
#    401 without the key, 200 with it; then the two benches, per-cell accept.
# Needs what bench/device/h200_rehearsal.sh needs (carry .device/bundle.tar.xz,
# .device/k26ops-deps; made by bench/device/prepare_bundle.py).
set -uo pipefail
OUT=${OUT:-/tmp/k26out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
exec > >(tee -a "$OUT/device.txt") 2>&1
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,compute_cap --format=csv,noheader
source bench/device/install_release.sh
PY=$REL/venv/bin/python
export PYTHONPATH=/tmp/k26site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/cache/triton TVM_FFI_CACHE_DIR=/tmp/cache/tvm-ffi
mkdir -p /tmp/cache
"$PY" bench/device/make_models.py playbooks/recipes/models /models/tiny-qwen3 /models/tiny-dflash
el "model dirs written (configs + trained tokenizer, no weights)"

KEY="sk-h200-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
install -d -m 0700 /etc/k26ops
( umask 077; printf 'api-key: %s\n' "$KEY" > /etc/k26ops/engine-secret.yaml )
stat -c '%a %U %n' /etc/k26ops/engine-secret.yaml
# the recipe h200-dflash-0.5.17's flags (engine_profile + extra_args), dummy weights
ARGS=(--model-path /models/tiny-qwen3 --load-format dummy --speculative-draft-load-format dummy
      --speculative-algorithm DFLASH --speculative-draft-model-path /models/tiny-dflash
      --speculative-dflash-block-size 8 --attention-backend triton --cuda-graph-max-bs-decode 4
      --cuda-graph-max-bs-prefill 256 --tp-size 1 --trust-remote-code --host 127.0.0.1 --port 30000
      --sampling-backend pytorch --grammar-backend none --max-running-requests 4 --context-length 2048
      --enable-metrics --mem-fraction-static 0.1 --config /etc/k26ops/engine-secret.yaml)

start() {  # $1: log file
  setsid "$PY" -m sglang.launch_server "${ARGS[@]}" > "$1" 2>&1 &
  EPID=$!
}
stop() { kill -TERM -- "-$EPID" 2>/dev/null; for _ in $(seq 30); do kill -0 "$EPID" 2>/dev/null || break; sleep 1; done
         kill -KILL -- "-$EPID" 2>/dev/null; wait "$EPID" 2>/dev/null; }
leaks() {  # where the key shows: any process's argv (/proc/*/cmdline), the log
  K26_KEY="$KEY" python3 -c '
import os, sys
key = os.environ["K26_KEY"].encode()
hits = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmd = open("/proc/%s/cmdline" % pid, "rb").read()
    except OSError:
        continue
    if key in cmd and int(pid) != os.getpid():
        hits.append(pid + " " + cmd.replace(b"\0", b" ").decode(errors="replace")[:160].replace(key.decode(), "<KEY>"))
print("processes whose argv holds the key: %d" % len(hits))
for h in hits: print("  " + h)
'
  echo "log lines holding the key: $(grep -F -c -- "$KEY" "$1")"
}

# 1. the released engine, unpatched: its start-up log line (before weights load)
if [ "${SMOKE:-0}" != 1 ]; then  # SMOKE=1: only the patched engine and the deploy's smoke (deploy_smoke.py)
start "$OUT/engine-unpatched.log"
for _ in $(seq 120); do grep -q "server_args=" "$OUT/engine-unpatched.log" && break; sleep 1; done
el "unpatched engine logged its server_args"
leaks "$OUT/engine-unpatched.log"
stop; el "unpatched engine stopped"
fi

# 2. the series applied as a deploy applies it (no tags: the redaction patch only)
python3 "$REL/k26ops/patchset.py" apply --root "$SP" --state "$REL/patch-state" \
    --series patches/sglang-0.5.17/series --installed sglang==0.5.17
el "series applied"

# 3. the patched engine, served
start "$OUT/engine.log"
ok=0
for _ in $(seq 420); do
  code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health || true)
  [ "$code" = 200 ] && { ok=1; break; }
  kill -0 "$EPID" 2>/dev/null || break
  sleep 1
done
el "ready=$ok (health $code)"
if [ "$ok" = 1 ]; then
  leaks "$OUT/engine.log"
  grep -o "api_key=[^,]*" "$OUT/engine.log" | sort | uniq -c || echo "no api_key= in the log"
  echo "generate without key: $(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
       -d '{"text":"hi","sampling_params":{"max_new_tokens":4}}' http://127.0.0.1:30000/generate)"
  echo "generate with key: $(curl -s -o "$OUT/generate.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
       -H 'Content-Type: application/json' -d '{"text":"def main():","sampling_params":{"max_new_tokens":16,"temperature":0}}' \
       http://127.0.0.1:30000/generate)"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d.get("meta_info",{}); print({k: m.get(k) for k in ("completion_tokens","spec_verify_ct","spec_accept_length")})' "$OUT/generate.json" || true
  if [ "${SMOKE:-0}" = 1 ]; then
    K26_KEY="$KEY" python3 bench/device/deploy_smoke.py /tmp/h200.yml 30000 > "$OUT/deploy-smoke.json"
    echo "deploy smoke exit $?"; el "deploy smoke done"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: (d[k]["failed"], [r["status"] for r in d[k]["results"]], d[k].get("deploy_says")) for k in ("without_key","with_key")})' "$OUT/deploy-smoke.json"
  fi
  echo "      extra_flags: [--api-key, \"$KEY\"]" >> /tmp/h200.yml  # the key the bench must send
  chmod 600 /tmp/h200.yml
  for gen in ${GENERATORS-sglang k26ops}; do
    python3 -m k26ops -i /tmp/h200.yml --json bench --generator $gen --concurrency 1,4 --temperatures 0,0.7 \
        --input-len 64 --output-len 64 --runs ${RUNS:-2} > "$OUT/bench-$gen.json" 2> /tmp/bench.err
    echo "bench --generator $gen exit $?"; el "bench $gen done"; tail -5 /tmp/bench.err
  done
  curl -s http://127.0.0.1:30000/metrics | grep -E "^sglang:(generation_tokens_total|spec_verify_calls_total|spec_accept_length)" > "$OUT/metrics-end.txt"
  curl -s -H "Authorization: Bearer $KEY" http://127.0.0.1:30000/server_info \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print("server_info lifetime accept:", (d.get("internal_states") or [{}])[0].get("avg_spec_accept_length"))' || true
fi
stop; el "engine stopped"
# the key must not leave the machine in what comes back
for f in "$OUT"/*; do sed -i "s/$KEY/<KEY>/g" "$f"; done
nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,PERFORMANCE,TEMPERATURE,RESET_STATUS > "$OUT/nvidia-smi-q-health.txt" 2>&1 || true
nvidia-smi --query-gpu=index,pci.bus_id,clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure --format=csv > "$OUT/nvidia-smi-health.csv" 2>&1 || true
(dmesg 2>&1 | grep -iE "nvrm|xid" | tail -20) > "$OUT/dmesg-nvrm.txt" || true
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
el "done"
