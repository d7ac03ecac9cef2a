#!/usr/bin/env bash
# The engine's --api-key as k26ops passes it (issue 35.2), for a check against the real
# SGLang on the device machine; no engine start, no GPU, no systemd needed.
#
#   bench/device/apikey_check.sh /tmp/k26-secrets.yaml [ENGINE_PYTHON]
#
# Writes the secret-flags file to $1 (mode 0600) exactly as a deploy renders it
# (k26ops.engine.units.engine_launch; the key: $K26OPS_CHECK_KEY or a made-up one) and
# prints the unit's argv (ExecStart words; the key is in none of them). With
# ENGINE_PYTHON (a release's venv/bin/python, e.g. /opt/k26ops/releases/current/venv/bin/python)
# it then lets that SGLang parse the argv the way launch_server does (its own
# add_cli_args + ConfigArgumentMerger for --config) and says whether api_key came
# back equal to the key, without printing the key.
set -euo pipefail
DEST=${1:?usage: $0 /path/to/secrets.yaml [ENGINE_PYTHON]}
ENGINE_PY=${2:-}
export K26OPS_CHECK_KEY=${K26OPS_CHECK_KEY:-sk-k26ops-check-$(date +%s)-\"q\$x}
export PYTHONPATH=/tmp/k26site:$PWD${PYTHONPATH:+:$PYTHONPATH}
ARGV_JSON=$(python3 - "$DEST" <<'PY'
import json, os, sys
from k26ops.engine import units
dest = sys.argv[1]
profile = {"model_path": "/models/tiny-qwen3", "python": "/opt/k26ops/releases/current/venv/bin/python",
           "speculative_algorithm": None, "extra_args": {"api-key": os.environ["K26OPS_CHECK_KEY"]},
           "secrets_file": dest}
argv, text = units.engine_launch(profile)
fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, text.encode()); os.close(fd); os.chmod(dest, 0o600)
assert os.environ["K26OPS_CHECK_KEY"] not in " ".join(argv)
print(json.dumps(argv))
PY
)
echo "secret-flags file: $DEST ($(stat -c '%a %U' "$DEST")), keys: $(grep -v '^#' "$DEST" | cut -d: -f1 | tr '\n' ' ')"
echo "unit argv (ExecStart): $(python3 -c 'import json,shlex,sys; print(shlex.join(json.loads(sys.argv[1])))' "$ARGV_JSON")"
[ -n "$ENGINE_PY" ] || exit 0
"$ENGINE_PY" - "$ARGV_JSON" <<'PY'
import argparse, json, os, sys
import sglang
from sglang.srt.server_args import ServerArgs
try:  # 0.5.23 keeps it under utils/, 0.5.17 beside server_args
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
except ImportError:
    from sglang.srt.server_args_config_parser import ConfigArgumentMerger
flags = json.loads(sys.argv[1])[3:]  # after python -m sglang.launch_server
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
try:
    merger = ConfigArgumentMerger(parser)
except TypeError:  # the oldest interface took the store_true names
    merger = ConfigArgumentMerger(boolean_actions=[a.dest for a in parser._actions
                                                   if isinstance(a, argparse._StoreTrueAction)])
ns = parser.parse_args(merger.merge_config_with_args(flags))
ok = ns.api_key == os.environ["K26OPS_CHECK_KEY"]
print(f"sglang {sglang.__version__}: api_key from --config {'EQUALS' if ok else 'DIFFERS FROM'} the key; "
      f"model_path {ns.model_path}")
sys.exit(0 if ok else 1)
PY
