"""Lab fixture: the lab model, a real small one (issue 44).

Three real safetensors shards of random F16 tensors (about 21 MB each), their
`model.safetensors.index.json` and the recipe's K2.6 config.json: what `check` lists,
`k26ops model verify` hashes and `model sync` moves between lab hosts. The engine
stand-in reads no weights. The bytes are the same on every machine (the committed
playbooks/recipes/lab.model was made from them with `k26ops model manifest`):

- the tensors' bytes are SHAKE-256 of a fixed seed (a stream hashlib defines), each
  16-bit value masked to an IEEE F16 with |x| in [2^-7, 2^-6) (no NaN or Inf; F16,
  not BF16, so that numpy, and so safetensors.numpy, reads it);
- the safetensors format written by hand, as its spec says
  (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length,
  the JSON header (tensor -> dtype, shape, data_offsets; keys sorted, no spaces),
  padded with spaces to a multiple of 8, then the tensors' bytes back to back.
  tests/features/test_weights.py loads every shard with the real `safetensors` package.

Built once per machine in the cache (written to a temp dir, renamed into place) and
bound read-only into every lab host at LAB_MODEL.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from k26ops import resources

VERSION = 1  # bump when the bytes change (and remake playbooks/recipes/lab.model)
SHARDS = 3
# per shard: (name suffix, shape) -> 2 x 4096 x 1280 x 2 bytes = 21 MB
TENSORS = (("mlp.up_proj.weight", (4096, 1280)), ("mlp.down_proj.weight", (1280, 4096)))
FILES = (
    "config.json",
    "model.safetensors.index.json",
    *(f"model-{i:05d}-of-{SHARDS:05d}.safetensors" for i in range(1, SHARDS + 1)),
)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "k26ops" / f"lab-model-v{VERSION}"


def _f16(seed: str, count: int) -> bytes:
    raw = bytearray(hashlib.shake_256(seed.encode()).digest(count * 2))
    raw[1::2] = raw[1::2].translate(_HIGH)  # each little-endian value's high byte: sign + exponent's top 7 bits
    return bytes(raw)


_HIGH = bytes((b & 0x83) | 0x20 for b in range(256))  # exponent 01000: |x| in [2^-7, 2^-6)


def safetensors_bytes(tensors: dict[str, tuple[tuple[int, ...], bytes]]) -> bytes:
    """The safetensors file of {name: (shape, F16 bytes)}."""
    header, offset = {}, 0
    for name in sorted(tensors):
        shape, data = tensors[name]
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(tensors[n][1] for n in sorted(tensors))


def _write(d: Path) -> None:
    weight_map, total = {}, 0
    for i in range(1, SHARDS + 1):
        name = f"model-{i:05d}-of-{SHARDS:05d}.safetensors"
        tensors = {}
        for suffix, shape in TENSORS:
            tname = f"model.layers.{i - 1}.{suffix}"
            tensors[tname] = (shape, _f16(f"k26ops-lab-model-v{VERSION}/{tname}", shape[0] * shape[1]))
            weight_map[tname] = name
            total += shape[0] * shape[1] * 2
        (d / name).write_bytes(safetensors_bytes(tensors))
    index = {
        "metadata": {"total_size": total, "k26ops_lab_fixture": "random F16 tensors (k26ops/lab/model_fixture.py)"},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (d / FILES[1]).write_text(json.dumps(index, indent=2) + "\n")
    shutil.copyfile(resources.path("playbooks", "recipes", "models", "kimi-k2.6", "config.json"), d / "config.json")


def ensure() -> Path:
    """The lab model dir, built once (atomically) in the cache."""
    target = cache_dir()
    if all((target / f).is_file() for f in FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        _write(work)
        for f in FILES:
            (work / f).chmod(0o644)
        work.chmod(0o755)
        try:
            work.rename(target)
        except OSError:  # another process put it there first
            if not all((target / f).is_file() for f in FILES):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
