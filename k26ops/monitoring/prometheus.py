"""Prometheus files for the fleet: targets (file_sd), the scrape config, and the rules.

Pure functions from `HostTarget`s (targets.py reads them from the inventory) to file
texts; the CLI writes them. The engine's api key goes into its own file (mode 0600)
that the config names with `authorization.credentials_file`: never into the config.
(SGLang serves /metrics without the key, as recorded on the GPU: the key is sent for
an engine or proxy that asks for it.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import yaml

from k26ops.monitoring import metrics as m

ENGINE_JOB, DCGM_JOB, GATEWAY_JOB = "k26-engine", "k26-dcgm", "k26-gateway"


@dataclass
class HostTarget:
    host: str
    engine: str  # address:port Prometheus scrapes
    dcgm: str | None = None  # address:port of the DCGM exporter
    gateway: str | None = None  # address:port of the model gateway's metrics
    api_key: str | None = field(default=None, repr=False)
    baseline_accept: float | None = None
    release: str | None = None


@dataclass
class Files:
    """Relative path -> text, and the paths that hold secrets (written 0600 in a 0700 dir)."""

    texts: dict[str, str]
    secret: set[str]


def _engine_jobs(targets: list[HostTarget]) -> list[tuple[str, str | None, list[HostTarget]]]:
    """(job name, secret file, hosts): one job per distinct api key (credentials are per job)."""
    keys: list[str | None] = []
    for t in targets:
        if t.api_key not in keys:
            keys.append(t.api_key)
    keys.sort(key=lambda k: k is not None)  # the keyless job first
    out = []
    for i, key in enumerate(keys):
        name = ENGINE_JOB if len(keys) == 1 else f"{ENGINE_JOB}-{i + 1}"
        secret = None if key is None else f"secrets/{name}-api-key"
        out.append((name, secret, [t for t in targets if t.api_key == key]))
    return out


def _labels(t: HostTarget) -> dict:
    return {"host": t.host, **({"release": t.release} if t.release else {})}


def _job(name: str, sd_file: str, secret: str | None = None) -> dict:
    job = {"job_name": name, "metrics_path": "/metrics", "file_sd_configs": [{"files": [sd_file]}]}
    if secret:
        job["authorization"] = {"type": "Bearer", "credentials_file": secret}
    return job


def files(
    targets: list[HostTarget],
    *,
    accept_drop_pct: float = 10.0,
    scrape_interval: str = "15s",
    key_file: str | None = None,
) -> Files:
    """Every file `k26ops monitoring` writes, by relative path.
    key_file: name this existing file on the Prometheus server instead of writing the key."""
    texts: dict[str, str] = {}
    secret: set[str] = set()
    jobs = []
    for name, secret_path, hosts in _engine_jobs(targets):
        sd = f"targets/{name}.json"
        texts[sd] = _sd([(t.engine, _labels(t)) for t in hosts])
        if secret_path:
            if key_file:
                secret_path = key_file
            else:
                texts[secret_path] = hosts[0].api_key + "\n"
                secret.add(secret_path)
        jobs.append(_job(name, sd, secret_path))
    for job, attr in ((DCGM_JOB, "dcgm"), (GATEWAY_JOB, "gateway")):
        found = sorted({(getattr(t, attr), t.host) for t in targets if getattr(t, attr)})
        if not found:
            continue
        sd = f"targets/{job}.json"
        seen: dict[str, str] = {}
        for addr, host in found:  # a shared gateway is one target, labelled with its first host
            seen.setdefault(addr, host)
        texts[sd] = _sd([(addr, {"host": host}) for addr, host in seen.items()])
        jobs.append(_job(job, sd))
    texts["prometheus.yml"] = _dump(
        {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": ["k26ops-rules.yml"],
            "scrape_configs": jobs,
        }
    )
    texts["k26ops-rules.yml"] = rules(
        targets,
        accept_drop_pct=accept_drop_pct,
        gateway=any(t.gateway for t in targets),
        dcgm=any(t.dcgm for t in targets),
    )
    return Files(texts, secret)


def _sd(items: list[tuple[str, dict]]) -> str:
    return json.dumps([{"targets": [addr], "labels": labels} for addr, labels in items], indent=1) + "\n"


def _dump(doc: dict) -> str:
    return "# Written by `k26ops monitoring`; regenerate rather than edit.\n" + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=False
    )


ENGINE_SEL = f'job=~"{ENGINE_JOB}.*"'


def live_accept_expr(window: str = "5m") -> str:
    """Accepted tokens per verify step, per host, from the two counters (as `k26ops bench` reads
    them: both label sets of generation_tokens_total summed); no value while idle."""
    return (
        f"sum by (host) (rate(sglang:generation_tokens_total{{{ENGINE_SEL}}}[{window}])) / "
        f"sum by (host) (rate(sglang:spec_verify_calls_total{{{ENGINE_SEL}}}[{window}])) > 0"
    )


def rules(targets: list[HostTarget], *, accept_drop_pct: float = 10.0, gateway: bool = False, dcgm: bool = True) -> str:
    """Recording rules (each host's baseline accept length; the live one) and the alerts."""
    baseline = [
        {"record": m.BASELINE_ACCEPT, "expr": f"vector({t.baseline_accept:g})", "labels": {"host": t.host}}
        for t in targets
        if t.baseline_accept
    ]
    factor = 1 - accept_drop_pct / 100.0
    alerts = [
        {
            "alert": "K26EngineNotServing",
            "expr": f"up{{{ENGINE_SEL}}} == 0",
            "for": "2m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.host }}: the engine's /metrics does not answer",
                "description": "Prometheus cannot scrape {{ $labels.instance }} for 2 minutes: "
                "the engine is down, restarting or not started with --enable-metrics.",
            },
        },
    ]
    if baseline:
        alerts.append(
            {
                "alert": "K26AcceptLengthBelowBaseline",
                "expr": f"avg_over_time({m.LIVE_ACCEPT}[15m]) < on (host) ({m.BASELINE_ACCEPT} * {factor:g})",
                "for": "15m",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": '{{ $labels.host }}: accept length {{ $value | printf "%.2f" }} is over '
                    f"{accept_drop_pct:g}% below the baseline's",
                    "description": "The drafter accepts fewer tokens than at the baseline: a changed "
                    "drafter, engine or traffic mix (temperature, prompts).",
                },
            }
        )
    if dcgm:
        alerts += [
            {
                "alert": "K26GpuNewXid",
                "expr": "changes(DCGM_FI_DEV_XID_ERRORS[10m]) > 0",
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "{{ $labels.host }} GPU {{ $labels.gpu }}: a new Xid",
                    "description": "DCGM_FI_DEV_XID_ERRORS changed (its value is the last Xid's code); "
                    "`k26ops facts` and `k26ops diagnose` name it.",
                },
            },
            {
                "alert": "K26GpuUncorrectableMemoryError",
                "expr": "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0 or "
                "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[10m]) > 0 or DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "{{ $labels.host }} GPU {{ $labels.gpu }}: double-bit ECC error or row remap"
                },
            },
        ]
    if gateway:
        alerts.append(
            {
                "alert": "K26GatewayDown",
                "expr": f'up{{job="{GATEWAY_JOB}"}} == 0',
                "for": "2m",
                "labels": {"severity": "critical"},
                "annotations": {"summary": "the model gateway's metrics do not answer"},
            }
        )
    groups = [
        {"name": "k26ops-recording", "rules": [{"record": m.LIVE_ACCEPT, "expr": live_accept_expr()}, *baseline]},
        {"name": "k26ops-alerts", "rules": alerts},
    ]
    return _dump({"groups": groups})
