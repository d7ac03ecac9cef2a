"""The metric names k26ops' dashboard and alerts query: one table, with where each
name was seen. A renamed metric is caught by tests/features/test_monitoring.py (the dashboard
may use only names the lab's engine stand-in serves, and the stand-in only names of
this table), not by an empty panel.

Sources: "recorded" names appear in the real engine's /metrics as recorded on the
lent GPU (the files named); "source" names were read from SGLang's metrics collector
and still wait for a recorded full /metrics (RECORD_NEXT).
"""

from __future__ import annotations

from dataclasses import dataclass

RECORDED_SPEC = "tests/data/serving/h200-metrics-end.txt (sglang 0.5.17, H200)"
RECORDED_STARTUP = "tests/data/rehearsal/h200-qwen3-dflash-final.json (sglang 0.5.17, H200)"
READ_SOURCE = "sglang metrics collector (python/sglang/srt/metrics/collector.py), read, not recorded"
RECORDED_FULL = "tests/data/serving/h100-metrics-full-0.5.17.txt (sglang 0.5.17, H100, the whole /metrics)"
DCGM_SOURCE = "dcgm-exporter default counters (etc/default-counters.csv), read, not recorded"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # gauge, counter
    what: str
    source: str


ENGINE = {
    m.name: m
    for m in (
        Metric(
            "sglang:spec_accept_length", "gauge", "speculative accept length (tokens per verify step)", RECORDED_SPEC
        ),
        Metric(
            "sglang:generation_tokens_total", "counter", "output tokens (label is_streaming: sum both)", RECORDED_SPEC
        ),
        Metric("sglang:spec_verify_calls_total", "counter", "speculative verify steps", RECORDED_SPEC),
        Metric(
            "sglang:startup_cuda_graph_time_seconds",
            "gauge",
            "CUDA graph capture seconds at start-up, by phase",
            RECORDED_STARTUP,
        ),
        Metric("sglang:cuda_graph_passes_total", "counter", "forward passes by CUDA graph mode", RECORDED_STARTUP),
        Metric("sglang:gen_throughput", "gauge", "generation throughput (tok/s), the scheduler's own", RECORDED_FULL),
        Metric("sglang:num_running_reqs", "gauge", "requests running", RECORDED_FULL),
        Metric("sglang:num_queue_reqs", "gauge", "requests waiting in the queue", RECORDED_FULL),
        Metric("sglang:token_usage", "gauge", "KV cache use (0-1)", RECORDED_FULL),
    )
}

DCGM = {
    m.name: m
    for m in (
        Metric("DCGM_FI_DEV_XID_ERRORS", "gauge", "the last Xid error's code", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "volatile double-bit ECC errors", DCGM_SOURCE),
        Metric(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "rows remapped for uncorrectable errors", DCGM_SOURCE
        ),
        Metric("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "row remapping failed (1)", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C)", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilisation (%)", DCGM_SOURCE),
        Metric("DCGM_FI_DEV_FB_USED", "gauge", "GPU memory used (MiB)", DCGM_SOURCE),
    )
}

# What the lead records next on the GPU to turn "read" into "recorded" (a full /metrics after a bench).
RECORD_NEXT = sorted(n for n, m in ENGINE.items() if m.source == READ_SOURCE)

# k26ops' own series, made by its recording rules (prometheus.py).
BASELINE_ACCEPT = "k26ops:baseline_accept_length"
LIVE_ACCEPT = "k26ops:accept_length:rate5m"
