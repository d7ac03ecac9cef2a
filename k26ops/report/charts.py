"""The report's charts: matplotlib figures written as SVG text, made for inlining
in an HTML page (no XML prologue, no namespace URLs, no fixed size: they scale to
the page's width, a phone's included).

Why matplotlib: it writes static SVG with no script and no font or file fetched
when the page opens, and it is a plain wheel on PyPI; plotly's and Vega-Lite's
offline pages carry a few MB of JavaScript each.

Colours: one per temperature; the new figures solid with filled markers, the
baseline's dashed with hollow markers (told apart without colour too).
"""

from __future__ import annotations

import io
import re

from k26ops.enginebench import accept as accept_mod

NEW_STYLE = {"linestyle": "-", "marker": "o"}
BASE_STYLE = {"linestyle": "--", "marker": "o", "markerfacecolor": "white", "alpha": 0.8}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
NEW_COLOUR, BASE_COLOUR = "#1f77b4", "#8c8c8c"


def _figure(w: float = 6.4, h: float = 3.2, cols: int = 1):
    # lazy: matplotlib (about 0.3 s to import) only when a report is drawn
    import matplotlib

    # lazy: as above
    from matplotlib.figure import Figure

    matplotlib.rcParams.update(
        {"svg.fonttype": "none", "svg.hashsalt": "k26ops", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}
    )
    fig = Figure(figsize=(w, h), layout="constrained")
    axes = fig.subplots(1, cols, squeeze=False)[0]
    return fig, list(axes)


_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.S)
_META = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_NS = re.compile(r'\s+xmlns(?::\w+)?="[^"]*"')
_SIZE = re.compile(r'(<svg\b[^>]*?)\s+width="[^"]*"\s+height="[^"]*"')


def svg_text(fig, title: str) -> str:
    """The figure as inline SVG: scales to its container, says what it shows (role, title)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = _META.sub("", _PROLOGUE.sub("", buf.getvalue(), count=1))
    text = _NS.sub("", text)
    text = _SIZE.sub(r'\1 class="chart" role="img" preserveAspectRatio="xMidYMid meet"', text, count=1)
    return text.replace(">", f"><title>{_esc(title)}</title>", 1)


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def series(bench: dict | None, metric: str) -> dict[float, list[tuple[int, dict]]]:
    """{temperature: [(concurrency, stat), ...] sorted} of one metric."""
    out: dict[float, list[tuple[int, dict]]] = {}
    for cell in (bench or {}).get("cells") or []:
        stat = (cell.get("figures") or {}).get(metric)
        if stat and stat.get("median") is not None:
            out.setdefault(float(cell["temperature"]), []).append((int(cell["concurrency"]), stat))
    return {t: sorted(v, key=lambda p: p[0]) for t, v in sorted(out.items())}


def _temps(*benches) -> list[float]:
    return sorted({t for b in benches for t in series(b, "tok/s")} | {t for b in benches for t in series(b, "accept")})


def _colour(temps: list[float], t: float) -> str:
    return PALETTE[temps.index(t) % len(PALETTE)] if t in temps else PALETTE[0]


def _tok_lines(new: dict, base: dict | None, new_label: str, base_label: str | None):
    """(figure, axes, [(points, colour, label, style)]) of output tok/s, one line per temperature,
    the baseline's first; None without new figures."""
    ns, bs = series(new, "tok/s"), series(base, "tok/s")
    if not ns:
        return None
    temps = _temps(new, base)
    fig, (ax,) = _figure()
    lines = [
        (pts, _colour(temps, t), f"T={t:g} {label}", style)
        for data, label, style in ((bs, base_label, BASE_STYLE), (ns, new_label, NEW_STYLE))
        for t, pts in data.items()
    ]
    return fig, ax, lines


def throughput(new: dict, base: dict | None, new_label: str, base_label: str | None) -> str | None:
    """Output tok/s against concurrency, one line per temperature, new beside baseline."""
    got = _tok_lines(new, base, new_label, base_label)
    if not got:
        return None
    fig, ax, lines = got
    for pts, colour, label, style in lines:
        ys = [s["median"] for _c, s in pts]
        lo = [s["median"] - s.get("min", s["median"]) for _c, s in pts]
        hi = [s.get("max", s["median"]) - s["median"] for _c, s in pts]
        ax.errorbar([c for c, _s in pts], ys, yerr=[lo, hi], color=colour, capsize=2, label=label, **style)
    ax.set_xscale("log", base=2)
    cs = sorted({c for pts, *_rest in lines for c, _s in pts})
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tok/s (median, min-max)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    return svg_text(fig, "output tokens per second against concurrency, per temperature")


