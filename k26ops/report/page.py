"""The report page: `build_html(view)` is a pure function of a ReportView (model.py).

One file, readable anywhere: inline CSS and SVG, no script, no font or image fetched,
no `http://` or `https://` anywhere in it; a viewport line and fluid charts for phones.
A section appears only when its data is there.
"""

from __future__ import annotations

from html import escape

from k26ops.enginebench import figures as figs
from k26ops.report import charts
from k26ops.report.model import HostView, ReportView

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:980px;
padding:12px;color:#1b1b1b;background:#fff}
h1{font-size:1.35em;margin:.3em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin:1.1em 0 .3em}
.meta,.note{color:#555;font-size:.9em}
.verdict{padding:.6em .8em;border-radius:6px;margin:.6em 0;font-weight:600}
.pass{background:#e6f4ea;border:1px solid #34a853}.fail{background:#fce8e6;border:1px solid #d93025}
.figure{margin:.4em 0 1em}.figure svg{width:100%;height:auto;display:block}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;font-size:.88em;min-width:100%}
th,td{padding:.25em .5em;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
.worse{color:#b3261e;font-weight:600}.better{color:#137333;font-weight:600}
"""


def _h(text) -> str:
    return escape(str(text), quote=True)


def _n(x) -> str:
    return (
        figs.plain_number(x)
        if isinstance(x, (int, float)) and not isinstance(x, bool)
        else _h(x if x is not None else "-")
    )


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    th = "".join(f"<th>{_h(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def _figure(svg: str | None, caption: str) -> str:
    if not svg:
        return ""
    return f'<figure class="figure" data-chart="{_h(caption)}">{svg}<figcaption class="note">{_h(caption)}</figcaption></figure>'


def _gate(v: HostView) -> str:
    g = v.gate
    if not g:
        return ""
    ok = bool(g.get("ok"))
    word = "passed" if ok else "failed"
    line = g.get("line") or ""
    prefix = f"gate failed on {v.host}: "
    why = line[len(prefix) :] if line.startswith(prefix) else line
    if ok:
        why = f"no gated figure is more than {_n(g.get('threshold_pct', '?'))}% worse than the baseline's"
    out = [
        f'<div class="verdict {"pass" if ok else "fail"}">Gate {word} against '
        f"{_h(g.get('tag') or 'the baseline')}: {_h(why or v.error or '')}</div>"
    ]
    rows = []
    failed = {f.get("figure") for f in g.get("failed") or []}
    for r in g.get("checked") or []:
        bad = r.get("figure") in failed
        rows.append(
            [
                _h(r.get("figure")),
                _h(r.get("label", "")),
                _n(r.get("baseline")),
                _n(r.get("current")),
                f'<span class="{"worse" if bad else ""}">{_n((r.get("worse_pct") or 0) + 0.0)}%</span>',
                f"{_n(g.get('threshold_pct'))}%",
                "over" if bad else "within",
            ]
        )
    for f in g.get("failed") or []:
        if "why" in f:
            rows.append([_h(f.get("figure")), "", "-", "-", "-", f"{_n(g.get('threshold_pct'))}%", _h(f["why"])])
    if rows:
        out.append(_table(["figure", "what", "baseline", "measured", "worse by", "threshold", "verdict"], rows))
    if g.get("baseline_host") and g.get("baseline_host") != v.host:
        out.append(f'<p class="note">baseline figures from host {_h(g["baseline_host"])}</p>')
    return "".join(out)


def _compare_table(v: HostView, base_label: str) -> str:
    if not v.rows:
        return ""
    extra = [k for k in ("spread_pct", "why") if any(k in r for r in v.rows)]
    rows = []
    for r in v.rows:
        word = str(r.get("verdict", ""))
        pct = r.get("change_pct")
        rows.append(
            [
                _h(r["figure"]),
                _h(r.get("label", "")),
                _n(r.get("baseline")),
                _n(r.get("current")),
                "-" if pct is None else f"{pct:+.1f}%",
                f'<span class="{word if word in ("worse", "better") else ""}">{_h(word)}</span>',
                *[_n(r.get(k)) for k in extra],
            ]
        )
    head = ["figure", "what", base_label, "new", "change", "verdict", *[k.replace("_pct", " %") for k in extra]]
    return "<h3>Every figure beside the baseline's</h3>" + _table(head, rows)


def _bench_settings(v: HostView) -> str:
    b = v.bench or {}
    s = b.get("spec") or {}
    if not b:
        return ""
    text = (
        f"generator {b.get('generator', '-')}; input {s.get('input_len', '-')} tokens, output "
        f"{s.get('output_len', '-')}; median of {s.get('runs', '-')} run(s), min-max shown"
    )
    notes = "".join(
        f'<p class="note">settings differ from the baseline\'s: {_h(d)}: figures may not compare</p>'
        for d in v.settings_differ
    )
    failed = sum(c.get("failed_requests") or 0 for c in b.get("cells") or [])
    notes += f'<p class="note worse">{failed} request(s) failed during the bench</p>' if failed else ""
    return f'<p class="meta">{_h(text)}</p>{notes}'


def _latency_table(v: HostView, base_label: str) -> str:
    rows = []
    for cell in (v.bench or {}).get("cells") or []:
        f = cell.get("figures") or {}
        key = (cell["concurrency"], cell["temperature"])
        bf = next(
            (
                (c.get("figures") or {})
                for c in (v.baseline or {}).get("cells") or []
                if (c["concurrency"], c["temperature"]) == key
            ),
            {},
        )
        row = [f"c{cell['concurrency']} T={cell['temperature']:g}"]
        for m in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
            now, was = (f.get(m) or {}).get("median"), (bf.get(m) or {}).get("median")
            row.append(_n(now) + (f' <span class="note">({_n(was)})</span>' if was is not None else ""))
        rows.append(row)
    if not rows:
        return ""
    note = f'<p class="note">in brackets: {_h(base_label)}</p>' if v.baseline else ""
    return _table(["cell", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"], rows) + note


def _gpu(v: HostView) -> str:
    if v.gpu_changes is None:
        return ""
    if not v.gpu_changes:
        return (
            '<h3>GPU health over the run</h3><div class="verdict pass">no new Xid, ECC error, row remap '
            "or GPU fault</div>"
        )
    rows = [
        [_h(c.get("gpu", "-")), _h(c.get("change", "-")), _n(c.get("before")), _n(c.get("after"))]
        for c in v.gpu_changes
    ]
    return "<h3>GPU health changes in the window</h3>" + _table(["GPU", "change", "before", "after"], rows)


TRAFFIC = (
    ("mode", "drain"),
    ("requests", "in flight at the drain"),
    ("drain_s", "drained in s"),
    ("left", "still in flight at the stop"),
    ("out_of_rotation_s", "out of rotation s"),
    ("stop_to_serving_s", "stop to serving s"),
)


def _traffic(v: HostView) -> str:
    """The host's drain around its restart: requests still in flight when the engine stopped
    were cut off; a gateway seen with no healthy worker refused requests."""
    t = v.traffic
    if not t:
        return ""
    left = t.get("left") or 0
    bad = []
    if left:
        bad.append(f"{_n(left)} request(s) still in flight when the engine stopped (cut off)")
    if t.get("zero_healthy_seen"):
        bad.append("a gateway had no healthy worker while this host was out")
    if t.get("not_registered"):
        bad.append("not put back on " + ", ".join(map(str, t["not_registered"])))
    verdict = "; ".join(bad) if bad else "no request cut off by the restart"
    out = (
        f'<h3>Traffic during the restart</h3><div class="verdict {"fail" if bad else "pass"}">{_h(verdict)}</div>'
        + _table([what for _k, what in TRAFFIC], [[_n(t.get(k)) for k, _what in TRAFFIC]])
    )
    return out


def _watch(view: ReportView) -> str:
    """The run's gateway watch: did any gateway ever have zero healthy workers?"""
    w = view.watch
    if not w:
        return ""
    z = w.get("zero_worker_windows") or 0
    gws = w.get("gateways") or {}
    rows = [
        [_h(name), _n(g.get("min_healthy")), _n(g.get("zero_worker_windows")), _h(g.get("error") or "")]
        for name, g in gws.items()
        if isinstance(g, dict)
    ]
    line = (
        f"a gateway had ZERO healthy workers {z} time(s): requests through it failed meanwhile"
        if z
        else "no gateway ever had zero healthy workers during the rollout"
    )
    return f'<h2>Requests through the gateways</h2><div class="verdict {"fail" if z else "pass"}">{_h(line)}</div>' + (
        _table(["gateway", "fewest healthy workers", "zero-worker windows", "error"], rows) if rows else ""
    )


def _phase_table(rows: list[tuple[str, list[tuple[str, float]]]]) -> str:
    names = list(dict.fromkeys(name for _who, items in rows for name, _s in items))
    body = [
        [_h(who), *[_n(dict(items).get(name)) for name in names], _n(round(sum(s for _x, s in items), 2))]
        for who, items in rows
    ]
    return _table(["", *[f"{name} s" for name in names], "total s"], body)


def _host(view: ReportView, v: HostView) -> str:
    base = view.baseline_label or "baseline"
    base_label = f"{base}" + (f" ({v.baseline_host})" if v.baseline_host and v.baseline_host != v.host else "")
    new, old = v.bench, v.baseline
    parts = [f'<section class="host" id="host-{_h(v.host)}"><h2>{_h(v.host)}</h2>']
    if v.status not in ("ok", "changed") and not v.gate:  # a failed gate says why below
        parts.append(f'<div class="verdict fail">{_h(v.status)}: {_h(v.error or "")}</div>')
    parts.append(_gate(v))
    if new:
        parts.append(_bench_settings(v))
        bl = base_label if old else None
        parts.append("<h3>Throughput</h3>")
        parts.append(_figure(charts.throughput(new, old, view.new_label, bl), "output tok/s against concurrency"))
        parts.append(
            _figure(
                charts.pareto(new, old, view.new_label, bl, v.gpus),
                f"tok/s per user against tok/s per GPU ({v.gpus} GPU{'s' if v.gpus != 1 else ''}), each point one concurrency",
            )
        )
        parts.append("<h3>Speculative decoding</h3>")
        parts.append(_figure(charts.accept(new, old, view.new_label, bl), "accept length per temperature"))
        parts.append(_figure(charts.by_position(new, old, view.new_label, bl), "acceptance rate per draft position"))
        parts.append("<h3>Latency</h3>")
        parts.append(_figure(charts.latency(new, old, view.new_label, bl), "TTFT and ITL, p50 and p99"))
        parts.append(_latency_table(v, base_label))
        parts.append(_compare_table(v, base_label))
    if v.phases:
        parts.append("<h3>The restart</h3>")
        parts.append(_figure(charts.phases(v.phases), v.phases_what))
        parts.append(_phase_table(v.phases))
    parts.append(_gpu(v))
    parts.append(_traffic(v))
    parts.append("</section>")
    return "".join(p for p in parts if p)


def _summary(view: ReportView) -> str:
    gates = [v for v in view.hosts if v.gate]
    if not gates:
        return ""
    failed = [v for v in gates if not v.gate.get("ok")]
    if failed:
        line = failed[0].gate.get("line") or ""
        line = line[len("gate failed on ") :] if line.startswith("gate failed on ") else line  # said just before
        return (
            f'<div class="verdict fail" id="verdict">Gate failed on {len(failed)} of {len(gates)} host(s): '
            f"{_h(line)}</div>"
        )
    return f'<div class="verdict pass" id="verdict">Gate passed on all {len(gates)} gated host(s)</div>'


def build_html(view: ReportView) -> str:
    """The whole page as text."""
    meta = [f"{len(view.hosts)} host(s)"]
    if view.baseline_label:
        meta.append(f"{view.new_label} beside {view.baseline_label}")
    if view.generated:
        meta.append(f"made {view.generated}")
    notes = "".join(f'<p class="note">{_h(n)}</p>' for n in view.notes)
    body = "".join(_host(view, v) for v in view.hosts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>k26ops: {_h(view.title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{_h(view.title)}</h1><p class="meta">k26ops {_h(view.kind)} report; {_h("; ".join(meta))}</p>'
        f"{notes}{_summary(view)}{_watch(view)}{body}</body></html>\n"
    )
