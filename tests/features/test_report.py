"""k26ops.report and `k26ops report`: the page from recorded real benches (the H200's,
tests/data/serving), with no URL, script or outside file in it; each section only with
its data; and the page opened in headless Chromium, on a desktop and on a phone's width."""

from __future__ import annotations

import copy
import json
import re

import pytest

from k26ops.enginebench import figures as figs
from k26ops.report import charts, model, page
from labtools import REPO
from labtools.browser import browse, colour_pixels
from labtools.invoke import cli

DATA = REPO / "tests/data/serving"
NEW = json.loads((DATA / "h200-bench-sglang.json").read_text())  # the real engine, SGLang's benchmark
OLD = json.loads((DATA / "h200-bench-k26ops.json").read_text())  # the same engine, k26ops' loadgen
NB, OB = NEW["hosts"]["h200"]["bench"], OLD["hosts"]["h200"]["bench"]


def compare_doc() -> dict:
    """What `k26ops --json bench --compare old` prints, from the two recorded benches."""
    doc = copy.deepcopy(NEW)
    doc["hosts"]["h200"]["compare"] = {
        "tag": "k26-old",
        "baseline_host": "h200",
        "rows": figs.compare(NB, OB),
        "settings_differ": figs.spec_differences(NB, OB),
    }
    return doc


def gate_doc(threshold: float) -> dict:
    """What `k26ops --json deploy --canary 1 --gate k26-old` prints for the canary."""
    verdict = figs.gate_verdict(NB, OB, list(figs.DEFAULT_GATE), threshold)
    ok = verdict["ok"]
    return {
        "command": "deploy",
        "hosts": {
            "h200": {
                "status": "ok" if ok else "failed",
                "bench": NB,
                "gate": {
                    "tag": "k26-old",
                    "baseline_host": "h200",
                    "ok": ok,
                    "line": None if ok else figs.gate_line("h200", verdict),
                    **verdict,
                },
            }
        },
    }


# No reference the browser would follow: src/href/url()/@import, and no URL text at all.
FETCHES = re.compile(r"""<script|<link|<iframe|<img|<object|<embed|@import|url\((?!#)|\bsrc=|href=(?!"#)""", re.I)


def charts_of(html: str) -> list[str]:
    return re.findall(r'<figure class="figure" data-chart="([^"]+)"', html)


def test_a_compare_report_is_one_self_contained_page():
    html = page.build_html(model.from_run(compare_doc(), generated="2026-12-07 07:00 UTC"))
    assert "http://" not in html and "https://" not in html
    assert not FETCHES.search(html), FETCHES.search(html)
    assert '<meta name="viewport"' in html
    assert charts_of(html) == [
        "output tok/s against concurrency",
        "tok/s per user against tok/s per GPU (8 GPUs), each point one concurrency",
        "accept length per temperature",
        "TTFT and ITL, p50 and p99",
    ]
    # new beside the baseline: both in every chart's legend, each figure in the table
    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        assert "k26-old" in svg and "new" in svg
    assert html.count("<tr>") - 2 == len(NB["cells"]) + len(figs.compare(NB, OB))
    assert "settings differ from the baseline" in html  # the two generators
    # nothing drawn for data that is not there
    for absent in ("The restart", "GPU health changes", "through the gateway", "draft position", "Gate "):
        assert absent not in html


def test_a_bench_alone_draws_no_baseline():
    html = page.build_html(model.from_run(NEW))
    assert len(charts_of(html)) == 4 and "baseline" not in html.lower().replace("beside the baseline", "")
    assert "Every figure beside" not in html


def test_the_gate_says_its_verdict_and_why():
    html = page.build_html(model.from_run(gate_doc(5.0)))
    line = figs.gate_line("h200", figs.gate_verdict(NB, OB, list(figs.DEFAULT_GATE), 5.0))
    assert f'class="verdict fail" id="verdict">Gate failed on 1 of 1 host(s): {line[len("gate failed on ") :]}' in html
    assert "gate failed on h200" not in html  # the verdict's words once, not twice
    assert "tok/s@c1/t0" in html and "over" in html
    passed = page.build_html(model.from_run(gate_doc(50.0)))
    assert 'class="verdict pass" id="verdict">Gate passed on all 1 gated host(s)' in passed


