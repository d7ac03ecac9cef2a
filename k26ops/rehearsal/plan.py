"""The pure half of a rehearsal: what changes in the unit's command line and in
the model configs, and what the engine's log says about its CUDA graphs.

A rehearsal runs the SAME command line as the unit: same module, speculative
algorithm, drafter settings, block size / budget, attention backends, page
size, CUDA-graph settings and TP size. Only what a rehearsal must change is
changed, and each change is listed in the report:
  - model and drafter paths -> private copies holding config.json (and a real
    model dir's small files: tokenizer, remote code), never weights;
  - `--load-format dummy` (and the drafter's) so no weight is read;
  - `--skip-tokenizer-init`: requests are token ids;
  - a private loopback port, the memory fraction, multi-node flags dropped
    (one host rehearses alone) and the secret flags dropped (loopback only):
    `--api-key` and k26ops' own `--config ...-secrets.yaml` that carries them.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from k26ops.errors import UserError

TMP = "{TMP}"  # the agent puts the rehearsal's temp dir here


def record_path(state_dir: str) -> str:
    """Where a running rehearsal's handle is kept on the host (its stop removes it): what a
    killed run left is found there by the next rehearse (removed) and by status (shown)."""
    return f"{state_dir}/rehearsal.json"


DROP_WITH_VALUE = (
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--api-key",
    "--load-format",
    "--speculative-draft-load-format",
    "--tokenizer-path",
    "--port",
    "--host",
    "--mem-fraction-static",
    "--model-path",
    "--speculative-draft-model-path",
)
DROP_BARE = ("--skip-tokenizer-init",)
SECRETS_SUFFIX = "-secrets.yaml"  # launch.secrets_file_beside


@dataclass
class Options:
    """A rehearsal's knobs (CLI, recipe `rehearsal:`, or deploy --rehearse)."""

    port: int | None = None  # default: the serving port + 100
    mem_fraction: float = 0.05
    layers: int | None = None  # None: the model's own number of layers
    tp_size: int | None = None  # None: the unit's
    ready_timeout: float = 1800.0
    request_timeout: float = 600.0  # a cold first sampled request JIT-builds kernels (about 90 s on an H200)
    bench: bool = True
    concurrency: list[int] = field(default_factory=lambda: [1, 4])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    input_len: int = 128
    output_len: int = 64
    num_prompts: int = 8
    draft_dummy_flag: bool = True  # --speculative-draft-load-format dummy (the engine must know it)
    serving: str = "refuse"  # refuse | alongside | stop: when the serving engine is active
    release: str | None = None  # a release id; None: current
    deadline_s: int = 3600  # the engine is killed on the host at this age whatever happens
    probe: bool = False
    expected_load_s: float | None = None  # the recipe's real model load time (what a caught crash saves)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _split(word: str) -> tuple[str, str | None]:
    flag, eq, val = word.partition("=")
    return (flag, val) if eq and flag.startswith("--") else (word, None)


