"""The Grafana dashboard: built from metrics.py's names, and the names it uses
(`used_names`), which tests hold to what the engine serves."""

from __future__ import annotations

import re

from k26ops.monitoring import metrics as m
from k26ops.monitoring.prometheus import DCGM_JOB, ENGINE_SEL, GATEWAY_JOB

UID = "k26ops-fleet"
DS = {"type": "prometheus", "uid": "${datasource}"}
HOST = 'host=~"$host"'


def _q(name: str, labels: str = "") -> str:
    """`name{engine job, chosen hosts, labels}`; a name not in the tables is a programming error."""
    if name not in m.ENGINE and name not in m.DCGM and name not in (m.BASELINE_ACCEPT, m.LIVE_ACCEPT):
        raise KeyError(f"metric {name} is in no table of k26ops/monitoring/metrics.py")
    sel = ([ENGINE_SEL] if name in m.ENGINE else []) + [HOST] + ([labels] if labels else [])
    return f"{name}{{{','.join(sel)}}}"


def _panel(
    title: str,
    targets: list[tuple[str, str]],
    *,
    unit: str = "short",
    kind: str = "timeseries",
    desc: str = "",
    w: int = 12,
    h: int = 8,
    extra: dict | None = None,
) -> dict:
    return {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
        if kind == "timeseries"
        else {},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
        **(extra or {}),
    }


def _row(title: str) -> dict:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0},
    }


def panels() -> list[dict]:
    gen = _q("sglang:generation_tokens_total")
    return [
        _row("Speculative decoding"),
        _panel(
            "Accept length: live against the baseline's",
            [
                (f"{m.LIVE_ACCEPT}{{{HOST}}}", "{{host}} live (5 min, from the counters)"),
                (_q("sglang:spec_accept_length"), "{{host}} engine gauge"),
                (f"{m.BASELINE_ACCEPT}{{{HOST}}}", "{{host}} baseline"),
            ],
            desc="Tokens accepted per verify step. The baseline line is `k26ops monitoring --baseline TAG`'s "
            "stored bench (its lowest cell); the alert fires 15 min below it by the set margin.",
        ),
        _panel(
            "Verify steps per second",
            [(f"sum by (host) (rate({_q('sglang:spec_verify_calls_total')}[5m]))", "{{host}}")],
            unit="ops",
        ),
        _row("Throughput"),
        _panel(
            "Output tokens per second",
            [
                (f"sum by (host) (rate({gen}[5m]))", "{{host}} (counter)"),
                (f"sum by (host) ({_q('sglang:gen_throughput')})", "{{host}} (scheduler)"),
            ],
            unit="tok/s",
        ),
        _row("Queue and KV cache"),
        _panel(
            "Requests running and waiting",
            [
                (f"sum by (host) ({_q('sglang:num_running_reqs')})", "{{host}} running"),
                (f"sum by (host) ({_q('sglang:num_queue_reqs')})", "{{host}} waiting"),
            ],
        ),
        _panel("KV cache use", [(f"max by (host) ({_q('sglang:token_usage')})", "{{host}}")], unit="percentunit"),
        _row("Start-up"),
        _panel(
            "CUDA graph capture at start-up, by phase",
            [(f"max by (host, phase) ({_q('sglang:startup_cuda_graph_time_seconds')})", "{{host}} {{phase}}")],
            unit="s",
            kind="bargauge",
            w=12,
        ),
        _panel(
            "Forward passes by CUDA graph mode",
            [(f"sum by (host, mode) (rate({_q('sglang:cuda_graph_passes_total')}[5m]))", "{{host}} {{mode}}")],
            unit="ops",
        ),
        _row("Serving"),
        _panel(
            "Scrape targets up",
            [
                (f"up{{{ENGINE_SEL},{HOST}}}", "engine {{host}}"),
                (f'up{{job="{DCGM_JOB}",{HOST}}}', "dcgm {{host}}"),
                (f'up{{job="{GATEWAY_JOB}"}}', "gateway"),
            ],
            w=24,
        ),
        _row("GPU health (DCGM exporter)"),
        _panel("Last Xid per GPU (a change is a new Xid)", [(_q("DCGM_FI_DEV_XID_ERRORS"), "{{host}} GPU {{gpu}}")]),
        _panel(
            "Uncorrectable memory errors and row remaps",
            [
                (f"increase({_q('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[1h])", "{{host}} GPU {{gpu}} DBE ECC"),
                (
                    f"increase({_q('DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS')}[1h])",
                    "{{host}} GPU {{gpu}} remapped rows",
                ),
                (_q("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "{{host}} GPU {{gpu}} remap failed"),
            ],
        ),
        _panel("GPU temperature", [(_q("DCGM_FI_DEV_GPU_TEMP"), "{{host}} GPU {{gpu}}")], unit="celsius"),
        _panel(
            "GPU utilisation and memory",
            [
                (_q("DCGM_FI_DEV_GPU_UTIL"), "{{host}} GPU {{gpu}} util %"),
                (_q("DCGM_FI_DEV_FB_USED"), "{{host}} GPU {{gpu}} MiB"),
            ],
        ),
    ]


def _layout(items: list[dict]) -> list[dict]:
    """Rows full width; panels two to a line."""
    y, x, out = 0, 0, []
    for i, p in enumerate(items, 1):
        p = dict(p, id=i)
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if p["type"] == "row" or x + w > 24:
            y += h if x else 0
            x = 0
        if p["type"] == "row":
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
        else:
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            x += w
            if x >= 24:
                x, y = 0, y + h
        out.append(p)
    return out


def dashboard(title: str = "k26ops: engine fleet") -> dict:
    return {
        "uid": UID,
        "title": title,
        "tags": ["k26ops", "sglang"],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "graphTooltip": 1,
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "host",
                    "type": "query",
                    "datasource": DS,
                    "label": "host",
                    "query": {"query": f"label_values(up{{{ENGINE_SEL}}}, host)", "refId": "hosts"},
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "current": {"text": "All", "value": "$__all"},
                    "sort": 1,
                },
            ]
        },
        "panels": _layout(panels()),
    }


_NAME = re.compile(r"(?<![\w:])((?:sglang|k26ops):[A-Za-z0-9_:]+|DCGM_[A-Z0-9_]+|up)(?=\s*[{\[)])")


def used_names(board: dict) -> set[str]:
    """Every metric name the dashboard's queries use."""
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]
    return {n for e in exprs for n in _NAME.findall(e)}
