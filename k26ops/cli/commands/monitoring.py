"""`k26ops monitoring`: Prometheus targets, scrape config and rules, and the Grafana
dashboard, for the selected hosts (k26ops.monitoring); `--verify` asks each engine."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click

from k26ops.cli import jsonout
from k26ops.cli.benchopts import baselines_option
from k26ops.cli.report import run_and_report
from k26ops.engine.multinode import serves_http
from k26ops.enginebench.run import agent, target
from k26ops.enginebench.stored import stored_benches
from k26ops.errors import UserError
from k26ops.monitoring import check, grafana, prometheus
from k26ops.monitoring.targets import baseline_accepts, host_target
from k26ops.steps import HostContext, StepFailed
from k26ops.transport.fleet import Outcome

DASHBOARD = "grafana/k26ops-dashboard.json"


@click.command(name="monitoring")
@click.option(
    "--out",
    "out_dir",
    default="k26ops-monitoring",
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Directory to write the files into (made if missing).",
)
@click.option(
    "--baseline",
    "tag",
    metavar="TAG",
    help="Baseline whose stored bench gives each host's accept length for the drift alert.",
)
@click.option(
    "--accept-drop",
    type=click.FloatRange(0.1, 90),
    default=10.0,
    show_default=True,
    metavar="PCT",
    help="Alert when the live accept length stays this many percent below the baseline's for 15 min.",
)
@click.option(
    "--api-key-file",
    metavar="PATH",
    help="Name this file (on the Prometheus server) for the engine's api key instead of writing "
    "the key into DIR/secrets/.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Also ask each engine for its /metrics (from the host, over SSH) and fail on a "
    "dashboard metric it does not serve.",
)
@baselines_option("Baselines repository for --baseline")
@click.pass_obj
def monitoring_cmd(settings, out_dir, tag, accept_drop, api_key_file, verify, baselines_dir):
    """Write Prometheus files (file_sd targets for each engine's /metrics, the DCGM exporter on :9400
    and the gateway; rules: accept length below the baseline's, engine not serving, a new Xid) and a
    Grafana dashboard for the selected hosts. The inventory's `monitoring: true` runs the engine
    with --enable-metrics at the next deploy."""
    hosts = settings.selected_hosts()
    accepts = baseline_accepts(stored_benches(baselines_dir, tag)) if tag else {}
    targets, warnings = [], []
    for h in hosts:
        if not serves_http(h.vars):
            continue  # a follower rank serves no HTTP: its leader is scraped
        t, warn = host_target(h, accepts.get(h.name) or (next(iter(accepts.values())) if accepts else None))
        targets.append(t)
        warnings += warn
        if not h.vars.get("monitoring"):
            warnings.append(
                f"{h.name}: inventory var monitoring is not set: its engine may run without "
                "--enable-metrics (set `monitoring: true` and deploy)"
            )
    files = prometheus.files(targets, accept_drop_pct=accept_drop, key_file=api_key_file)
    files.texts[DASHBOARD] = json.dumps(grafana.dashboard(), indent=1) + "\n"
    out = Path(out_dir).expanduser()
    written = _write(out, files)
    for w in warnings:
        click.echo(f"k26ops: warning: {w}", err=True)
    if settings.as_json and not verify:
        jsonout.emit({"out": str(out), "files": written, "targets": [t.host for t in targets]})
    elif not settings.as_json:
        click.echo(f"wrote {len(written)} files to {out}: " + ", ".join(written))
        click.echo(
            f"Prometheus: prometheus --config.file={out / 'prometheus.yml'} (or merge its scrape_configs); "
            f"Grafana: import {out / DASHBOARD}"
        )
    if verify:
        _verify(settings, grafana.used_names(grafana.dashboard()))


def _write(out: Path, files: prometheus.Files) -> list[str]:
    """Each file atomically; secrets 0600 in a 0700 directory. Returns the paths written."""
    try:
        for rel, text in files.texts.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel in files.secret:
                os.chmod(path.parent, 0o700)
            fd, tmp = tempfile.mkstemp(prefix=".k26ops-", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o600 if rel in files.secret else 0o644)
            os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write: {exc.strerror or exc} ({exc.filename or out})") from None
    return sorted(files.texts)


def _verify(settings, used: set[str]) -> None:
    def work(session, progress=None):
        ctx = HostContext(session=session, host=session.host, vars=dict(session.host.vars), facts={})
        if not serves_http(ctx.vars):
            return Outcome(verdict="- (served by rank 0)")
        t = target(ctx)
        got = agent(session, "metrics", timeout=30, host=t["host"], port=t["port"], api_key=t["api_key"])
        if got.get("status") != 200:
            raise StepFailed(
                f"/metrics at {t['host']}:{t['port']} answered {got.get('status') or got.get('error')}"
                " (is the engine running with --enable-metrics? `monitoring: true` and deploy)"
            )
        lacking = check.missing(used, check.family_names(got["text"]))
        if lacking:
            raise StepFailed(
                f"the dashboard uses {len(lacking)} metric(s) this engine does not serve: " + ", ".join(lacking)
            )
        return Outcome(verdict=f"serves all {len([n for n in used if n.startswith('sglang:')])} engine metrics")

    run_and_report(settings, work, title="monitoring --verify", columns=[("verdict", "verdict")])