# A restart's TTFGT as the deploy reports it (k26ops.steps.warmstart.timeline), on the H100's
# cold start of docs/how-to/warm-starts.md: ready 122.7 s after the process started, capture 65.9 s.
TTFGT = {
    "milestones": [
        {"name": "stop", "at_s": 0.0, "source": "k26ops"},
        {"name": "process started", "at_s": 8.0, "source": "systemd"},
        {"name": "weights loaded", "at_s": 28.5, "source": "log"},
        {"name": "graphs captured", "at_s": 94.4, "source": "log"},
        {"name": "ready", "at_s": 130.7, "source": "log"},
        {"name": "first greedy answer", "at_s": 131.0, "source": "k26ops"},
        {"name": "first sampled answer", "at_s": 210.0, "source": "k26ops"},
    ],
    "clock": "host",
    "stop_s": 8.0,
    "ready_s": 122.7,
    "total_s": 210.0,
}
# A host's drain (k26ops.traffic.drain's record) and the run's gateway watch.
DRAIN = {
    "mode": "gateway",
    "drain_timeout_s": 300,
    "drain_s": 21.4,
    "requests": 47,
    "left": 2,
    "out_of_rotation_s": 38.2,
    "stop_to_serving_s": 17.1,
    "put_back": True,
}
WATCH = {"zero_worker_windows": 0, "gateways": {"127.0.0.1:29001": {"min_healthy": 1, "zero_worker_windows": 0}}}


def test_sections_other_features_fill_appear_with_their_data():
    """The restart's phases (`ttfgt`), GPU changes (`gpu_changes`), the drain (`traffic`), the
    gateway watch and accept per draft position: drawn when present, in the shapes k26ops writes."""
    doc = compare_doc()
    h = doc["hosts"]["h200"]
    h["ttfgt"] = TTFGT
    h["gpu_changes"] = [{"gpu": 3, "change": "new Xid 79", "before": None, "after": 79}]
    h["traffic"] = DRAIN
    doc["traffic"] = WATCH
    h["bench"]["cells"][0]["accept_histogram"] = [10, 20, 30, 40]
    html = page.build_html(model.from_run(doc))
    assert "the restart" in html.lower() and ">210<" in html and ">65.9<" in html  # the total; the capture
    assert "to graphs captured s" in html and "<title>the restart's phases</title>" in html
    assert "new Xid 79" in html
    assert "2 request(s) still in flight when the engine stopped (cut off)" in html and ">21.4<" in html
    assert "no gateway ever had zero healthy workers" in html and "127.0.0.1:29001" in html
    assert "acceptance rate per draft position" in charts_of(html)
    # a clean drain and a watch that saw a gateway empty
    h["traffic"] = {**DRAIN, "left": 0}
    doc["traffic"] = {**WATCH, "zero_worker_windows": 1}
    html = page.build_html(model.from_run(doc))
    assert "no request cut off by the restart" in html and "ZERO healthy workers 1 time(s)" in html
    # a restart without phases recorded: the wait for /health, said so
    bare = page.build_html(
        model.from_run(
            {"command": "deploy", "hosts": {"h": {"engine_restarted": True, "health": {"state": "ok", "wait_s": 47.3}}}}
        )
    )
    assert ">47.3<" in bare and "phases not recorded" in bare


def test_a_bench_draws_its_last_start_beside_the_baselines():
    """`bench` attaches the host's last start (startup.ttfgt), `snapshot --bench` stores it:
    the restart drawn new beside the baseline's."""
    new, old = copy.deepcopy(NB), copy.deepcopy(OB)
    new["startup"] = {"release": "r2", "ttfgt": TTFGT}
    warm = copy.deepcopy(TTFGT)
    for m in warm["milestones"][2:]:
        m["at_s"] = round(m["at_s"] - 60, 1)
    old["startup"] = {"release": "r1", "ttfgt": warm}
    view = model.from_baselines("old", {"h200": old}, "new-tag", {"h200": new})
    assert [who for who, _ in view.hosts[0].phases] == ["old", "new-tag"]
    html = page.build_html(view)
    assert "<title>the restart's phases</title>" in html and ">150<" in html and ">210<" in html
    assert model.milestone_phases(TTFGT)[0] == ("to process started", 8.0)
    assert model.milestone_phases({"milestones": []}) == [] and model.milestone_phases(None) == []


def test_the_report_is_the_same_for_the_same_data():
    a = page.build_html(model.from_run(compare_doc()))
    assert a == page.build_html(model.from_run(compare_doc()))