def rehearsal_argv(argv: list[str], opts: Options, *, port: int, has_draft: bool) -> tuple[list[str], list[str]]:
    """The unit's argv (python -m MODULE flags...) changed as a rehearsal must;
    (argv, what changed, one line each). Paths are under TMP."""
    if len(argv) < 3 or argv[1] != "-m":
        raise UserError(f"rehearsal: the unit's command line is not `python -m MODULE ...`: {' '.join(argv[:3])}")
    head, words = argv[:3], argv[3:]
    out, changes, i = [], [], 0
    seen: dict[str, str | None] = {}
    while i < len(words):
        flag, inline = _split(words[i])
        nxt = inline if inline is not None else (words[i + 1] if i + 1 < len(words) else "")
        if flag == "--config" and nxt.endswith(SECRETS_SUFFIX):
            seen["--api-key"] = None  # k26ops' secrets file (launch.engine_argv): the secret flags, dropped
            i += 1 if inline is None else 0
        elif flag in DROP_WITH_VALUE:
            val = inline
            if inline is None and i + 1 < len(words) and not words[i + 1].startswith("--"):
                val, i = words[i + 1], i + 1
            seen[flag] = val
        elif flag in DROP_BARE:
            seen[flag] = None
        elif flag == "--tp-size" and opts.tp_size:
            val = inline if inline is not None else (words[i + 1] if i + 1 < len(words) else None)
            i += 0 if inline is not None else 1
            out += ["--tp-size", str(opts.tp_size)]
            changes.append(f"--tp-size {val} -> {opts.tp_size}")
        else:
            out.append(words[i])
        i += 1
    if "--model-path" not in seen:
        raise UserError("rehearsal: the unit's command line has no --model-path")
    new = ["--model-path", f"{TMP}/model", "--load-format", "dummy"]
    changes.append(f"--model-path {seen['--model-path']} -> a copy of its config only, --load-format dummy")
    if has_draft:
        new += ["--speculative-draft-model-path", f"{TMP}/draft"]
        if opts.draft_dummy_flag:
            new += ["--speculative-draft-load-format", "dummy"]
        changes.append(
            f"--speculative-draft-model-path {seen.get('--speculative-draft-model-path')} -> "
            "a copy of its config only" + (", dummy weights" if opts.draft_dummy_flag else "")
        )
    new += ["--skip-tokenizer-init"]
    changes.append("--skip-tokenizer-init: requests are token ids")
    new += ["--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", f"{opts.mem_fraction:g}"]
    changes.append(f"port {seen.get('--port') or 'default'} -> {port} on 127.0.0.1")
    changes.append(f"--mem-fraction-static {seen.get('--mem-fraction-static') or 'default'} -> {opts.mem_fraction:g}")
    for flag in ("--nnodes", "--node-rank", "--dist-init-addr"):
        if flag in seen:
            changes.append(f"{flag} dropped (one host rehearses alone)")
    if "--api-key" in seen:
        changes.append(
            "--api-key dropped, with the other secret flags in k26ops' --config file (the rehearsal listens on loopback only)"
        )
    return head + new + out, changes


def graphs_on(argv: list[str]) -> bool:
    """Whether the command line leaves CUDA graphs on (0.5.23 also spells it
    --cuda-graph-backend-decode disabled)."""
    words = " ".join(argv)
    return "--disable-cuda-graph" not in argv and not re.search(r"--cuda-graph-backend-decode[= ]disabled", words)


# ---------------------------------------------------------------- model configs


def layer_count(config: dict) -> int | None:
    for c in (config, config.get("text_config") or {}):
        if isinstance(c.get("num_hidden_layers"), int):
            return c["num_hidden_layers"]
    return None


def fit_model(config: dict, layers: int | None) -> tuple[dict, list[str]]:
    """The target's config with `layers` layers (top level and a multimodal
    model's text_config), and what that means."""
    cfg = copy.deepcopy(config)
    have = layer_count(cfg)
    if not layers or have is None or layers >= have:
        return cfg, ([] if not layers or have is None else [f"--layers {layers}: the model has {have}; kept {have}"])
    notes = [f"target layers {have} -> {layers} (config override; the GPUs need not hold the full model)"]
    for c in (cfg, cfg.get("text_config")):
        if isinstance(c, dict) and isinstance(c.get("num_hidden_layers"), int):
            c["num_hidden_layers"] = layers
            dense = c.get("first_k_dense_replace")
            if isinstance(dense, int) and dense >= layers:
                notes.append(
                    f"first_k_dense_replace {dense} >= {layers} layers: every layer is dense, "
                    "so no MoE layer is rehearsed; use --layers > " + str(dense)
                )
    return cfg, notes


def _layer_ids(draft: dict) -> tuple[dict, str] | None:
    for holder in (draft.get("dflash_config"), draft):
        if isinstance(holder, dict) and isinstance(holder.get("target_layer_ids"), list):
            return holder, "target_layer_ids"
    return None


