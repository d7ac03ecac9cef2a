"""classify() on realistic SGLang crash logs (tests/data/logs, expectations in
expected.json) and on the noisy shapes real logs take (prefixes, chains,
pasting, per-rank repeats, watchdog messages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k26ops.diagnose import SIGNATURES, classify, classify_file
from k26ops.diagnose.logtext import clean_lines, strip_prefixes

LOGS = Path(__file__).parent.parent / "data/logs"
EXPECTED = json.loads((LOGS / "expected.json").read_text())
MANIFEST = json.loads((LOGS / "MANIFEST.json").read_text())
IDS = {
    "cuda-graph-none-field",
    "cuda-graph-shape-mismatch",
    "illegal-memory-access",
    "cuda-graph-capture-oom",
    "nccl-failure",
    "weight-file-corrupt",
    "engine-config-refused",
    "backend-unsupported-gpu",
    "drafter-target-layers",
    "model-path-missing",
    "port-in-use",
    "gpu-hardware-fault",
    "gpu-out-of-memory",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_log_files(name):
    exp = EXPECTED[name]
    d = classify_file(LOGS / name)
    assert d.signature == exp["signature"], d
    if exp.get("error_found") is False:  # a clean log: no signature, no evidence, no line
        assert d.signature is None and not d.error_found and d.evidence == "" and d.line is None
        assert d.suggestion and d.detail == exp.get("detail", {})
        return
    assert d.error_found
    for key in ("phase", "rank", "algorithm"):
        if key in exp:
            assert getattr(d, key) == exp[key], (key, d)
    for key, value in exp.get("detail", {}).items():
        assert d.detail.get(key) == value, (key, d.detail)
    if "evidence" in exp:
        assert exp["evidence"] in d.evidence
    if "suggestion_has" in exp:
        assert exp["suggestion_has"] in d.suggestion
    assert d.evidence and d.suggestion and d.line
    raw = (LOGS / name).read_text().splitlines()[d.line - 1]
    assert d.evidence.split()[0] in raw  # the line number points at the evidence


def test_every_kind_has_logs():
    kinds = {e["signature"] for e in EXPECTED.values()}
    assert kinds == IDS | {"unclassified", None, "gpu-xid-app-fault", "process-killed"}
    assert {s.id for s in SIGNATURES} == IDS
    assert sum(e["signature"] == "unclassified" for e in EXPECTED.values()) >= 6


def test_manifest_covers_every_log_with_provenance():
    """Every log has a source (a public URL, CONSTRUCTED, or unknown for the seed's
    own logs) and a label that agrees with expected.json."""
    logs = {p.name for p in LOGS.glob("*.log")}
    assert logs == set(MANIFEST) == set(EXPECTED)
    real = [n for n, e in MANIFEST.items() if e["source"].startswith("https://")]
    assert len(real) >= 30
    for name, entry in MANIFEST.items():
        assert entry["source"] in ("unknown", "CONSTRUCTED", "RECORDED") or entry["source"].startswith("https://")
        if entry["source"] in ("CONSTRUCTED", "RECORDED"):  # RECORDED: a real engine run of ours, the note says where
            assert entry["source"] in entry["note"]
        label = "none" if EXPECTED[name].get("error_found") is False else EXPECTED[name]["signature"]
        assert entry["label"] == label, name


def test_accuracy_command_no_log_named_wrongly():
    """bench/classify_accuracy.py over the whole set: every labelled log matches,
    none is named wrongly, and it exits 0."""
    import subprocess
    import sys

    root = LOGS.parents[2]
    proc = subprocess.run(
        [sys.executable, "bench/classify_accuracy.py", "--json"], cwd=root, capture_output=True, text=True
    )
    data = json.loads(proc.stdout)
    assert proc.returncode == 0, [r for r in data["rows"] if r["verdict"] != "ok"]
    assert data["totals"]["WRONG"] == 0 and data["totals"]["missed"] == 0
    assert data["totals"]["logs"] == len(MANIFEST)
    assert {r["file"]: r["got"] for r in data["rows"]} == {n: e["label"] for n, e in MANIFEST.items()}


def test_ddtree_shape_mismatch_fix_follows_the_deployed_base():
    text = (LOGS / "shape_mismatch_ddtree_tp8.log").read_text()
    d = classify(text)  # base unknown (the seeds' custom build): the budget+1 fix for its layout
    assert "block size" in d.suggestion and "budget+1" in d.suggestion
    assert "cuda_graph_runner.py" in d.suggestion and "patches/<base>/" in d.suggestion
    assert d.detail == {"got": 8, "expected": 33, "dim": 0}
    pr = classify(text, "sglang@93e9850e430035f8a363fd881a6a0c5436b95108")
    assert pr.signature == d.signature and pr.detail == d.detail
    assert "already captures the target-verify graph with budget+1" in pr.suggestion
    assert "PR #29907" in pr.suggestion and "diagnose cuda-graph" in pr.suggestion
    assert "size the verify graph at budget+1" not in pr.suggestion


def test_to_json_keys_and_values():
    d = classify_file(LOGS / "none_field_probe_journald.log")
    j = d.to_json()
    assert {"signature", "evidence", "phase", "suggestion", "rank", "algorithm", "detail"} <= set(j)
    assert j["signature"] == "cuda-graph-none-field" and j["detail"]["field"] == "out_cache_loc"
    assert json.loads(json.dumps(j)) == j


# --- prefixes -------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, text, rank",
    [
        ("[2026-05-20 08:02:44 TP7] Scheduler hit an exception:", "Scheduler hit an exception:", "TP7"),
        ("[2026-05-20 08:02:44 DP2 TP2 EP2] RuntimeError: x", "RuntimeError: x", "DP2 TP2 EP2"),
        ("[... DP2 TP2 EP2] RuntimeError: x", "RuntimeError: x", "DP2 TP2 EP2"),
        ("[2026-05-20 08:02:44] INFO:     Started server", "INFO:     Started server", None),
        ("sglang-1  | [2026-05-20 08:02:44 TP3] RuntimeError: x", "RuntimeError: x", "TP3"),
        ("engine  |     self.capture()", "self.capture()", None),
        ("2026-05-20T08:02:44.123456789Z stdout F [2026-05-20 08:02:44 TP1] ValueError: y", "ValueError: y", "TP1"),
        ("2026-05-20T08:02:44.1Z stderr P partial", "partial", None),
        ("Nov 29 10:00:00 gpu-node-1 python3[123]: [2026-05-20 08:02:44 TP0] OSError: z", "OSError: z", "TP0"),
        (
            "Nov  9 10:00:00 host sglang-engine.sh[9]: Traceback (most recent call last):",
            "Traceback (most recent call last):",
            None,
        ),
        ("[rank3]:[E520 08:10:13.512 88 ProcessGroupNCCL.cpp:2057] [Rank 3] Watchdog", "[Rank 3] Watchdog", "rank3"),
        ("\x1b[31m[2026-05-20 08:02:44 TP4] RuntimeError: red\x1b[0m\r", "RuntimeError: red", "TP4"),
    ],
)
def test_prefixes(raw, text, rank):
    assert strip_prefixes(raw)[:2] == (text, rank)


# Runner prefixes: real lines from the public threads named in MANIFEST.json unless
# marked CONSTRUCTED (no public example of that exact format was found).
@pytest.mark.parametrize(
    "raw, text, rank",
    [
        # vLLM multiprocess workers (vllm#19186, club-3090#138, qwen38#2, gpustack#815, vllm#35091)
        (
            "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470] RuntimeError: "
            "CUDA error: out of memory",
            "RuntimeError: CUDA error: out of memory",
            "rank3",
        ),
        (
            "(Worker_TP0 pid=160) ERROR 05-20 20:54:32 [multiproc_executor.py:962] Traceback (most recent call last):",
            "Traceback (most recent call last):",
            "TP0",
        ),
        (
            "(Worker_TP1_EP1 pid=1045) ERROR 09-02 15:15:12 [multiproc_executor.py:1051]     gate = "
            "F.linear(lora, weight)",
            "gate = F.linear(lora, weight)",
            "TP1 EP1",
        ),
        (
            "(VllmWorkerProcess pid=1907) ERROR 12-19 01:22:33 multiproc_worker_utils.py:229]     "
            "module_load_weights(weights)",
            "module_load_weights(weights)",
            None,
        ),
        (
            "(EngineCore_DP0 pid=150) ERROR 02-23 02:23:19 [core.py:948] triton.compiler.errors."
            "CompilationError: at 22:25:",
            "triton.compiler.errors.CompilationError: at 22:25:",
            "DP0",
        ),
        (
            "(APIServer pid=223598) RuntimeError: Engine core initialization failed.",
            "RuntimeError: Engine core initialization failed.",
            None,
        ),
        # Ray (vllm#15598, verl#316)
        (
            "(RayWorkerWrapper pid=1463574, ip=192.168.10.60) INFO 03-27 10:29:01 [worker.py:267] Memory "
            "profiling takes 4.26 seconds [repeated 30x across cluster]",
            "Memory profiling takes 4.26 seconds [repeated 30x across cluster]",
            None,
        ),
        (
            "(WorkerDict pid=93663) WARNING 02-21 04:32:47 model_runner_base.py:143] Failed to pickle inputs "
            "of failed execution: CUDA error: an illegal memory access was encountered",
            "Failed to pickle inputs of failed execution: CUDA error: an illegal memory access was encountered",
            None,
        ),
        (
            "(raylet) A worker died or was killed while executing a task by an unexpected system error.",
            "A worker died or was killed while executing a task by an unexpected system error.",
            None,
        ),
        ("(pid=2481) RuntimeError: x", "RuntimeError: x", None),  # CONSTRUCTED: Ray's bare (pid=N)
        # docker-compose (DB-GPT#1043, xinfer#481)
        (
            "gpt_raisound-webserver-1         | ValueError: No component found with name x",
            "ValueError: No component found with name x",
            None,
        ),
        (
            "vllm-rs-svc0  | 2026-08-24T14:33:04.670199Z  INFO xinfer::core::runner: DFlash draft model "
            "loaded successfully!",
            "INFO xinfer::core::runner: DFlash draft model loaded successfully!",
            None,
        ),
        # Kubernetes: kubectl logs --prefix / --timestamps (CONSTRUCTED, kubectl's documented formats)
        ("[pod/sglang-0/engine] [2026-05-20 08:02:44 TP2] RuntimeError: x", "RuntimeError: x", "TP2"),
        ("[pod/sglang-0/engine] 2026-05-20T08:02:44.123456789Z RuntimeError: x", "RuntimeError: x", None),
        # journald: short (ProxmoxVED#2047, real) / short-iso / short-iso-precise / short-unix / short-full
        (
            "Aug 19 18:34:30 vllm vllm[8707]: (APIServer pid=8707)     async with build_async_engine_client(",
            "async with build_async_engine_client(",
            None,
        ),
        ("2026-11-30T09:14:02+0000 gpu-3 k26-engine[48211]: ValueError: z", "ValueError: z", None),
        ("2026-11-30T09:14:02.123456+00:00 gpu-3 k26-engine[48211]: ValueError: z", "ValueError: z", None),
        ("1764494042.123456 gpu-3 k26-engine[48211]: ValueError: z", "ValueError: z", None),
        ("Sun 2026-11-30 09:14:02 UTC gpu-3 k26-engine[48211]: ValueError: z", "ValueError: z", None),
        # CI runner timestamps (Buildkite, pytorch#170433)
        (
            "[2025-12-13T19:54:35Z] (Worker_TP0 pid=9260) ERROR 12-13 11:54:35 [multiproc_executor.py:826]     "
            "self.cuda_graph.capture_end()",
            "self.cuda_graph.capture_end()",
            "TP0",
        ),
        # llama.cpp common_log (llama.cpp#22105)
        (
            "0.00.461.531 E llama_init_from_model: failed to initialize the context",
            "llama_init_from_model: failed to initialize the context",
            None,
        ),
    ],
)
def test_runner_prefixes(raw, text, rank):
    assert strip_prefixes(raw)[:2] == (text, rank)


def test_logger_error_level_makes_a_line_an_error():
    """vLLM's ERROR prefix counts when the message itself has no error word; an echo
    (real, QwenLM/Qwen3-VL#559) is shown only when nothing else is there."""
    echo = "ERROR 11-27 13:59:36 api_server.py:188] RPCServer process died before responding to readiness probe"
    # CONSTRUCTED: a message without an error word, only the logger says ERROR
    own = "(VllmWorker rank=1 pid=7) ERROR 06-05 06:18:13 [multiproc_executor.py:470] Worker 1 is gone"
    head = "INFO 11-27 13:59:30 api_server.py:100] Starting\n"
    d = classify(head + echo + "\n" + own + "\n")
    assert (d.signature, d.error_found, d.line, d.evidence) == ("unclassified", True, 3, "Worker 1 is gone")
    assert d.rank == "rank1"
    d = classify(head + echo + "\n")
    assert d.error_found and d.line == 2 and d.evidence.startswith("RPCServer process died")


def test_record_continuation_lines_inherit_rank():
    lines = clean_lines(
        "[2026-05-20 08:02:44 TP5] Scheduler hit an exception: Traceback "
        '(most recent call last):\n  File "x.py", line 1, in f\n    g()\n'
        "RuntimeError: boom\n"
    )
    assert [l.text for l in lines][:2] == ["Scheduler hit an exception:", "Traceback (most recent call last):"]
    assert {l.rank for l in lines} == {"TP5"}


# --- noisy shapes ---------------------------------------------------------

GRAPH_FRAMES = """Traceback (most recent call last):
  File "/sp/sglang/srt/managers/scheduler.py", line 1452, in event_loop_normal
    result = self.run_batch(batch)
  File "/sp/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", line 1702, in replay
    self.replay_prepare(forward_batch, pp_proxy_tensors)
  File "/sp/sglang/srt/model_executor/runner_utils/buffers.py", line 58, in _grouped_foreach_copy_
    key = (dst.dtype, src.dtype)
"""


def test_same_error_per_rank_then_secondary_errors():
    text = ""
    for r in (2, 0, 1):
        text += "".join(
            f"[2026-05-20 08:02:44 TP{r}] " + l + "\n" if i == 0 else l + "\n"
            for i, l in enumerate(
                (
                    "Scheduler hit an exception: " + GRAPH_FRAMES + "AttributeError: 'NoneType' object has no "
                    "attribute 'dtype'"
                ).splitlines()
            )
        )
    text += (
        "[2026-05-20 08:02:45 TP4] RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
        "pair.cc:534] Connection closed by peer [10.0.0.3]:4411\n"
        "[2026-05-20 08:02:45] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
        "[2026-05-20 08:02:46] Received sigquit from a child process. It usually means the child failed.\n"
    )
    d = classify(text)
    assert (d.signature, d.rank, d.phase) == ("cuda-graph-none-field", "TP2", "replay")


def test_stripped_indentation_and_broken_lines():
    text = "\n".join(l.strip() for l in GRAPH_FRAMES.splitlines())
    text += (
        "\nRuntimeError: The size of tensor a (8) must match the size\nof tensor b (33) at non-singleton dimension 0\n"
    )
    d = classify(text)
    assert d.signature == "cuda-graph-shape-mismatch" and d.detail["expected"] == 33
    assert d.phase == "replay"


def test_chained_exception_first_is_the_cause():
    text = (
        'Traceback (most recent call last):\n  File "a.py", line 1, in load\n    x()\n'
        "KeyError: 'model.layers.61.mlp.experts.w13_weight'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "b.py", line 2, in main\n    y()\n'
        "RuntimeError: Failed to load weights\n"
    )
    d = classify(text)
    assert d.signature == "unclassified"
    assert d.evidence == "KeyError: 'model.layers.61.mlp.experts.w13_weight'"
    assert d.detail == {"exception": "KeyError"}


def test_capture_banner_classifies_the_inner_error():
    banner = (
        "Exception: Capture cuda graph failed: {}\nPossible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
        "(Not recommended. Huge performance loss)\n"
    )
    oom = classify(
        banner.format(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
            "a total capacity of 79.19 GiB of which 1.06 GiB is free."
        )
    )
    assert (oom.signature, oom.phase) == ("cuda-graph-capture-oom", "capture")
    assert oom.detail["tried_to_allocate"] == "2.00 GiB"
    ima = classify(banner.format("CUDA error: an illegal memory access was encountered"))
    assert (ima.signature, ima.phase) == ("illegal-memory-access", "capture")
    other = classify(banner.format("Triton Error [CUDA]: invalid argument"))
    assert other.signature == "unclassified" and "Triton Error" in other.evidence


def test_watchdog_carrying_illegal_memory_access_is_not_nccl():
    text = (
        "[rank1]:[E520 08:10:11.5 881 ProcessGroupNCCL.cpp:1912] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 1] Process group watchdog thread terminated with exception: CUDA error: an "
        "illegal memory access was encountered\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    )
    d = classify(text)
    assert d.signature == "illegal-memory-access" and d.rank == "rank1"
    assert d.detail == {"reported_by": "nccl-watchdog"}


def test_graph_error_wins_over_later_nccl_echo():
    text = (
        GRAPH_FRAMES + "AttributeError: 'NoneType' object has no attribute 'dtype'\n"
        "[rank1]:[E520 08:20:00.1 9 ProcessGroupNCCL.cpp:685] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 "
        "milliseconds before timing out.\n"
    )
    assert classify(text).signature == "cuda-graph-none-field"


def test_none_outside_graph_code_is_unclassified():
    text = (
        'Traceback (most recent call last):\n  File "/sp/sglang/srt/managers/tokenizer_manager.py",'
        " line 9, in _tokenize\n    ids = enc.input_ids\n"
        "AttributeError: 'NoneType' object has no attribute 'dtype'\n"
    )
    assert classify(text).signature == "unclassified"


def test_probe_tag_alone():
    d = classify(
        "RuntimeError: K26OPS-PROBE cuda-graph-none-field: dst[0] (input_ids) is None "
        "in _grouped_foreach_copy_ (sglang.srt.model_executor.runner_utils.buffers)"
    )
    assert d.signature == "cuda-graph-none-field"
    assert d.detail == {"field": "input_ids", "index": 0, "side": "dst"}
    assert "`input_ids`" in d.suggestion


@pytest.mark.parametrize(
    "text",
    [
        "",
        "just some text\nwithout problems\n",
        "INFO 08-19 07:51:03 model_runner.py:732] Loading model weights took 2.3463 GB\n",
    ],
)
def test_clean_log_has_no_error(text):
    d = classify(text)
    assert (d.signature, d.error_found, d.evidence, d.line) == (None, False, "", None)
    assert d.title == "no error found" and "No error" in d.suggestion


@pytest.mark.parametrize(
    "text",
    [
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use\n",
        "OSError: [Errno 98] Address already in use\n",
        "RuntimeError: The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).\n",
    ],
)
def test_a_taken_port_is_a_port_clash(text):
    """Was `unclassified` (issue 45 item 5): uvicorn's HTTP bind, Python's, torch's TCPStore."""
    d = classify(text)
    assert d.signature == "port-in-use" and "port clash" in d.title and "--rehearse-port" in d.suggestion


@pytest.mark.parametrize(
    "text, evidence",
    [
        ("ModuleNotFoundError: No module named 'flashinfer'\n", "No module named 'flashinfer'"),
        (
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code "
            "is -9 (SIGKILL), a common cause is the OS OOM killer.\n",
            "Rank 0 scheduler died",
        ),
    ],
)
def test_unclassified_edge_cases(text, evidence):
    d = classify(text)
    assert d.signature == "unclassified" and evidence in d.evidence
    assert d.suggestion and d.error_found


def test_algorithm_detection():
    frames = GRAPH_FRAMES + "AttributeError: 'NoneType' object has no attribute 'dtype'\n"
    assert classify("--speculative-algorithm EAGLE3\n" + frames).algorithm == "EAGLE3"
    assert classify("speculative_algorithm='DFLASH', speculative_ddtree_budget=32\n" + frames).algorithm == "DDTREE"
    assert classify(frames).algorithm is None


def test_crlf_and_bytes_file(tmp_path):
    path = tmp_path / "crlf.log"
    path.write_bytes(
        b"\xff\xfe junk\r\n"
        + (
            GRAPH_FRAMES + "RuntimeError: The size of tensor a "
            "(16) must match the size of tensor b (66) at non-singleton dimension 0\n"
        )
        .replace("\n", "\r\n")
        .encode()
    )
    d = classify_file(path)
    assert d.signature == "cuda-graph-shape-mismatch" and d.detail["got"] == 16


@pytest.mark.parametrize(
    "text, evidence, rank, signature",
    [
        (
            "[2026-05-20 08:02:44 TP1] Scheduler hit an exception: ValueError: bad rope scaling\n"
            "[2026-05-20 08:02:45] Received sigquit from a child process. It usually means the child "
            "failed.\n",
            "ValueError: bad rope scaling",
            "TP1",
            "unclassified",
        ),
        (
            "[2026-05-20 08:02:45 TP4] RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
            " Connection closed by peer [10.0.0.3]:4411\nKilled\n",
            "Connection closed by peer",
            "TP4",
            "unclassified",
        ),
        (
            "[2026-05-20 08:02:44 TP0] Scheduler hit an exception: RuntimeError: CUDA error: out of memory\n",
            "RuntimeError: CUDA error: out of memory",
            "TP0",
            "gpu-out-of-memory",
        ),
    ],
)
def test_single_line_wrappers_and_echo_only_logs(text, evidence, rank, signature):
    d = classify(text)
    assert (d.signature, d.evidence, d.rank) == (signature, d.evidence, rank)
    assert evidence in d.evidence


def test_older_sglang_capture_banner_advice_is_not_oom():
    text = (
        "Exception: Capture cuda graph failed: CUDA error: operation failed due to a previous "
        "error during capture\nPossible solutions:\n1. disable cuda graph by "
        "--disable-cuda-graph\n2. set --mem-fraction-static to a smaller value (e.g., 0.8 or "
        "0.7)\n3. disable torch compile by not using --enable-torch-compile\n4. set "
        "--cuda-graph-max-bs to a smaller value (e.g., 32)\nOpen an issue on GitHub "
        "https://github.com/sgl-project/sglang/issues/new/choose\n"
    )
    d = classify(text)
    assert d.signature == "unclassified" and d.phase == "capture"
    assert "operation failed due to a previous error during capture" in d.evidence


# --- tuned kinds (constructed inputs, variations of the real logs) --------------


def test_headerless_traceback_reaches_the_graph_frames():
    """Pasted from the middle of a traceback: the frames above the error count."""
    text = (
        '  File "/sp/sglang/srt/model_executor/cuda_graph_runner.py", line 513, in replay\n'
        "    self.replay_prepare(forward_batch)\n"
        '  File "/sp/sglang/srt/model_executor/cuda_graph_runner.py", line 480, in replay_prepare\n'
        "    self.input_ids[:raw_num_token].copy_(forward_batch.input_ids)\n"
        "RuntimeError: The size of tensor a (4) must match the size of tensor b (2) at "
        "non-singleton dimension 0\n"
    )
    d = classify(text)
    assert (d.signature, d.phase, d.detail["got"]) == ("cuda-graph-shape-mismatch", "replay", 4)
    eager = text.replace("cuda_graph_runner.py", "model_runner.py").replace("replay", "forward")
    assert classify(eager).signature == "unclassified"


def test_triton_none_argument_in_graph_capture_is_none_field():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/sp/sglang/srt/model_executor/cuda_graph_runner.py", line 436, in capture\n'
        "    ) = self.capture_one_batch_size(bs, forward)\n"
        '  File "/sp/triton/runtime/jit.py", line 569, in run\n'
        "    kernel = self.compile(src, target=target, options=options.__dict__)\n"
        "triton.compiler.errors.CompilationError: at 12:8:\n"
        "    p = sink_ptr + off\n"
        "        ^\n"
        "AttributeError(\"'NoneType' object has no attribute 'type'\")\n"
    )
    d = classify(text)
    assert (d.signature, d.phase) == ("cuda-graph-none-field", "capture")
    assert d.detail.get("function") == "run"
    outside = (
        text.replace("cuda_graph_runner.py", "model_runner.py")
        .replace("capture_one_batch_size", "forward")
        .replace("in capture", "in forward")
    )
    assert classify(outside).signature == "unclassified"


def test_engine_argument_check_is_config_refused_other_errors_are_not():
    frames = (
        "Traceback (most recent call last):\n"
        '  File "/sp/sglang/launch_server.py", line 11, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        '  File "/sp/sglang/srt/server_args.py", line 812, in __post_init__\n'
        "    raise ValueError(\n"
    )
    d = classify(frames + "ValueError: --tp-size 3 does not divide the number of attention heads\n")
    assert d.signature == "engine-config-refused" and d.detail == {"exception": "ValueError"}
    assert "Change the flag" in d.suggestion
    other = frames.replace("server_args.py", "model_loader/loader.py")
    assert classify(other + "ValueError: bad weight name\n").signature == "unclassified"


@pytest.mark.parametrize(
    "message, rule",
    [
        (
            "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they "
            "differ. For DFLASH they must match.",
            "block-size-match",
        ),
        ("Currently DFLASH speculative decoding only supports pp_size == 1.", "pp-size-1"),
        ("DFLASH speculative decoding requires setting --speculative-draft-model-path.", "drafter-path"),
        ("DDTREE does not support rejection sampling", "no-rejection-sampling"),
        ("--speculative-ddtree-budget must be >= 1, got 0", "budget-positive"),
    ],
)
def test_every_launch_rule_message_names_its_fix(message, rule):
    from k26ops.release import launch_rules

    d = classify("ValueError: " + message + "\n")
    fix = next(r.fix for r in launch_rules.RULES if r.name == rule)
    assert d.signature == "engine-config-refused" and d.detail["rule"] == rule
    assert fix in d.suggestion


def test_every_launch_rule_has_a_message():
    from k26ops.diagnose.signatures import CONFIG_RULE_MESSAGES
    from k26ops.release import launch_rules

    assert {name for name, _rx in CONFIG_RULE_MESSAGES} == {r.name for r in launch_rules.RULES}


# ---------------------------------------------------------------- quiet on healthy logs


def _lines(name):
    return (LOGS / name).read_text().splitlines(keepends=True)


def test_healthy_logs_are_quiet_and_real():
    """Every log labelled healthy has a public source (or is a real engine run of ours) and
    comes out with no error: signature null, distinct from `unclassified`."""
    healthy = [n for n, e in MANIFEST.items() if e["label"] == "none"]
    assert len(healthy) >= 7
    for name in healthy:
        assert MANIFEST[name]["source"].startswith("https://") or MANIFEST[name]["source"] == "RECORDED", name
        d = classify_file(LOGS / name)
        assert (d.signature, d.error_found) == (None, False), (name, d)


def test_request_level_handler_message_is_what_makes_it_survivable():
    """vLLM's request handler heads the traceback ('Error in preprocessing prompt inputs'):
    without that line the same traceback is an error of no known kind."""
    lines = _lines("vllm_request_preprocessing_traceback.log")
    assert classify("".join(lines)).error_found is False
    cut = [line for line in lines if "Error in preprocessing prompt inputs" not in line]
    d = classify("".join(cut))
    assert (d.signature, d.error_found) == ("unclassified", True)
    assert d.evidence.startswith("Traceback")


def test_request_errors_counted_and_404_lines_alone_are_not_errors():
    d = classify_file(LOGS / "vllm_request_errors_kept_serving.log")
    assert d.detail == {"request_errors": 2} and "2 request-level error(s)" in d.suggestion
    # the handler's message is what marks them: the same ERROR record with other words is an error
    lines = [
        line.replace("Error with model object=", "Engine failed: object=")
        for line in _lines("vllm_request_errors_kept_serving.log")
    ]
    assert classify("".join(lines)).error_found is True


def test_an_error_between_served_requests_is_survived_but_not_before_a_death():
    """A composed text (not a recorded log): the real healthy SGLang log with an exception
    between its served requests. Served before and after, and nothing says it died: a request's
    error. Nothing served after it, or the tokenizer manager's SIGQUIT line after it: a crash."""
    lines = _lines("sglang_healthy_serving_after_ready.log")
    error = (
        "[2025-06-25 14:02:05] Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/entrypoints/http_server.py", line 1, in x\n'
        "    raise ValueError(msg)\n"
        "ValueError: The input (61709 tokens) is longer than the model's context length (40960 tokens).\n"
    )
    survived = classify("".join(lines[:3]) + error + "".join(lines[3:]))
    assert (survived.signature, survived.error_found, survived.detail) == (None, False, {"request_errors": 1})
    last = classify("".join(lines) + error)
    assert (last.signature, last.error_found) == ("unclassified", True)
    assert last.evidence.startswith("ValueError: The input")
    died = classify(
        "".join(lines[:3])
        + error
        + "".join(lines[3:])
        + "[2025-06-25 14:02:07] Received sigquit from a child process. It usually means the child failed.\n"
    )
    assert died.error_found and died.signature == "unclassified"


def test_nccl_info_plugin_lines_quiet_but_nccl_warn_is_an_error():
    """NCCL's INFO plugin probe is benign; its WARN lines are not (gpustack/gpustack#5553)."""
    assert classify_file(LOGS / "nccl_info_net_plugin_symbols.log").error_found is False
    warn = (
        "[2026-06-10 21:49:11] gpuhost409048g1:72:72 [0] int nccl_net_ofi_create_plugin("
        "nccl_net_ofi_plugin_t**):268 NCCL WARN NET/OFI Unable to find a protocol that worked.  "
        "Failing initialization.\n"
    )
    assert classify("".join(_lines("nccl_info_net_plugin_symbols.log")) + warn).signature == "nccl-failure"


def test_argparse_refusal_names_the_flag():
    d = classify_file(LOGS / "sglang_refused_unrecognized_arguments.log")
    assert d.signature == "engine-config-refused" and d.detail["flags"] == ["--reasoning_parser"]
    assert "--reasoning-parser" in d.suggestion and d.phase is None
    # an argparse usage error of another kind names its argument
    other = classify("launch_server.py: error: argument --attention-backend: invalid choice: 'fa5'\n")
    assert other.signature == "engine-config-refused" and other.detail["flags"] == ["--attention-backend"]


# ---------------------------------------------------------------- hardware first

XID79 = (LOGS.parent / "facts/pub-ogkm1151-journal-xid79.txt").read_text()


def _interleave(engine: str, kernel: str, at: int) -> str:
    """A merged journal as `journalctl -b` would show it: kernel lines inside the engine's."""
    lines = engine.splitlines(keepends=True)
    return "".join(lines[:at]) + kernel + "".join(lines[at:])


def test_xid79_near_an_illegal_memory_access_names_the_gpu_not_the_symptom():
    """Composed from two real texts (not a recorded log): vLLM's watchdog IMA
    (vllm-project/vllm#28028) with the real Xid 79 lines of open-gpu-kernel-modules#1151 in it."""
    engine = (LOGS / "vllm_rank1_watchdog_ima_server_log.log").read_text()
    assert classify(engine).signature == "illegal-memory-access"
    d = classify(_interleave(engine, XID79, 3), bus_ids={"00000000:2B:00.0": 5})
    assert d.signature == "gpu-hardware-fault" and d.detail["xid"] == 79 and d.detail["gpu"] == 5
    assert d.detail["symptom"] == "illegal-memory-access" and d.detail["action"] == "reboot"
    assert d.suggestion.startswith("GPU 5 (0000:2b:00): Xid 79") and "not its cause" in d.suggestion
    assert d.line == 5 and "79, GPU has fallen off the bus" in d.evidence
    # without the map the GPU is named by its PCI address
    assert classify(_interleave(engine, XID79, 3)).suggestion.startswith("the GPU at PCI 0000:2b:00")


def test_an_application_xid_keeps_the_software_name():
    """Xid 31 (an MMU fault: the program's bad address, pytorch/pytorch#51382) beside an illegal
    memory access: the software signature stays, the Xid goes into its detail."""
    engine = (LOGS / "vllm_rank1_watchdog_ima_server_log.log").read_text()
    kernel = (LOGS.parent / "facts/pub-pytorch51382-dmesg-xid43-31.txt").read_text()
    only31 = "".join(line for line in kernel.splitlines(keepends=True) if "): 31," in line)
    d = classify(_interleave(engine, only31, 3))
    assert d.signature == "illegal-memory-access" and d.detail["xid"] == 31


# ------------------------------------------------------------------ issue 46's kinds


def test_vllm_engine_dead_error_after_a_requested_stop_is_no_error():
    """vLLM's own shutdown lines (as in its journal on `systemctl stop`, vllm-project/vllm PR #43707)
    then the output handler's EngineDeadError race (vllm-project/vllm#48745): the stop's echo.
    CONSTRUCTED from those lines' shapes; the same EngineDeadError without a stop stays an error."""
    stop = (
        "(EngineCore pid=45060) INFO 08-25 17:51:32 [core.py:1313] [shutdown] EngineCore: trigger received "
        "signal=SIGTERM\n"
        "(APIServer pid=44555) INFO 08-25 17:51:32 [launcher.py:100] [shutdown] API server: shutdown triggered\n"
    )
    dead = (
        "(APIServer pid=44555) ERROR 08-25 17:51:32 [async_llm.py:546] AsyncLLM output_handler failed.\n"
        "(APIServer pid=44555) ERROR 08-25 17:51:32 [async_llm.py:546] Traceback (most recent call last):\n"
        '(APIServer pid=44555) ERROR 08-25 17:51:32 [async_llm.py:546]   File "/usr/lib/vllm/v1/engine/'
        'core_client.py", line 883, in get_output_async\n'
        "(APIServer pid=44555) ERROR 08-25 17:51:32 [async_llm.py:546]     raise self._format_exception(outputs) "
        "from None\n"
        "(APIServer pid=44555) ERROR 08-25 17:51:32 [async_llm.py:546] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.\n"
        "(APIServer pid=44555) INFO:     Application shutdown complete.\n"
    )
    assert not classify(stop + dead).error_found
    assert classify(dead).error_found


@pytest.mark.parametrize(
    "name", ["vllm_enginedead_after_requested_stop.log", "vllm_enginedead_after_external_sigterm.log"]
)
def test_real_engine_dead_error_is_quiet_because_of_the_stop_marker(name):
    """The two real logs (vllm#48745: systemctl stop; vllm#50067: a SIGTERM from outside) are quiet
    because of vLLM's '[shutdown] ...' line, not because EngineDeadError goes unread: without that line
    the same EngineDeadError is an error, also where the paste shortened it to '... EngineDeadError: ...'."""
    text = (LOGS / name).read_text()
    assert not classify(text).error_found
    bare = "".join(line for line in text.splitlines(keepends=True) if "[shutdown]" not in line)
    d = classify(bare)
    assert d.error_found and d.signature == "unclassified" and "EngineDeadError: EngineCore" in d.evidence


def test_a_fatal_nvswitch_sxid_beside_a_gpus_xid_is_named_too():
    """gpud's README capture: Xid 79 (the evidence), then fatal SXid 20034 on five links of three NVSwitches.
    The SXids are named beside it (switch, PCI id, links, NVIDIA's name), once per link, and an SXid line is
    no 'engine error' that the GPU fault caused."""
    d = classify_file(LOGS / "kernel_xid79_sxid20034_fatal.log")
    assert (d.signature, d.detail["xid"], d.detail["action"], d.line) == ("gpu-hardware-fault", 79, "reboot", 3)
    assert d.detail["also"] == (
        "SXid 20034 (fatal) LTSSM Fault Up on NVSwitch nvidia-nvswitch1 (PCI 0000:06:00) link 48; "
        "SXid 20034 (fatal) LTSSM Fault Up on NVSwitch nvidia-nvswitch0 (PCI 0000:05:00) links 63, 62; "
        "SXid 20034 (fatal) LTSSM Fault Up on NVSwitch nvidia-nvswitch2 (PCI 0000:07:00) links 60, 37"
    )
    assert "symptom" not in d.detail and "engine's own error" not in d.suggestion
    assert "Also: SXid 20034 (fatal) LTSSM Fault Up" in d.suggestion
    # the user's Talos journal: the fatal SXid 24007 (by its Severity line) first, the GPU's Xid 62 beside it
    d = classify_file(LOGS / "kernel_sxid24007_xid62_talos_journal.log")
    assert (d.detail["xid"], d.detail["source"], d.detail["action"]) == (24007, "sxid", "reboot")
    assert d.detail["also"] == "Xid 62 on the GPU at PCI 0000:48:00"
    assert d.suggestion.startswith("NVSwitch nvidia-nvswitch1 (PCI 0000:aa:00) link 12: SXid 24007 (fatal)")
    # the action is the worst of the faults named: the same lines, the GPU's Xid 62 moved first (reordered)
    lines = (LOGS / "kernel_sxid24007_xid62_talos_journal.log").read_text().splitlines(keepends=True)
    d = classify("".join([lines[4]] + lines[:4] + lines[5:]))
    assert (d.detail["xid"], d.detail["action"]) == (62, "reboot") and "SXid 24007 (fatal)" in d.detail["also"]
    assert "Action: drain the host and reboot it" in d.suggestion
    # non-fatal SXids are no fault, beside a fault or alone
    quiet = (LOGS / "kernel_sxid_nvswitch_nonfatal_boot.log").read_text()
    assert not classify(quiet).error_found
    d = classify(quiet + (LOGS / "kernel_xid79_fallen_off_bus_journal.log").read_text())
    assert d.detail["xid"] == 79 and "also" not in d.detail


def test_engine_died_unexpectedly_after_the_last_prompt_is_the_scripts_end():
    """vLLM's offline client says its engine 'died unexpectedly' at a script's normal end
    (vllm-project/vllm-ascend#5699, vllm#32468): after every prompt was processed it is the exit's
    echo. The variants below are CONSTRUCTED from that real log: before the last prompt finished, with
    an error of its own before it, or alone (vllm#32468's one line: nothing says the run finished) it
    stays an error."""
    text = (LOGS / "vllm_offline_script_end_engine_died_unexpectedly.log").read_text()
    assert not classify(text).error_found
    lines = text.splitlines(keepends=True)
    died = lines[-1]
    assert "died unexpectedly" in died
    mid_run = "".join(line for line in lines if "Processed prompts: 100%" not in line)
    d = classify(mid_run)
    assert d.error_found and "died unexpectedly" in d.evidence
    d = classify("".join(lines[:-1]) + "RuntimeError: Worker failed with error 'boom'\n" + died)
    assert d.error_found and d.evidence.startswith("RuntimeError")
    assert classify(died).error_found
    assert classify(
        "ERROR 01-16 17:16:49 [core_client.py:605] Engine core proc EngineCore_DP0 died unexpectedly, "
        "shutting down client.\n"
    ).error_found


def test_a_kill_that_echoes_a_requested_stop_is_not_a_kill():
    text = (
        "[2026-05-20 08:02:44] SIGTERM received. signum=15 frame=None. Draining requests and shutting down...\n"
        "[2026-05-20 08:02:50] Subprocess scheduler_0 (pid=889) crashed with exit code -9. Triggering SIGQUIT "
        "for cleanup...\n"
    )
    d = classify(text)
    assert d.signature != "process-killed"


def test_killed_takes_its_evidence_from_the_kill_not_a_warning():
    d = classify_file(LOGS / "killed_oom_killer_after_warning.log")
    assert (d.signature, d.title, d.evidence) == ("process-killed", "killed (signal 9)", "Killed")
    d = classify_file(LOGS / "killed_oom_killer_dmesg_python.log")
    assert d.title == "killed (signal 9) by the OOM killer" and "oom-kill:" in d.evidence
    assert "OOM killer" in d.suggestion


def test_oom_phase_is_named_and_capture_oom_only_in_capture():
    """sglang's attention-backend init frames (sgl-project/sglang#18262, real) with an OOM line at
    their end (CONSTRUCTED: the index's excerpt stops before the exception)."""
    text = (
        "[2026-07-15 09:39:24] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sglang/python/sglang/srt/managers/scheduler.py", line 424, in __init__\n'
        "    self.init_model_worker()\n"
        '  File "/sglang/python/sglang/srt/managers/scheduler.py", line 835, in init_all_attention_backends\n'
        "    self.tp_worker.init_attention_backends()\n"
        '  File "/sglang/python/sglang/srt/model_executor/model_runner.py", line 908, in init_attention_backends\n'
        "    self.init_attention_backend()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    d = classify(text)
    assert (d.signature, d.detail["phase"], d.title) == (
        "gpu-out-of-memory",
        "attention-backend-init",
        "out of GPU memory (attention-backend-init)",
    )
    assert "--mem-fraction-static" in d.suggestion
    d = classify_file(LOGS / "sglang_kv_pool_init_oom_compose.log")
    assert d.detail["phase"] == "kv-cache-init" and "KV cache" in d.suggestion
    assert classify_file(LOGS / "capture_oom_tp8.log").signature == "cuda-graph-capture-oom"


def test_backend_unsupported_gpu_names_the_compute_capability_where_shown():
    d = classify_file(LOGS / "sglang_fp8e4nv_a10_sm86.log")
    assert d.detail["compute_capability"] == "8.6" and "8.6" in d.suggestion
    assert "compute_capability" not in classify_file(LOGS / "vllm_no_kernel_image_engine_core.log").detail


def test_gpu_hardware_fault_from_cuda_text_and_from_nvidia_smi_name_the_action():
    d = classify_file(LOGS / "ecc_uncorrectable_chatglm3.log")
    assert d.signature == "gpu-hardware-fault" and "reset the GPU" in d.suggestion
    d = classify_file(LOGS / "nvidia_smi_device_handle_unknown_error.log")
    assert d.detail["pci"] == "0000:0b:00" and "reboot" in d.suggestion
    d = classify_file(LOGS / "gsp_heartbeat_timeout_journal.log")
    assert d.detail["source"] == "gsp" and d.suggestion.startswith("the driver's GPU0: GSP")


# ------------------------------------------- issue 46: healthy logs stay quiet (warnings, stops, drains)


@pytest.mark.parametrize(
    "line",
    [
        # vLLM's own WARNING records (vllm/_custom_ops.py's import warning; the process manager at shutdown)
        "WARNING 05-20 08:02:44 [_custom_ops.py:21] Failed to import from vllm._C with ImportError('libcuda.so.1')",
        "(APIServer pid=98719) WARNING 07-23 16:29:03 [utils.py:626] [shutdown] Process manager: force killing "
        "remaining processes count=1",
        # torch's C++ warnings (glog letter W), Python logging's and uvicorn's level words, Python warnings, NCCL INFO
        "[W1024 10:00:00.000000 1234 socket.cpp:697] [c10d] The client socket has failed to connect to [localhost]:29500 "
        "(errno: 99 - Cannot assign requested address).",
        "2025-01-01 10:00:00,123 - WARNING - Failed to load the chat template, falling back to the default",
        "WARNING:  Invalid HTTP request received.",
        "/usr/lib/python3/site-packages/torch/amp/autocast.py:61: DeprecationWarning: `torch.cuda.amp.autocast(args...)` "
        "is deprecated. Raising error in a future release",
        "host:123:456 [0] NCCL INFO Failed to open libibverbs.so[.1]",
    ],
)
def test_a_line_its_logger_calls_a_warning_or_info_is_no_crash(line):
    assert not classify(line + "\n").error_found


def test_the_same_words_at_error_level_are_an_error():
    line = "ERROR 05-20 08:02:44 [_custom_ops.py:21] Failed to import from vllm._C with ImportError('libcuda.so.1')"
    assert classify(line + "\n").error_found


def test_a_warning_may_explain_a_crash_it_did_not_make():
    """verl-project/verl#316: the worker died (raylet's line); the only cause in the log is vLLM's WARNING."""
    d = classify_file(LOGS / "verl_ray_workerdict_ima.log")
    assert d.signature == "illegal-memory-access" and "illegal memory access" in d.evidence


def test_an_error_line_before_the_server_said_ready_did_not_stop_the_start():
    start = (
        "[2025-10-01 10:00:00 TP0] Init torch distributed begin.\n"
        "[2025-10-01 10:00:01 TP0] Failed to load the custom allreduce kernel, fall back to NCCL.\n"
    )
    ready = "[2025-10-01 10:00:50] The server is fired up and ready to roll!\n"
    assert not classify(start + ready).error_found
    assert classify(start).error_found  # without the ready line it is the last word of a failed start
    died = ready + "[2025-10-01 10:05:00] Received sigquit from a child process. It usually means the child failed.\n"
    assert classify(start + died).error_found


def test_sglang_drain_and_its_self_kill_are_a_stop():
    """sglang's SIGTERM drain (tokenizer_manager.sigterm_watchdog) ends by SIGKILLing its own process tree:
    the shell prints 'Killed', systemd 'code=killed, status=9/KILL'. Older builds print only the drain line."""
    for head in (
        "[2026-06-26 21:18:55] SIGTERM received. signum=None frame=None. Draining requests and shutting down...\n",
        "",
    ):
        text = head + (
            "[2026-06-26 21:19:00] Gracefully exiting... Remaining number of requests 0. Remaining "
            "requests remaining_rids=[].\nKilled\n"
        )
        assert not classify(text).error_found, head
    unit = (
        "Dec 07 10:00:00 h sglang[1]: [2025-01-01 10:00:05] Gracefully exiting... remaining number of requests 0\n"
        "Dec 07 10:00:05 h systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL\n"
        "Dec 07 10:00:05 h systemd[1]: sglang.service: Failed with result 'signal'.\n"
    )
    assert not classify(unit).error_found
    assert classify("Killed\n").signature == "process-killed"  # without a stop, a kill is a kill


def test_a_child_stderr_logged_at_error_takes_its_own_level():
    """haotian-liu/LLaVA#415: '| ERROR | stderr | INFO: Uvicorn running on ...' is uvicorn's INFO."""
    line = clean_lines("2023-09-03 13:06:49 | ERROR | stderr | INFO:     Application startup complete.")[0]
    assert (line.text, line.level) == ("INFO:     Application startup complete.", "info")
    assert not classify_file(LOGS / "llava_uvicorn_startup_logged_as_error_healthy.log").error_found


def test_a_kill_after_sglangs_sigquit_cleanup_is_its_echo_not_the_cause():
    """sglang's parent, told by a failed child (SIGQUIT), kills its own process tree: the shell's 'Killed'
    after that is the cleanup (sgl-project/sglang#9151's tail); a scheduler SIGKILLed first is the kill."""
    echo = "[2025-08-13 02:01:56] Received sigquit from a child process. It usually means the child failed.\nKilled\n"
    d = classify(echo)
    assert d.error_found and d.signature != "process-killed"
    cause = (
        "[2026-05-20 08:02:50] Subprocess scheduler_0 (pid=889) crashed with exit code -9. Triggering SIGQUIT "
        "for cleanup...\n" + echo
    )
    d = classify(cause)
    assert d.signature == "process-killed" and "exit code -9" in d.evidence


def test_an_exception_python_ignored_at_exit_is_no_crash_but_what_follows_is():
    ignored = (
        "Exception ignored in: <function Pool.__del__ at 0x7f2b1c0d3e20>\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.10/multiprocessing/pool.py", line 268, in __del__\n'
        "TypeError: 'NoneType' object is not callable\n"
    )
    assert not classify(ignored).error_found
    d = classify(ignored + "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert d.signature == "illegal-memory-access"


def test_a_kill_named_by_its_exit_status_137():
    assert classify("Exit Code: 137\n").signature == "process-killed"  # kubectl describe's Last State
    assert not classify("Exit Code:    0\n").error_found


def test_systemds_account_of_a_requested_stop_is_the_stops_echo():
    stop = "Dec 07 10:00:00 h systemd[1]: Stopping SGLang Kimi...\n"
    tail = (
        "Dec 07 10:00:05 h systemd[1]: sglang.service: Main process exited, code=exited, status=1/FAILURE\n"
        "Dec 07 10:00:05 h systemd[1]: sglang.service: Failed with result 'exit-code'.\n"
    )
    slow = (
        "Dec 07 10:01:30 h systemd[1]: sglang.service: State 'stop-sigterm' timed out. Killing.\n"
        "Dec 07 10:01:30 h systemd[1]: sglang.service: Killing process 123 (python3) with signal SIGKILL.\n"
    )
    assert not classify(stop + tail).error_found and not classify(stop + slow).error_found
    assert classify(tail).error_found  # the same exit without a stop asked for is a failure


def test_a_stop_lasts_until_the_next_start():
    """A journal holds the restart after a stop: a kill of the new run is no echo of the old stop."""
    stop = (
        "Dec 07 10:00:00 h systemd[1]: Stopping SGLang Kimi...\n"
        "Dec 07 10:00:05 h systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL\n"
    )
    again = (
        "Dec 07 10:00:06 h systemd[1]: Started SGLang Kimi.\n"
        "Dec 07 11:00:00 h systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL\n"
    )
    assert not classify(stop).error_found
    d = classify(stop + again)
    assert d.signature == "process-killed" and d.line == 4


@pytest.mark.parametrize("name", ["gsp_heartbeat_timeout_journal.log", "kernel_xid13_109_dmesg.log"])
def test_a_driver_line_is_no_engine_error_the_fault_caused(name):
    """The driver's own lines (an `nvAssertFailedNoLog` assert, shown without its `NVRM:` once prefixes
    are stripped; nvidia-peermem's ERROR beside an Xid 109) are the fault's, not a symptom in the engine."""
    d = classify_file(LOGS / name)
    assert d.signature == "gpu-hardware-fault"
    assert "symptom" not in d.detail and "engine's own error" not in d.suggestion, d.detail
