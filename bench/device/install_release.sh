# Sourced by the device scripts (bench/device/h200_*.sh): installs the recipe's
# release the way hosts do (locked, hash-checked wheels from a wheelhouse, no
# index) into /opt/k26ops/releases/h200-dflash-0.5.17 and points `current` at it.
# Needs el() and the carried .device/{bundle.tar.xz,k26ops-deps}. Sets REL and SP, and
# writes /tmp/h200.yml: the one-host `connection: local` inventory both scripts use.
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
SP=$("$REL/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# No cache variables here: k26ops points the engine's (TRITON_CACHE_DIR, FLASHINFER_WORKSPACE_BASE,
# TVM_FFI_CACHE_DIR, CUDA_CACHE_PATH, TORCHINDUCTOR_CACHE_DIR, XDG_CACHE_HOME for 0.5.17) at the
# release's own cache dir, /opt/k26ops/engine-cache/<release>/<gpu-sm-tp-spec> (an engine_env setting would win).
cat > /tmp/h200.yml <<INV
hosts:
  h200:
    connection: local
    vars:
      recipe: h200-dflash-0.5.17
      model_path: /models/tiny-qwen3
      engine_env: {HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1"}
INV