def fit_draft(draft: dict, target_layers: int | None) -> tuple[dict, list[str]]:
    """The DFlash drafter reads the target's hidden states after the layers
    `target_layer_ids`; the target captures them "before layer id + 1"
    (sglang 0.5.17 models/qwen3.py:713 and deepseek_v2.py:3161
    set_dflash_layers_to_capture), so with N target layers the ids must be in
    0..N-2 (the last layer's output has no next layer to be captured at: a
    real H200 run with ids [0, 1] on 2 layers died `captured 1 of 2 aux
    hidden states`). With fewer target layers the ids are spread over 0..N-2;
    num_target_layers follows."""
    cfg = copy.deepcopy(draft)
    found = _layer_ids(cfg)
    if not found or not target_layers:
        return cfg, []
    holder, key = found
    ids = holder[key]
    usable = target_layers - 1  # ids 0..N-2
    notes = []
    if not all(isinstance(i, int) and 0 <= i < usable for i in ids):
        k = len(ids)
        if k > usable:
            raise UserError(
                f"rehearsal: the drafter reads {k} target layers ({key} {ids}), the outputs of "
                f"layers 0..N-2 of an N-layer target; give --layers {k + 1} or more"
            )
        new = sorted({round(j * (usable - 1) / max(1, k - 1)) for j in range(k)}) if k > 1 else [usable - 1]
        holder[key] = new
        notes.append(f"drafter {key} {ids} -> {new} (spread over the outputs of target layers 0..{usable - 1})")
    for where, h in (("", cfg), ("dflash_config.", cfg.get("dflash_config"))):  # sglang checks the ids against it
        if (
            isinstance(h, dict)
            and isinstance(h.get("num_target_layers"), int)
            and h["num_target_layers"] != target_layers
        ):
            notes.append(f"drafter {where}num_target_layers {h['num_target_layers']} -> {target_layers}")
            h["num_target_layers"] = target_layers
    return cfg, notes


# ---------------------------------------------------------------- the engine's log

# sglang 0.5.17 and 0.5.23 (model_runner_components/cuda_graph_setup.py, speculative/*_worker_v2.py):
#   "Capture target verify CUDA graph end. elapsed=2.97 s, mem usage=0.03 GB, avail mem=124.78 GB."
# and older releases: "Capture cuda graph end. Time elapsed: 1.16 s. mem usage=..."
_CAPTURE = re.compile(r"Capture ([\w -]*?) ?(?:CUDA|cuda) graph end\. (?:elapsed=|Time elapsed: )([0-9.]+) ?s")
_CAPTURE_BEGIN = re.compile(r"Capture [\w -]*?(?:CUDA|cuda) graph begin")


def capture_times(log: str, metrics: dict | None = None) -> dict:
    """CUDA-graph captures the engine logged: each graph's seconds and the total
    (None when none was logged: graphs off, or a crash before the end). With
    the engine's /metrics, `metrics_s` is its startup_cuda_graph_time_seconds
    per phase (sglang 0.5.17+), a second source for the same figure."""
    ends = [((m.group(1) or "").strip() or "decode", float(m.group(2))) for m in _CAPTURE.finditer(log)]
    begun = len(_CAPTURE_BEGIN.findall(log))
    out = {
        "captures": [{"graph": g, "seconds": s} for g, s in ends],
        "total_s": round(sum(s for _, s in ends), 3) if ends else None,
        "begun": begun,
        "ended": len(ends),
    }
    phases = {}
    for key, value in (metrics or {}).items():
        m = re.match(r'sglang:startup_cuda_graph_time_seconds\{.*phase="(\w+)"', key)
        if m and value:
            phases[m.group(1)] = round(value, 3)
    if phases:
        out["metrics_s"] = phases
    return out


def engine_lines(log: str, limit: int = 60) -> list[str]:
    """The log lines k26ops reads (start-up milestones, captures, errors), for the report and recorded data."""
    keys = (
        "server_args",
        "Load weight",
        "KV Cache",
        "Capture",
        "cuda graph",
        "fired up",
        "Uvicorn running",
        "Error",
        "ERROR",
        "Traceback",
        "K26OPS-PROBE",
    )
    return [ln for ln in log.splitlines() if any(k in ln for k in keys)][:limit]
