"""Known SGLang crash signatures, as data.

A signature is a list of regexes over the cleaned log (see `logtext`), an
optional context requirement, and a suggestion. Adding one is adding an entry
to `SIGNATURES`; `classify` tries them in list order (most specific first), so
a cause such as an illegal memory access wins over the NCCL watchdog message
that carries it. Ids are stable: users and scripts rely on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Bases whose target-verify CUDA graph is already captured with budget+1 tokens
# per request (read at the commit): for them the seeds' shape mismatch is not
# the block-size/budget mismatch, and its fix must not be suggested.
VERIFY_AT_BUDGET_PLUS_1 = {
    "sglang@93e9850e430035f8a363fd881a6a0c5436b95108": "sglang PR #29907 @ 93e9850e4300 (model_executor/runner/decode_cuda_graph_runner.py)",
}
PROBE_TAG = "K26OPS-PROBE cuda-graph-none-field"
# The probe's count of the copies it checked (one line, repeated as counts grow).
PROBE_WATCHED = re.compile(r"K26OPS-PROBE watched:(?P<counts>(?: [\w\[\].]+=\d+)*)")
UNCLASSIFIED = "unclassified"

# Words between parts of a message may be split over pasted lines.
_ = r"\s+"


def _rx(*patterns: str) -> tuple[re.Pattern, ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


@dataclass(frozen=True)
class Signature:
    """One crash kind. `context`: None (the message alone is enough), "graph"
    (the failing traceback must run through CUDA-graph code), "capture" (it
    must be graph capture), "not-capture" (it must not be), "config" (raised in
    the engine's argument checks), "startup" (raised before the engine served
    anything), "primary" (it must be the first real error)."""

    id: str
    title: str
    patterns: tuple[re.Pattern, ...]
    suggestion: str
    context: str | None = None
    # Patterns that are enough without context (e.g. the probe's own tag).
    strong: tuple[re.Pattern, ...] = field(default=())
    # Cheap prefilter: lowercase words one of which any hit contains.
    keywords: tuple[str, ...] = ()


NONE_FIELD = Signature(
    keywords=("nonetype", "k26ops-probe"),
    id="cuda-graph-none-field",
    title="a None tensor reached a CUDA-graph capture/replay buffer copy",
    strong=_rx(
        r"K26OPS-PROBE"
        + _
        + r"cuda-graph-none-field:"
        + _
        + r"(?P<side>src|dst)\[(?P<index>\d+)\](?:"
        + _
        + r"\((?P<field>[\w.]+)\))?",
        # the probe's fill_from check (the DFLASH draft and verify graphs' buffer fill)
        r"K26OPS-PROBE"
        + _
        + r"cuda-graph-none-field:"
        + _
        + r"slot"
        + _
        + r"(?P<field>[\w.]+)"
        + _
        + r"is"
        + _
        + r"None.*?"
        + _
        + r"in"
        + _
        + r"(?P<site>\w+)"
        + _
        + r"\((?P<graph>\w+)"
        + _
        + r"graph",
    ),
    patterns=_rx(
        r"'NoneType'"
        + _
        + r"object"
        + _
        + r"has"
        + _
        + r"no"
        + _
        + r"attribute"
        + _
        + r"'(?P<attr>dtype|shape|device|is_cuda|copy_|data_ptr|size|numel|stride|"
        r"is_contiguous|contiguous|to|fill_|zero_|element_size|dim|ndim)'",
        r"expected"
        + _
        + r"Tensor"
        + _
        + r"as"
        + _
        + r"element"
        + _
        + r"(?P<index>\d+)"
        + _
        + r"in"
        + _
        + r"argument"
        + _
        + r"(?P<arg>\d+),"
        + _
        + r"but"
        + _
        + r"got"
        + _
        + r"NoneType",
        r"argument"
        + _
        + r"'(?P<arg_name>src|self|input|other)'"
        + _
        + r"\(position"
        + _
        + r"\d+\)"
        + _
        + r"must"
        + _
        + r"be"
        + _
        + r"Tensor,"
        + _
        + r"not"
        + _
        + r"NoneType",
        r"'NoneType'" + _ + r"object" + _ + r"is" + _ + r"not" + _ + r"subscriptable",
        # Triton: a None kernel argument fails the compile ("CompilationError: at L:C: ... ^
        # AttributeError(\"'NoneType' object has no attribute 'type'\")").
        r"AttributeError\(\"'NoneType'"
        + _
        + r"object"
        + _
        + r"has"
        + _
        + r"no"
        + _
        + r"attribute"
        + _
        + r"'(?P<triton_attr>\w+)'\"\)",
    ),
    context="graph",
    suggestion=(
        "A ForwardBatch field was None when the CUDA-graph input buffers were "
        "filled: the batch built for this forward mode (often speculative "
        "verify or draft) lacks a field the captured graph expects."
    ),
)
NONE_FIELD_UNNAMED = (
    "Run `k26ops diagnose cuda-graph --host H` (applies "
    "patches/sglang-0.5.23/cuda-graph-none-probe.patch) to name the field."
)
NONE_FIELD_NAMED = (
    "Populate `{field}` for that forward mode before replay, or skip its copy "
    "when it is None; or disable CUDA graphs for that mode meanwhile."
)

SHAPE_MISMATCH = Signature(
    keywords=("tensor", "size mismatch", "check_eq", "k26ops-probe"),
    id="cuda-graph-shape-mismatch",
    title="a batch did not fit the shape its CUDA graph was captured with",
    # the probe's fill_from check: a source whose shape differs from its buffer slice
    strong=_rx(
        r"K26OPS-PROBE"
        + _
        + r"cuda-graph-size-mismatch:"
        + _
        + r"slot"
        + _
        + r"(?P<field>[\w.]+)"
        + _
        + r"source"
        + _
        + r"\[(?P<a>[\d, ]*)\]"
        + _
        + r"vs"
        + _
        + r"buffer"
        + _
        + r"slice"
        + _
        + r"\[(?P<b>[\d, ]*)\]"
        + _
        + r"in"
        + _
        + r"(?P<site>\w+)"
        + _
        + r"\((?P<graph>\w+)"
        + _
        + r"graph"
    ),
    patterns=_rx(
        r"The"
        + _
        + r"size"
        + _
        + r"of"
        + _
        + r"tensor"
        + _
        + r"a"
        + _
        + r"\((?P<a>\d+)\)"
        + _
        + r"must"
        + _
        + r"match"
        + _
        + r"the"
        + _
        + r"size"
        + _
        + r"of"
        + _
        + r"tensor"
        + _
        + r"b"
        + _
        + r"\((?P<b>\d+)\)(?:"
        + _
        + r"at"
        + _
        + r"non-singleton"
        + _
        + r"dimension"
        + _
        + r"(?P<dim>\d+))?",
        r"The"
        + _
        + r"expanded"
        + _
        + r"size"
        + _
        + r"of"
        + _
        + r"the"
        + _
        + r"tensor"
        + _
        + r"\((?P<a>\d+)\)"
        + _
        + r"must"
        + _
        + r"match"
        + _
        + r"the"
        + _
        + r"existing"
        + _
        + r"size"
        + _
        + r"\((?P<b>\d+)\)",
        r"shape"
        + _
        + r"mismatch:"
        + _
        + r"value"
        + _
        + r"tensor"
        + _
        + r"of"
        + _
        + r"shape"
        + _
        + r"\[(?P<b>[\d, ]+)\]"
        + _
        + r"cannot"
        + _
        + r"be"
        + _
        + r"broadcast"
        + _
        + r"to"
        + _
        + r"indexing"
        + _
        + r"result"
        + _
        + r"of"
        + _
        + r"shape"
        + _
        + r"\[(?P<a>[\d, ]+)\]",
        # A kernel's own checks: SGLang JIT kernels ("Tensor match failed ... Root cause: Size
        # mismatch for shape#0('num_tokens'): expected 6 but got 8") and CHECK_EQ on sizes.
        r"Size"
        + _
        + r"mismatch"
        + _
        + r"for"
        + _
        + r"shape#(?P<dim>\d+)\('(?P<name>\w+)'\):"
        + _
        + r"expected"
        + _
        + r"(?P<b>\d+)"
        + _
        + r"but"
        + _
        + r"got"
        + _
        + r"(?P<a>\d+)",
        r"CHECK_EQ\((?P<name>[\w.]+\.size\((?P<dim>\d+)\)),\s*[\w.]+\.size\(\d+\)\)"
        + _
        + r"failed\.?"
        + _
        + r"(?P<a>\d+)"
        + _
        + r"vs\.?"
        + _
        + r"(?P<b>\d+)",
    ),
    context="graph",
    suggestion=(
        "The batch fed at replay has a different number of tokens per request "
        "than the graph was captured with. Check the speculative token settings "
        "(--speculative-num-draft-tokens, block size) against the captured "
        "graphs, or run with CUDA graphs disabled to confirm."
    ),
)

DDTREE_SHAPE_SUGGESTION = (
    "DDTree: the target-verify CUDA graph was captured with the draft block size "
    "(num_tokens_per_bs = --speculative-dflash-block-size) while DDTree verify feeds "
    "budget+1 tokens per request (--speculative-ddtree-budget + 1). That is the older "
    "cuda_graph_runner.py layout (the seeds' build): size the verify graph at budget+1 "
    "there, as sglang PR #29907 does in decode_cuda_graph_runner.py, with a patch in "
    "patches/<base>/ for your base, and restart."
)
DDTREE_SHAPE_FIXED_BASE = (
    "DDTree: this base, {where}, already captures the target-verify graph with budget+1 "
    "tokens per request, so this is not the block-size/budget mismatch. What is left: the "
    "budget and block size at replay must equal those at capture (restart after changing "
    "them), a full tree needs the triton attention backend, and the draft and draft-extend "
    "graphs have their own widths; run `k26ops diagnose cuda-graph --host H` to see which "
    "buffer copy fails."
)

CAPTURE_OOM = Signature(
    keywords=("memory", "calloc"),
    id="cuda-graph-capture-oom",
    title="out of GPU memory while capturing CUDA graphs",
    patterns=_rx(
        r"CUDA" + _ + r"out" + _ + r"of" + _ + r"memory",
        r"OutOfMemoryError",
        r"CUDA" + _ + r"error:" + _ + r"out" + _ + r"of" + _ + r"memory",
        r"cudaErrorMemoryAllocation",
        r"CUDA_ERROR_OUT_OF_MEMORY",
        r"Failed" + _ + r"to" + _ + r"CUDA" + _ + r"calloc",
    ),
    context="capture",
    suggestion=(
        "Graph capture ran out of GPU memory: lower --mem-fraction-static "
        "(e.g. 0.8 or 0.7) to leave room for the graphs, or lower "
        "--cuda-graph-max-bs-decode (0.5.23; older: --cuda-graph-max-bs)."
    ),
)

ILLEGAL_MEMORY_ACCESS = Signature(
    keywords=("illegal",),
    id="illegal-memory-access",
    title="CUDA illegal memory access",
    patterns=_rx(
        r"illegal" + _ + r"memory" + _ + r"access",
        r"cudaErrorIllegalAddress",
        r"CUDA_ERROR_ILLEGAL_ADDRESS",
    ),
    suggestion=(
        "A kernel read or wrote out of bounds; CUDA reports it late, so the "
        "traceback may point at an innocent op. Rerun with "
        "CUDA_LAUNCH_BLOCKING=1 to find the kernel; if it happens only with CUDA "
        "graphs, compare the captured buffer sizes with the replayed batch "
        "(k26ops diagnose cuda-graph), else try another attention backend."
    ),
)

NCCL_FAILURE = Signature(
    keywords=("nccl", "distbackenderror"),
    id="nccl-failure",
    title="NCCL / collective communication failure",
    patterns=_rx(
        r"\bNCCL" + _ + r"error\b",
        r"\bnccl(?:UnhandledCuda|System|Internal|InvalidUsage|InvalidArgument|Remote)Error\b",
        r"\bDistBackendError\b",
        r"Watchdog" + _ + r"caught" + _ + r"collective" + _ + r"operation" + _ + r"timeout",
        r"WorkNCCL\(.*\)" + _ + r"ran" + _ + r"for" + _ + r"\d+" + _ + r"milliseconds",
        r"ProcessGroupNCCL.{0,80}(?:timed?\s*out|timeout|abort|exception|terminat|stuck)",
        r"NCCL" + _ + r"communicator" + _ + r"was" + _ + r"aborted",
        r"\bNCCL\s+WARN\b",
        r"ncclCommInitRank" + _ + r"failed",
        r"NCCL" + _ + r"(?:timeout|watchdog)",
    ),
    context="primary",
    suggestion=(
        "A collective failed or timed out. If another rank crashed first, fix "
        "that error (this is then only its echo). Otherwise rerun with "
        "NCCL_DEBUG=INFO; check NVLink/PCIe P2P (`nvidia-smi topo -m`, "
        "NCCL_P2P_DISABLE=1 as a test), --disable-custom-all-reduce, and "
        "--watchdog-timeout for long captures."
    ),
)

# Messages as safetensors prints them: 0.4+ words ("incomplete metadata, file
# not fully covered", "header too large", ...) and older enum names.
WEIGHT_FILE_CORRUPT = Signature(
    keywords=("deserializing", "safetensor"),
    id="weight-file-corrupt",
    title="a model weight shard is truncated or not a safetensors file",
    patterns=_rx(
        r"SafetensorError:"
        + _
        + r"Error"
        + _
        + r"while"
        + _
        + r"deserializing"
        + _
        + r"header:"
        + _
        + r"(?P<reason>[^\n]+?)\s*$",
        r"Error"
        + _
        + r"while"
        + _
        + r"deserializing"
        + _
        + r"header:"
        + _
        + r"(?P<reason>MetadataIncompleteBuffer|HeaderTooLarge|HeaderTooSmall|"
        r"InvalidHeader\w*|incomplete" + _ + r"metadata[^\n]*|header" + _ + r"too" + _ + r"(?:large|small)|"
        r"invalid" + _ + r"header[^\n]*)",
    ),
    suggestion=(
        "A .safetensors shard under the model path is cut short or is not a "
        "weight file (an interrupted download, a full disk, or an error page "
        "saved as a shard); the traceback does not name it. Compare each "
        "shard's size with the source, re-download the bad ones (the HF "
        "download resumes and re-checks sizes), then restart. Free disk "
        "space first if the model disk is full."
    ),
)

# sglang layers/aux_hidden_states.py:47 (0.5.17): the target captured fewer hidden states than
# the DFlash/EAGLE3 drafter reads; seen on a real H200 rehearsal (tests/data/rehearsal).
AUX_HIDDEN_CAPTURE = Signature(
    keywords=("aux hidden",),
    id="drafter-target-layers",
    title="the target captured fewer hidden states than the drafter reads (drafter target_layer_ids)",
    patterns=_rx(
        r"captured"
        + _
        + r"(?P<got>\d+)"
        + _
        + r"of"
        + _
        + r"(?P<want>\d+)"
        + _
        + r"aux"
        + _
        + r"hidden"
        + _
        + r"states"
    ),
    suggestion=(
        "The drafter's config (dflash_config.target_layer_ids, or eagle_aux_hidden_state_layer_ids) "
        "names target layers whose output the target does not capture: the target captures the "
        "output of layer k before layer k + 1, so with N layers the ids must be 0..N-2. Use the "
        "drafter trained for this target, or (a rehearsal with --layers) more layers; the ids "
        "must match the target the drafter was trained on."
    ),
)

# A model or drafter path that does not exist on the host: transformers then takes the path for a
# Hugging Face repo id and refuses it (huggingface_hub HFValidationError, re-raised as OSError).
# Seen on the real engine (sglang 0.5.17, H200): tests/data/logs/h200_model_path_missing.log.
MODEL_PATH_MISSING = Signature(
    keywords=("repo id",),
    id="model-path-missing",
    title="the model or drafter path does not exist on the host (taken for a Hugging Face repo id)",
    patterns=_rx(
        r"Repo"
        + _
        + r"id"
        + _
        + r"must"
        + _
        + r"be"
        + _
        + r"in"
        + _
        + r"the"
        + _
        + r"form"
        + r"[^\n]*?:"
        + _
        + r"'(?P<path>/[^'\n]*)'"
    ),
    suggestion=(
        "The engine was given a local path that is not there (or not readable by the "
        "unit's user): check model_path / draft_model_path on this host (the weights "
        "downloaded, the disk mounted). `k26ops check` shows the model directory, and "
        "`k26ops deploy` refuses a missing one before it touches the unit."
    ),
)

# The engine's start-up checks (k26ops/release/launch_rules.py, read from the engine's argument
# hooks): each message, as the engine words it or as k26ops words the same rule, names
# its rule; a rule's `fix` is the suggestion. Real DFLASH texts: speculative_hook.py
# _handle_dflash (sglang @ 004c82e07d87).
CONFIG_RULE_MESSAGES = (
    ("full-tree-triton", r"needs" + _ + r"the" + _ + r"triton" + _ + r"attention" + _ + r"backend"),
    (
        "no-dp-attention",
        r"(?:DFLASH|DDTREE)(?:"
        + _
        + r"speculative"
        + _
        + r"decoding)?"
        + _
        + r"does"
        + _
        + r"not"
        + _
        + r"support"
        + _
        + r"dp"
        + _
        + r"attention",
    ),
    (
        "pp-size-1",
        r"(?:DFLASH|DDTREE)(?:"
        + _
        + r"speculative"
        + _
        + r"decoding)?"
        + _
        + r"(?:only"
        + _
        + r"supports"
        + _
        + r"pp_size"
        + _
        + r"=="
        + _
        + r"1|needs"
        + _
        + r"--pp-size"
        + _
        + r"1)",
    ),
    (
        "drafter-path",
        r"(?:DFLASH|DDTREE)[\w/ ]*?(?:requires"
        + _
        + r"setting"
        + _
        + r"--speculative-draft-model-path|needs"
        + _
        + r"a"
        + _
        + r"drafter"
        + _
        + r"path)",
    ),
    (
        "block-size-match",
        r"--speculative-num-draft-tokens"
        + _
        + r"(?:and"
        + _
        + r"--speculative-dflash-block-size"
        + _
        + r"are"
        + _
        + r"set"
        + _
        + r"but"
        + _
        + r"they"
        + _
        + r"differ|\d+"
        + _
        + r"differs"
        + _
        + r"from"
        + _
        + r"--speculative-dflash-block-size)",
    ),
    ("budget-positive", r"--speculative-ddtree-budget" + _ + r"must" + _ + r"be" + _ + r">=" + _ + r"1"),
    (
        "no-rejection-sampling",
        r"DDTREE" + _ + r"does" + _ + r"not" + _ + r"support" + _ + r"rejection" + _ + r"sampling",
    ),
    ("page-size-1", r"DDTREE" + _ + r"supports" + _ + r"only" + _ + r"page" + _ + r"size" + _ + r"1"),
    # the engine never says it (it infers the size from the drafter); k26ops' own wording
    (
        "block-size-given",
        r"the"
        + _
        + r"block"
        + _
        + r"size"
        + _
        + r"is"
        + _
        + r"not"
        + _
        + r"on"
        + _
        + r"the"
        + _
        + r"command"
        + _
        + r"line",
    ),
    # k26ops' own rule too (the engine defaults the budget)
    ("budget-given", r"DDTREE" + _ + r"needs" + _ + r"a" + _ + r"tree" + _ + r"budget"),
)
# argparse's own refusal, as launch_server prints it before anything starts:
# "launch_server.py: error: unrecognized arguments: --reasoning_parser kimi_k2" (sgl-project/sglang#12818).
ARGPARSE_REFUSAL = (
    r"^(?P<prog>[\w.\-]+(?: [\w.\-]+)?): error: (?P<argparse>unrecognized arguments|"
    r"argument (?P<arg>[-\w/]+): (?:invalid|expected|ambiguous|not allowed|\d+ validation errors? for)[^:]*|"
    r"the following arguments are required)(?::\s*(?P<args>.*))?$"
)
CONFIG_REFUSED = Signature(
    keywords=(
        "valueerror",
        "assertionerror",
        "notimplementederror",
        "support",
        "need",
        "must",
        "differ",
        ": error: ",
        "validation error",
    ),
    id="engine-config-refused",
    title="the engine refused its configuration at start-up",
    strong=tuple(re.compile(rx, re.IGNORECASE) for _name, rx in CONFIG_RULE_MESSAGES)
    + (re.compile(ARGPARSE_REFUSAL, re.MULTILINE),)
    + (
        re.compile(
            r"(?:\d+"
            + _
            + r"validation"
            + _
            + r"errors?"
            + _
            + r"for"
            + _
            + r"\w*(?:Config|Args|Arguments)"
            + r"\s*\n\s*(?:[\w.]+\s*\n\s*)?)?(?P<pydantic>(?:Value"
            + _
            + r"error,|Assertion"
            + _
            + r"failed,)[^\n]*\[type=(?:value_error|assertion_error)[^\n]*)",
            re.IGNORECASE,
        ),
    ),
    # Any other refusal raised by the engine's own argument checks.
    patterns=(
        re.compile(
            r"^(?P<exc>ValueError|AssertionError|NotImplementedError|TypeError):"
            r"\s*(?P<msg>\S.*)$",
            re.MULTILINE,
        ),
    ),
    context="config",
    suggestion=(
        "The engine checked its flags before loading anything and refused them; "
        "under systemd it restarts into the same refusal. Change the flag or value "
        "the message names, then restart."
    ),
)
ARGPARSE_SUGGESTION = (
    "The engine's argument parser refused its command line ({what}) before "
    "loading anything; under systemd it restarts into the same refusal. This engine "
    "build does not know the flag (a flag of another sglang version or branch, or a "
    "misspelling: sglang's flags use dashes, --reasoning-parser not --reasoning_parser). "
    "Rename or remove it in the recipe's flags, or pin an engine that has it, then restart."
)
CONFIG_RULE_SUGGESTION = (
    "The engine refused its flags at start-up (rule `{rule}`, {where}); under "
    "systemd it restarts into the same refusal. Fix: {fix}. `k26ops deploy` "
    "checks this rule before it changes any host."
)
# Frames of the engines' argument/config checks.
CONFIG_FRAMES = re.compile(
    r"server_args\.py|/arg_groups/|speculative_hook\.py|vllm/config/|"
    r"vllm/engine/arg_utils\.py"
)

# A kernel/attention backend refusing the GPU's architecture: flash-attn-4's cute kernel on a
# B300 (sgl-project/sglang#25564: "AssertionError: Only SM 10.x and 11.x are supported") and
# flashinfer's SM120 kernel on SM121 (flashinfer-ai/flashinfer#4600).
BACKEND_UNSUPPORTED_GPU = Signature(
    keywords=("sm", "kernel image", "fp8e4nv", "architecture", "flashattention", "compute capability"),
    id="backend-unsupported-gpu",
    title="a kernel or attention backend does not support this GPU",
    strong=_rx(
        r"(?P<requirement>Only"
        + _
        + r"SM"
        + _
        + r"[\d.x]+(?:"
        + _
        + r"and"
        + _
        + r"[\d.x]+)?"
        + _
        + r"(?:is|are)"
        + _
        + r"supported)",
        r"(?P<requirement>(?P<kernel>\w+)"
        + _
        + r"is"
        + _
        + r"only"
        + _
        + r"supported"
        + _
        + r"on"
        + _
        + r"SM\s*\d+[^\n]*)",
        # CUDA: the build has no kernel for this architecture (vllm-project/vllm#14452, #19185)
        r"(?P<requirement>no"
        + _
        + r"kernel"
        + _
        + r"image"
        + _
        + r"is"
        + _
        + r"available"
        + _
        + r"for"
        + _
        + r"execution"
        + _
        + r"on"
        + _
        + r"the"
        + _
        + r"device)",
        r"(?P<requirement>cudaErrorNoKernelImageForDevice|CUDA_ERROR_NO_BINARY_FOR_GPU)",
        # Triton: an fp8 dtype the architecture lacks (sgl-project/sglang#5871 on sm_86)
        r"(?P<requirement>type"
        + _
        + r"fp8e4nv"
        + _
        + r"not"
        + _
        + r"supported"
        + _
        + r"in"
        + _
        + r"this"
        + _
        + r"architecture)",
        r"(?P<requirement>fp8e4nv"
        + _
        + r"data"
        + _
        + r"type"
        + _
        + r"is"
        + _
        + r"not"
        + _
        + r"supported"
        + _
        + r"on"
        + _
        + r"CUDA"
        + _
        + r"arch"
        + _
        + r"<"
        + _
        + r"\d+)",
        # flash-attn 2 on a pre-Ampere GPU (V100, T4): its own check's words
        r"(?P<requirement>FlashAttention"
        + _
        + r"only"
        + _
        + r"supports"
        + _
        + r"(?:Ampere|Hopper|Turing)"
        + _
        + r"GPUs"
        + _
        + r"or"
        + _
        + r"newer)",
        # vLLM's dtype check: "Bfloat16 is only supported on GPUs with compute capability of at least 8.0.
        # Your Tesla T4 GPU has compute capability 7.5."
        r"(?P<requirement>\w+"
        + _
        + r"is"
        + _
        + r"only"
        + _
        + r"supported"
        + _
        + r"on"
        + _
        + r"GPUs"
        + _
        + r"with"
        + _
        + r"compute"
        + _
        + r"capability"
        + _
        + r"of"
        + _
        + r"at"
        + _
        + r"least"
        + _
        + r"\d+\.\d+)",
    ),
    patterns=(),
    suggestion=(
        "The kernel or attention backend the engine chose does not run on this GPU's "
        "architecture (its compute capability; `k26ops facts` shows it). Choose another "
        "--attention-backend (or the backend flag that picked this kernel), or pin an engine "
        "whose kernels support this GPU, then restart. Nothing is wrong with the GPU."
    ),
)

# A port the engine binds is taken: uvicorn's line for the HTTP port ("[Errno 98] error while attempting
# to bind on address ('::', 2242, 0, 0): address already in use", dphnAI/sonar#621), Python's own
# OSError, or torch's TCPStore for the dist-init port ("failed to bind to 0.0.0.0:29500 (errno: 98 -
# Address already in use)", huggingface/text-generation-inference#1156).
PORT_IN_USE = Signature(
    keywords=("already in use",),
    id="port-in-use",
    title="a port the engine listens on is taken (port clash)",
    patterns=_rx(
        r"error"
        + _
        + r"while"
        + _
        + r"attempting"
        + _
        + r"to"
        + _
        + r"bind"
        + _
        + r"on"
        + _
        + r"address"
        + _
        + r"\((?P<address>[^)\n]*)\):"
        + _
        + r"address"
        + _
        + r"already"
        + _
        + r"in"
        + _
        + r"use",
        r"failed"
        + _
        + r"to"
        + _
        + r"bind"
        + _
        + r"to"
        + _
        + r"(?P<address>\S+)"
        + _
        + r"\(errno:"
        + _
        + r"98"
        + _
        + r"-"
        + _
        + r"Address"
        + _
        + r"already"
        + _
        + r"in"
        + _
        + r"use",
        r"\[Errno" + _ + r"98\]" + _ + r"Address" + _ + r"already" + _ + r"in" + _ + r"use",
    ),
    suggestion=(
        "Another process holds a port this engine binds (the HTTP port, or --dist-init-addr's / the NCCL "
        "port): `ss -ltnp` on the host names it. Stop it (an engine left running outside the unit, a "
        "second unit) or give this engine another port: engine_port, or --rehearse-port for a "
        "rehearsal. Under systemd it restarts into the same clash until the port is free."
    ),
)

# Where a log shows the GPU's compute capability (torch's warnings, sglang/vllm env dumps, triton's
# metadata): "... with CUDA capability sm_120 is not compatible", "which is of cuda capability 7.0",
# "GPU 0,1 Compute Capability: 8.6", "compute_cap\n8.6", "deepseek-v4-flash with sm80".
COMPUTE_CAPABILITY = (
    re.compile(r"CUDA\s+capability\s+sm_(?P<sm>\d{2,3})\b", re.IGNORECASE),
    re.compile(r"cuda\s+capability\s+(?P<cc>\d+\.\d+)", re.IGNORECASE),
    re.compile(r"Compute\s+Capability:\s*(?P<cc>\d+\.\d+)", re.IGNORECASE),
    re.compile(r"GPU\s+has\s+compute\s+capability\s+(?P<cc>\d+\.\d+)", re.IGNORECASE),
    re.compile(r"^compute_cap\s*\n\s*(?P<cc>\d+\.\d+)\s*$", re.MULTILINE),
    re.compile(r"\bsm_?(?P<sm>[5-9]\d|1[0-2]\d)a?\b"),
)

# CUDA's own words for a GPU memory or link fault, inside the engine's log: the GPU's fault, not
# the engine's (vllm-project/vllm#5222, verl-project/verl#407, huggingface/accelerate#1192).
GPU_ERROR_TEXT = Signature(
    keywords=("ecc", "nvlink error"),
    id="gpu-hardware-fault",
    title="CUDA reported a GPU hardware error (uncorrectable ECC or NVLink) to the engine",
    strong=_rx(
        r"(?P<what>uncorrectable" + _ + r"ECC" + _ + r"error" + _ + r"encountered)",
        r"(?P<what>CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable)",
        r"(?P<what>uncorrectable" + _ + r"NVLink" + _ + r"error" + _ + r"detected)",
    ),
    patterns=(),
    suggestion=(
        "CUDA says the GPU hit an uncorrectable memory (ECC) or NVLink error: the hardware, "
        "not the engine. Drain the host, stop GPU processes and reset the GPU (nvidia-smi -r -i N) "
        "or reboot; read the kernel log's Xid (48, 94, 95, 74) and `nvidia-smi -q` (ECC Errors, "
        "Remapped Rows) for which GPU; if it repeats on the same GPU, RMA it. Restarting the "
        "engine on the same GPU first is likely to fail again."
    ),
)

# Out of GPU memory outside CUDA-graph capture, named by the phase the traceback shows: the KV cache
# pool (sgl-project/sglang#12496, vllm _allocate_kv_cache), the attention backend's buffers
# (sgl-project/sglang#18262), loading weights, or serving.
GPU_OOM = Signature(
    keywords=("memory", "calloc"),
    id="gpu-out-of-memory",
    title="out of GPU memory (outside CUDA-graph capture)",
    patterns=CAPTURE_OOM.patterns
    + _rx(
        r"Not"
        + _
        + r"enough"
        + _
        + r"memory\."
        + _
        + r"Please"
        + _
        + r"try"
        + _
        + r"to"
        + _
        + r"increase"
        + _
        + r"--mem-fraction-static",
        r"Not" + _ + r"enough" + _ + r"memory" + _ + r"to" + _ + r"allocate" + _ + r"KV" + _ + r"cache",
        r"No" + _ + r"available" + _ + r"memory" + _ + r"for" + _ + r"the" + _ + r"cache" + _ + r"blocks",
        # vLLM V1's KV-cache sizing: "... KV cache is needed, which is larger than the available KV cache memory"
        r"larger" + _ + r"than" + _ + r"the" + _ + r"available" + _ + r"KV" + _ + r"cache" + _ + r"memory",
        # older vLLM: "The model's max seq len (4096) is larger than the maximum number of tokens that can be
        # stored in KV cache (3664)"
        r"larger"
        + _
        + r"than"
        + _
        + r"the"
        + _
        + r"maximum"
        + _
        + r"number"
        + _
        + r"of"
        + _
        + r"tokens"
        + _
        + r"that"
        + _
        + r"can"
        + _
        + r"be"
        + _
        + r"stored"
        + _
        + r"in"
        + _
        + r"KV"
        + _
        + r"cache",
    ),
    context="not-capture",
    suggestion="Out of GPU memory {where}. {fix}",
)
# phase -> (frames or words that show it, where, fix)
OOM_PHASES = (
    (
        "kv-cache-init",
        re.compile(
            r"init_memory_pool|TokenToKVPool|_allocate_kv_cache|initialize_kv_cache|"
            r"init_cache_engine|initialize_cache\b|to allocate KV cache|"
            r"memory for the cache blocks|increase --mem-fraction-static|"
            r"available KV cache memory|stored in KV cache",
            re.IGNORECASE,
        ),
        "while allocating the KV cache pool at start-up",
        "the weights left too little room for the KV cache (or another process holds GPU memory): raise "
        "--mem-fraction-static a little if the engine says so, else lower --context-length, "
        "--max-running-requests or --cuda-graph-max-bs, use a larger TP, and check `nvidia-smi` for "
        "other processes on these GPUs",
    ),
    (
        "attention-backend-init",
        re.compile(
            r"init_attention_backend|/attention/\S+ __init__|attn_backend\S* __init__|"
            r"workspace_buffer"
        ),
        "while the attention backend allocated its buffers at start-up",
        "the KV cache pool took the memory the attention backend's workspace needs: lower "
        "--mem-fraction-static (e.g. by 0.02-0.05) or choose another --attention-backend",
    ),
    (
        "weight-load",
        re.compile(r"load_model|load_weights|weight_loader|model_loader", re.IGNORECASE),
        "while loading the weights",
        "the model does not fit: use more GPUs (--tp) or a smaller/quantized model",
    ),
    (
        "memory-profiling",
        re.compile(
            r"profile_run|determine_available_memory|determine_num_available_blocks|"
            r"profile_max_num_token"
        ),
        "while the engine profiled its peak memory at start-up",
        "lower the memory the engine may take (--mem-fraction-static / --gpu-memory-utilization) or the batch "
        "it profiles with (--max-num-batched-tokens / --chunked-prefill-size)",
    ),
    (
        "serving",
        re.compile(
            r"\bexecute_model\b|worker_busy_loop|forward_batch_generation|\brun_batch\b|"
            r"event_loop|sample_tokens"
        ),
        "while serving",
        "lower --mem-fraction-static (more room for activations), --max-running-requests or --chunked-prefill-size",
    ),
)

# Refusals raised by the engines' speculative-decoding and attention-backend checks at start-up, in
# their own exception types and words: "AssertionError: Currently HybridAttentionBackend does not
# support speculative decoding." (sgl-project/sglang#9330), "AssertionError: multi-layer EAGLE requires
# speculative_num_draft_tokens == ..." (#36536), "AssertionError: Speculative decoding not yet
# supported for RayGPU backend." (vllm-project/vllm#4358).
_SPEC_WORDS = (
    r"speculative|EAGLE\d?|MTP|NEXTN|DFLASH|DDTREE|draft|ngram|"
    r"attention[ _-]?backend|attn[ _-]?backend"
)
_REFUSAL_WORDS = (
    r"not\s+(?:yet\s+)?supported|does\s+not\s+support|doesn't\s+support|do\s+not\s+support|"
    r"unsupported|requires?|must\s+(?:be|match)|only\s+supports?|incompatible|cannot\s+be\s+used"
)
SPEC_REFUSED = Signature(
    keywords=("speculative", "eagle", "draft", "backend", "mtp", "nextn", "dflash", "ngram"),
    id="engine-config-refused",
    title="the engine refused its configuration at start-up",
    patterns=(
        re.compile(
            r"^(?P<exc>(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception)):\s*(?P<msg>"
            r"(?=.*\b(?:" + _SPEC_WORDS + r"))(?=.*\b(?:" + _REFUSAL_WORDS + r")\b).+)$",
            re.MULTILINE | re.IGNORECASE,
        ),
    ),
    context="startup",
    suggestion=(
        "The engine's speculative-decoding or attention-backend checks refused this combination "
        "at start-up; under systemd it restarts into the same refusal. Change the flag the message "
        "names (the attention backend, the speculative algorithm or its step/draft-token counts), "
        "then restart."
    ),
)
# pydantic/dataclass validation of the engine's config classes ("1 validation error for ModelConfig\n
# Value error, ..." in vllm-project/vllm#26161, zai-org/GLM-V#9): the message after "Value error,".
PYDANTIC_REFUSAL = (
    r"(?P<count>\d+)"
    + _
    + r"validation"
    + _
    + r"errors?"
    + _
    + r"for"
    + _
    + r"(?P<config>\w*(?:Config|Args|Arguments))\s*\n\s*(?:(?P<field>[\w.]+)\s*\n\s*)?"
    r"(?P<msg>(?:Value" + _ + r"error|Assertion" + _ + r"failed|Input" + _ + r"should)[^\n]*)"
)

# Named by the kernel's NVRM lines in the log, not by a regex over the engine's text
# (k26ops/facts/xid.py parses them; classify puts a hardware Xid before any software symptom).
GPU_HARDWARE_FAULT = "gpu-hardware-fault"
GPU_APP_FAULT = "gpu-xid-app-fault"
GPU_HARDWARE_TITLE = "the GPU failed under the engine (kernel NVRM Xid, GSP, NVSwitch SXid or nvidia-smi)"
GPU_APP_TITLE = "the GPU reported a fault of the program running on it (kernel NVRM Xid)"
GPU_FAULT_SUGGESTION = (
    "{where}: {xid}, {meaning}. {also}Action: {action}. {symptom}"
    "NVIDIA's Xid catalogue: " + "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
)
GPU_APP_SUGGESTION = (
    "{where}: {xid}, {meaning}. This Xid usually follows a bug in the program on the "
    "GPU (an out-of-bounds access, a bad kernel); if it repeats across programs, "
    "treat the GPU as suspect. {symptom}"
)

# Most specific first: the first signature with a hit names the crash.
SIGNATURES: list[Signature] = [
    GPU_ERROR_TEXT,
    NONE_FIELD,
    SHAPE_MISMATCH,
    CAPTURE_OOM,
    GPU_OOM,
    ILLEGAL_MEMORY_ACCESS,
    WEIGHT_FILE_CORRUPT,
    MODEL_PATH_MISSING,
    AUX_HIDDEN_CAPTURE,
    BACKEND_UNSUPPORTED_GPU,
    PORT_IN_USE,
    CONFIG_REFUSED,
    SPEC_REFUSED,
    NCCL_FAILURE,
]

# A run that ended by SIGKILL with no error of its own: bash's "Killed", systemd's "code=killed,
# status=9/KILL", a parent's "exit code -9"/"exitcode=9"/"signal: killed"; and where the kernel log or
# journal says so, the OOM killer ("Out of memory: Killed process 6154 (python)", "oom-kill:",
# systemd's "Failed with result 'oom-kill'").
PROCESS_KILLED = "process-killed"
KILLED = re.compile(
    r"^Killed\s*$|\bsignal: killed\b|code=killed, status=9/KILL|"
    r"\b(?:exit(?:ed)?(?: with)?(?: code| status)?|exit_?code)[ =:]*-9\b|<Signals\.SIGKILL: 9>|"
    r"exit(?:ed)?(?: with)?(?: code| status)?[ =:]*137\b",
    re.IGNORECASE,
)
OOM_KILLER = re.compile(
    r"Out of memory: Killed process \d+ \([^)]*\)|\boom-kill:|invoked oom-killer|"
    r"Failed with result 'oom-kill'|killed by the OOM killer|Memory cgroup out of memory|"
    r"\bOOMKilled\b",
    re.IGNORECASE,
)
# sglang's cleanup once a child failed: the parent gets SIGQUIT and kills its whole process tree
SIGQUIT_CLEANUP = re.compile(
    r"Received sigquit from a child process|SIGQUIT received|Triggering SIGQUIT", re.IGNORECASE
)
KILLED_TITLE = "killed (signal 9)"
KILLED_SUGGESTION = "The process was killed with SIGKILL and left no error of its own{by}. {fix}"
KILLED_FIX_OOM = (
    "The kernel's OOM killer ended it: the host ran out of RAM (CPU memory), typically while "
    "loading weights. Give the host or container more RAM or swap, load fewer shards at once, "
    "or stop what else uses the memory; `journalctl -k | grep -i oom` shows what it killed."
)
KILLED_FIX = (
    "Something sent SIGKILL: the OOM killer (read `journalctl -k | grep -i -e oom -e 'Killed process'`), "
    "a container or cgroup memory limit, systemd's stop timeout, or a person."
)

NO_ERROR_SUGGESTION = (
    "No error in this log: no exception, no error line. If the engine "
    "still died, read the lines before it stopped (or the kernel log: "
    "an OOM kill leaves no Python error)."
)
UNCLASSIFIED_SUGGESTION = (
    "No known crash signature; the evidence line is the first error in the log (chained exceptions: the cause)."
)

# Traceback text showing that CUDA-graph code was running.
GRAPH_HINTS = re.compile(
    r"_grouped_foreach_copy_|cuda_graph|graph_runner|CudaGraph|GraphRunner|"
    r"populate_from_forward_batch|fill_from|copy_slots|init_device_graphs|"
    r"init_cuda_graphs|capture_one|can_run_graph|cuda graph|\breplay\w*|\bcapture\w*|"
    r"graph\.replay|torch\.cuda\.graph",
    re.IGNORECASE,
)
CAPTURE_BANNER = re.compile(r"Capture\s+(?:prefill\s+)?(?:cuda|CUDA)\s+graph\s+failed:\s*", re.IGNORECASE)

# Lines that only echo a failure elsewhere: never the primary error.
SECONDARY = re.compile(
    r"Connection\s+closed\s+by\s+peer|gloo|Connection\s+reset\s+by\s+peer|"
    r"scheduler\s+(?:is\s+dead|died)|Received\s+sigquit|SIGQUIT\s+received|"
    r"hit\s+an\s+exception|Initialization\s+failed\.\s+Please\s+see|"
    r"^(?:KeyboardInterrupt|SystemExit|(?:asyncio\.(?:exceptions\.)?)?CancelledError|"
    r"BrokenPipeError|ConnectionResetError|ConnectionRefusedError|EOFError)\b|"
    r"DistStoreError|TCPStore|Exception\s+in\s+thread|child\s+process|"
    r"server\s+process\s+(?:exited|died)|Killed\b|To\s+work\s+around\s+this\s+error|"
    r"Please\s+report\s+this\s+issue",
    re.IGNORECASE,
)

ALGORITHMS = ("DDTREE", "DFLASH", "EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "NGRAM")