def pareto(new: dict, base: dict | None, new_label: str, base_label: str | None, gpus: int) -> str | None:
    """tok/s per user (tok/s / concurrency) against tok/s per GPU, per temperature."""
    got = _tok_lines(new, base, new_label, base_label)
    if not got:
        return None
    fig, ax, lines = got
    for pts, colour, label, style in lines:
        xs = [s["median"] / gpus for _c, s in pts]
        ys = [s["median"] / c for c, s in pts]
        ax.plot(xs, ys, color=colour, label=label, **style)
        for (c, _s), x, y in zip(pts, xs, ys):
            ax.annotate(f"c{c}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlabel(f"output tok/s per GPU ({gpus} GPU{'s' if gpus != 1 else ''})")
    ax.set_ylabel("output tok/s per user")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    return svg_text(fig, "tokens per second per user against tokens per second per GPU")


def accept(new: dict, base: dict | None, new_label: str, base_label: str | None) -> str | None:
    """Accept length per temperature: bars at each (temperature, concurrency), new beside baseline."""
    ns, bs = series(new, "accept"), series(base, "accept")
    if not ns:
        return None
    groups = sorted({(t, c) for d in (ns, bs) for t, pts in d.items() for c, _s in pts})
    temps = _temps(new, base)
    fig, (ax,) = _figure(h=3.2)
    width = 0.38 if bs else 0.6
    for k, (data, label, hatch, off) in enumerate(
        ((bs, base_label, "//", -width / 2), (ns, new_label, "", width / 2 if bs else 0))
    ):
        if not data:
            continue
        for i, (t, c) in enumerate(groups):
            stat = dict(data.get(t, [])).get(c)
            if not stat:
                continue
            colour = _colour(temps, t)
            ax.bar(
                i + off,
                stat["median"],
                width,
                color="white" if hatch else colour,
                edgecolor=colour,
                hatch=hatch,
                label=label if i == 0 else None,
            )
            ax.annotate(f"{stat['median']:.2f}", (i + off, stat["median"]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)), [f"T={t:g}\nc{c}" for t, c in groups])
    ax.set_ylabel("accept length (tokens per verify)")
    ax.set_ylim(0, max(s["median"] for d in (ns, bs) for pts in d.values() for _c, s in pts) * 1.2)
    ax.legend(fontsize=7)
    return svg_text(fig, "speculative accept length per temperature")


def by_position(new: dict, base: dict | None, new_label: str, base_label: str | None) -> str | None:
    """Acceptance rate per draft position, where a cell has the engine's histogram
    (`accept_histogram`, k26ops.enginebench.accept)."""

    def rows(bench):
        return [
            (float(c["temperature"]), int(c["concurrency"]), accept_mod.by_position(c["accept_histogram"]))
            for c in (bench or {}).get("cells") or []
            if accept_mod.by_position(c.get("accept_histogram"))
        ]

    nr, br = rows(new), rows(base)
    if not nr:
        return None
    temps = sorted({t for t, _c, _r in nr + br})
    fig, (ax,) = _figure(h=3.2)
    for data, label, style in ((br, base_label, BASE_STYLE), (nr, new_label, NEW_STYLE)):
        for t, c, rates in data:
            ax.plot(range(1, len(rates) + 1), rates, color=_colour(temps, t), label=f"T={t:g} c{c} {label}", **style)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    return svg_text(fig, "acceptance rate per draft position")


LATENCY = (("TTFT", "ttft_p50_ms", "ttft_p99_ms"), ("ITL", "itl_p50_ms", "itl_p99_ms"))


def latency(new: dict, base: dict | None, new_label: str, base_label: str | None) -> str | None:
    """TTFT and ITL percentiles (p50 solid, p99 hatched) per cell, baseline grey beside new."""
    if not series(new, "ttft_p50_ms") and not series(new, "itl_p50_ms"):
        return None
    fig, axes = _figure(h=3.4, cols=2)
    for ax, (what, p50, p99) in zip(axes, LATENCY):
        cells = sorted(
            {(t, c) for m in (p50, p99) for b in (new, base) for t, pts in series(b, m).items() for c, _s in pts}
        )
        bars = (
            [(base, base_label, BASE_COLOUR), (new, new_label, NEW_COLOUR)] if base else [(new, new_label, NEW_COLOUR)]
        )
        width = 0.8 / (2 * len(bars))
        k = 0
        for bench, label, colour in bars:
            for metric, hatch, pname in ((p50, "", "p50"), (p99, "//", "p99")):
                got = {(t, c): s["median"] for t, pts in series(bench, metric).items() for c, s in pts}
                xs = [i - 0.4 + width * (k + 0.5) for i in range(len(cells))]
                ax.bar(
                    xs,
                    [got.get(cell, 0) for cell in cells],
                    width,
                    color="white" if hatch else colour,
                    edgecolor=colour,
                    hatch=hatch,
                    label=f"{pname} {label}",
                )
                k += 1
        ax.set_xticks(range(len(cells)), [f"T={t:g}\nc{c}" for t, c in cells])
        ax.set_title(f"{what} (ms)")
        ax.legend(fontsize=6)
    return svg_text(fig, "time to first token and inter-token latency percentiles")


def phases(rows: list[tuple[str, list[tuple[str, float]]]]) -> str | None:
    """The restart's phases as stacked bars, one per row (the baseline's above the new one),
    a phase the same colour in each, labelled with its seconds."""
    rows = [(who, items) for who, items in rows if items]
    if not rows:
        return None
    names = list(dict.fromkeys(name for _who, items in rows for name, _s in items))
    fig, (ax,) = _figure(h=1.3 + 0.4 * len(rows) + 0.2 * ((len(names) + 2) // 3))
    for y, (who, items) in enumerate(reversed(rows)):
        left = 0.0
        for name, secs in items:
            colour = PALETTE[names.index(name) % len(PALETTE)]
            ax.barh([y], [secs], left=left, color=colour, label=name if y == len(rows) - 1 else None)
            if secs > 0:
                ax.annotate(f"{secs:.1f}", (left + secs / 2, y), ha="center", va="center", fontsize=7)
            left += secs
        ax.annotate(f" {left:.1f} s", (left, y), va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [who for who, _items in reversed(rows)])
    ax.set_xlabel("seconds from the stop")
    fig.legend(fontsize=7, ncols=min(3, len(names)), loc="outside lower center")  # below, inside the figure
    return svg_text(fig, "the restart's phases")
