#!/usr/bin/env bash
# The cold/warm pair on the real engine (device tool; issue 43): the unit's own command line
# started twice from the same release, measured by bench/device/warmstart.py:
#   STEP=cold : the release's engine cache emptied, one start (it compiles everything);
#   STEP=warm : the cache emptied again, `k26ops rehearse` fills it (dummy weights, greedy then
#               sampled requests), then one start, which must compile nothing new.
#   STEP=all  : both (about 10 min cold on an H200: split it over two calls of the 10-min limit,
#               the machine kept warm between them: install_release.sh skips an installed release).
# Writes $OUT/warmstart-{cold,warm}.json (gpu, engine, ready_s, capture_s, first_greedy_s,
# first_sampled_s, compiled_new, the TTFGT timeline), the rehearsal's JSON and the engine logs.
# Needs what bench/device/h200_rehearsal.sh needs (carry .device/bundle.tar.xz, .device/k26ops-deps).
set -uo pipefail
OUT=${OUT:-/tmp/k26out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
exec > >(tee -a "$OUT/device.txt") 2>&1
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,compute_cap --format=csv,noheader
source bench/device/install_release.sh
export PYTHONPATH=/tmp/k26site:$PWD PYTHONUNBUFFERED=1
"$REL/venv/bin/python" bench/device/make_models.py playbooks/recipes/models /models/tiny-qwen3 /models/tiny-dflash
STEP=${STEP:-all}
if [ "$STEP" = cold ] || [ "$STEP" = all ]; then
  python3 bench/device/warmstart.py /tmp/h200.yml cold --wipe > "$OUT/warmstart-cold.json"
  echo "cold exit $?"; el "cold start measured"; cp /tmp/warmstart-cold.log "$OUT/" 2>/dev/null
fi
if [ "$STEP" = warm ] || [ "$STEP" = all ]; then
  CACHE=$(python3 -c 'import json; print(json.load(open("'"$OUT"'/warmstart-cold.json"))["cache_dir"])' 2>/dev/null \
          || ls -d /opt/k26ops/engine-cache/*/* | head -1)
  rm -rf "$CACHE"; el "emptied $CACHE"
  python3 -m k26ops -i /tmp/h200.yml --json rehearse --no-bench --request-timeout 300 --ready-timeout 420 \
      --save-log "$OUT/rw" > "$OUT/rehearse-fill.json" 2> /tmp/rehearse.err
  echo "rehearse exit $?"; el "rehearsal filled the cache"; tail -5 /tmp/rehearse.err
  python3 bench/device/warmstart.py /tmp/h200.yml warm > "$OUT/warmstart-warm.json"
  echo "warm exit $?"; el "warm start measured"; cp /tmp/warmstart-warm.log "$OUT/" 2>/dev/null
  rm -f "$OUT"/rw/*.json
fi
for f in "$OUT"/warmstart-*.json; do
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], {k: d.get(k) for k in ("ready_s","capture_s","first_greedy_s","first_sampled_s","compiled_new","error")})' "$f"
done