def test_svg_text_needs_no_namespace_urls():
    out = charts.throughput(NB, OB, "new", "old")
    assert out.startswith("<svg") and "xmlns" not in out and "<metadata" not in out
    assert 'class="chart" role="img"' in out and "<title>" in out


def test_report_command_writes_the_file_and_says_where(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(compare_doc()))
    out = tmp_path / "sub" / "r.html"
    proc = cli("-i", str(tmp_path / "none.yml"), "report", str(run), "--report", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"report written to {out}"
    assert "Bench against k26-old" in out.read_text()
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]  # no temporary file left


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "cannot read: No such file"),
        ("{not json", "run.json:1: not JSON"),
        ('{"hosts": []}', "not a k26ops --json run document"),
        ('{"hosts": {"h": {"status": "ok"}}}', "nothing to draw"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, content, says):
    run = tmp_path / "run.json"
    if content is not None:
        run.write_text(content)
    out = tmp_path / "r.html"
    proc = cli("report", str(run), "--report", str(out))
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists() and "Traceback" not in proc.stderr


def test_report_needs_one_source():
    proc = cli("report")
    assert proc.returncode == 2 and "RUN.json" in proc.stderr and "--compare OLD NEW" in proc.stderr


def test_two_baselines_side_by_side():
    view = model.from_baselines("old", {"h200": OB}, "new-tag", {"h200": NB})
    html = page.build_html(view)
    assert view.kind == "compare" and "new-tag against old" in html and len(charts_of(html)) == 4
    with pytest.raises(Exception, match="'old' has no bench results"):
        model.from_baselines("old", {}, "new-tag", {"h200": NB})


NEW_RGB, BASE_RGB = (0x1F, 0x77, 0xB4), (0x8C, 0x8C, 0x8C)


def test_the_report_renders_in_chromium_on_a_desktop_and_a_phone(tmp_path):
    """A person's view: every chart laid out at a real size with its lines and bars drawn,
    new and baseline both painted (their colours in the screenshot), and on a phone's width
    the page does not scroll sideways (tables scroll inside their own box)."""
    doc = compare_doc()
    doc["hosts"]["h200"]["ttfgt"] = TTFGT
    report = tmp_path / "report.html"
    report.write_text(page.build_html(model.from_run(doc)))
    laid, shot = browse(report, tmp_path / "desktop", width=1000, height=4200)
    assert [c["name"] for c in laid["charts"]] == charts_of(report.read_text())
    for c in laid["charts"]:
        assert c["width"] > 500 and c["height"] > 100 and c["drawn"] > 10, c
    assert "k26-old" in laid["charts"][0]["text"] and "concurrent requests" in laid["charts"][0]["text"]
    assert colour_pixels(shot, NEW_RGB) > 2000 and colour_pixels(shot, BASE_RGB) > 500
    phone, phone_shot = browse(report, tmp_path / "phone", width=390, height=1600, phone=True)
    assert phone["scroll_width"] <= phone["inner_width"] == 390, phone["scroll_width"]
    for c in phone["charts"]:
        assert 300 < c["width"] <= 390 and c["drawn"] > 10, c
    assert phone_shot.stat().st_size > 10_000


def test_the_default_place_is_the_data_dir(monkeypatch, tmp_path):
    from datetime import datetime

    from k26ops.report import files

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    at = datetime(2026, 12, 7, 7, 30, 5)
    assert (
        files.default_path("gate", "rel/2026-12", at)
        == tmp_path / "k26ops/reports/gate-rel_2026-12-20261207-073005.html"
    )
    assert files.gpus_per_host({"tp_size": 16, "nnodes": 2}) == 8 and files.gpus_per_host({}) == 8
    assert files.gpus_per_host({"tp_size": 1}) == 1


def test_a_compare_with_start_up_figures_keeps_them_out_of_the_cells():
    """`bench --compare` rows also hold the last start's METRIC@start figures (issue 43); the
    baseline's cells are rebuilt from the cell figures only (a start-up figure has no cell:
    sorting it among them raised a TypeError in `k26ops report`)."""
    stat = {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}
    got = model.cells_from_figures(
        {"tok/s@c1/t0": stat, "ready_s@start": stat, "ttfgt_s@start": stat, "tok/s@c4/t0.7": stat}
    )
    assert [(c["concurrency"], c["temperature"]) for c in got["cells"]] == [(1, 0.0), (4, 0.7)]
