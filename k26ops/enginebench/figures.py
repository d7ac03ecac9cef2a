"""Figures by name (`tok/s@c1/t0`: metric @ concurrency / temperature), the
comparison with a baseline's stored bench, and the canary gate's verdict."""

from __future__ import annotations

import math
import re

from k26ops.enginebench.run import METRICS, START_METRICS, cell_key
from k26ops.errors import UserError

DEFAULT_GATE = ("tok/s@c1/t0", "accept@c1/t0")
FIGURES = {**METRICS, **START_METRICS}
_FIG = re.compile(r"(?P<metric>[a-z0-9_/]+?)@(?:c(?P<c>\d+)/t(?P<t>\d+(\.\d+)?)|(?P<start>start))")


def parse_figure(name: str) -> tuple[str, int | None, float | None]:
    """(metric, concurrency, temperature); a start-up figure (`ready_s@start`) has no cell: None, None."""
    m = _FIG.fullmatch(name.strip())
    if not m or m["metric"] not in (START_METRICS if m["start"] else METRICS):
        raise UserError(
            f"--gate-figures: {name!r} is not a figure; write METRIC@cN/tT with METRIC one of "
            f"{', '.join(METRICS)} (e.g. tok/s@c1/t0), or START@start with START one of "
            f"{', '.join(START_METRICS)} (the last start's time to first good token)"
        )
    return (m["metric"], None, None) if m["start"] else (m["metric"], int(m["c"]), float(m["t"]))


def figure_name(metric: str, c: int, t: float) -> str:
    return f"{metric}@{cell_key(c, t)}"


def flatten(bench: dict) -> dict[str, dict]:
    """{figure name: {median, min, max, n}} of one host's bench."""
    out = {}
    for cell in bench.get("cells") or []:
        for metric, stat in (cell.get("figures") or {}).items():
            out[figure_name(metric, cell["concurrency"], cell["temperature"])] = stat
    ttfgt = (bench.get("startup") or {}).get("ttfgt") or {}
    for metric, (key, _label, _better) in START_METRICS.items():
        v = ttfgt.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{metric}@start"] = {"median": v, "min": v, "max": v, "n": 1}
    return out


def change_pct(base: float, cur: float) -> float | None:
    return None if not base else (cur - base) / base * 100.0


def plain_number(x: float, digits: int = 4) -> str:
    """`digits` significant figures, never in e-notation (20833.3 -> 20830, 0.0123 -> 0.0123):
    figures are read by people and pasted into reports."""
    if x is None:
        return "-"
    text = f"{float(f'{x:.{digits}g}'):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def direction(metric: str) -> str:
    """Which way is better for `metric`: "higher" (tok/s, accept) or "lower" (TTFT, ITL)."""
    return "higher" if FIGURES[metric][2] > 0 else "lower"


NOISE = "within noise"
ALPHA = 0.05  # the false-alarm rate a "better" or "worse" may have, per figure
START_NOISE_PCT = 10.0  # a start-time figure (one start per side) named better/worse past this change


def separation_p(n: int, m: int) -> float:
    """The exact two-sided p-value of complete separation (every run of one bench beyond every run
    of the other: Mann-Whitney U = 0) when both are the same engine: 2 / C(n+m, n). Only the runs'
    min and max are stored, and complete separation is the one rank arrangement they show.
    3 vs 3 runs: 0.10; 4 vs 4: 0.029; 5 vs 5: 0.0079; 5 vs 3: 0.036."""
    return min(1.0, 2 / math.comb(n + m, n))


def judge(metric: str, base: dict, cur: dict) -> dict:
    """Is the change beyond the runs' spread? {"verdict": better | worse | within noise, "p_value",
    "ranges_apart", "why"}. A change is named only when the two benches' min-max ranges do not
    overlap AND that separation is unlikely from noise (separation_p <= ALPHA); otherwise it is
    within noise, and `why` says which: the ranges overlap, or too few runs to tell."""
    if metric in START_METRICS:  # one start on each side: no spread to test; a start's phases move
        worse = regression_pct(metric, base["median"], cur["median"])  # by tens of percent (cold/warm)
        if abs(worse) < START_NOISE_PCT:
            return {
                "verdict": NOISE,
                "p_value": None,
                "ranges_apart": False,
                "why": f"one start each, changed under {START_NOISE_PCT:g}%",
            }
        return {
            "verdict": "worse" if worse > 0 else "better",
            "p_value": None,
            "ranges_apart": True,
            "why": f"one start each, changed {abs(worse):.0f}% (over {START_NOISE_PCT:g}%)",
        }
    bn, cn = int(base.get("n") or 1), int(cur.get("n") or 1)
    b_lo, b_hi = base.get("min", base["median"]), base.get("max", base["median"])
    c_lo, c_hi = cur.get("min", cur["median"]), cur.get("max", cur["median"])
    apart = c_lo > b_hi or c_hi < b_lo
    p = separation_p(bn, cn)
    if not apart:
        return {"verdict": NOISE, "p_value": None, "ranges_apart": False, "why": "ranges overlap"}
    if p > ALPHA:
        return {
            "verdict": NOISE,
            "p_value": round(p, 4),
            "ranges_apart": True,
            "why": f"ranges apart, but {bn} vs {cn} run(s) cannot tell (p {p:.2f} > {ALPHA:g}: --runs 5)",
        }
    worse = regression_pct(metric, base["median"], cur["median"]) > 0
    return {
        "verdict": "worse" if worse else "better",
        "p_value": round(p, 4),
        "ranges_apart": True,
        "why": f"ranges apart, p {p:.3f}",
    }


def regression_pct(metric: str, base: float, cur: float) -> float:
    """How much worse `cur` is than `base`, in percent of base (<= 0: not worse)."""
    pct = change_pct(base, cur)
    return 0.0 if pct is None else -pct * FIGURES[metric][2]


def compare(current: dict, baseline: dict) -> list[dict]:
    """Rows for every figure both benches have: medians, both sides' min-max and run counts, the
    change, and judge()'s verdict (better / worse / within noise) with its p-value and why.
    A stable shape (`bench --compare --json`, and `k26ops report` reads it)."""
    cur, base = flatten(current), flatten(baseline)
    rows = []
    for name, stat in cur.items():
        if name not in base:
            continue
        metric = name.split("@", 1)[0]
        bs = base[name]
        b, c = bs["median"], stat["median"]
        worse = round(regression_pct(metric, b, c), 2)
        j = judge(metric, bs, stat)
        rows.append(
            {
                "figure": name,
                "label": FIGURES[metric][1],
                "baseline": b,
                "current": c,
                "baseline_min": bs.get("min", b),
                "baseline_max": bs.get("max", b),
                "baseline_n": bs.get("n", 1),
                "current_min": stat.get("min", c),
                "current_max": stat.get("max", c),
                "current_n": stat.get("n", 1),
                "change_pct": None if change_pct(b, c) is None else round(change_pct(b, c), 2),
                "worse_pct": worse,
                "better": direction(metric),
                "verdict": j["verdict"],
                "p_value": j["p_value"],
                "ranges_apart": j["ranges_apart"],
                "why": j["why"],
            }
        )
    return rows


def spec_for_compare(baseline_spec: dict, spec: dict, given: set) -> dict:
    """The bench settings (BenchSpec.to_json) for `--compare`: the baseline's own cells and settings
    (concurrency, temperatures, lengths, prompts, seed, generator), except those in `given` (set on
    the command line). Not its run count: more runs now only sharpen the test (5 vs 3 stored can
    show a change, 3 vs 3 cannot)."""
    keep = {
        k: v for k, v in (baseline_spec or {}).items() if k in spec and k != "runs" and k not in given and v is not None
    }
    return {**spec, **keep}


def spec_differences(current: dict, baseline: dict) -> list[str]:
    keys = ("input_len", "output_len", "num_prompts", "seed", "generator")
    cs, bs = current.get("spec") or {}, baseline.get("spec") or {}
    out = [f"{k} {bs.get(k)} -> {cs.get(k)}" for k in keys if cs.get(k) != bs.get(k) and k != "generator"]
    if current.get("generator") != baseline.get("generator"):
        out.append(f"generator {baseline.get('generator')} -> {current.get('generator')}")
    return out


def gate_verdict(current: dict, baseline: dict, figures: list[str], threshold: float) -> dict:
    """{ok, failed: [...], checked: [...]} for the gated figures (the medians)."""
    cur, base = flatten(current), flatten(baseline)
    runs = (current.get("spec") or {}).get("runs")
    checked, failed = [], []
    for name in figures:
        metric = name.split("@", 1)[0]
        if name not in cur or name not in base:
            failed.append({"figure": name, "why": "not measured" if name not in cur else "not in the baseline"})
            continue
        b, c = base[name].get("median"), cur[name].get("median")
        unusable = _unusable(b, "baseline") or _unusable(c, "measured")
        if unusable:  # fail closed: NaN compares false with everything, so it would pass any threshold
            failed.append({"figure": name, "why": unusable})
            continue
        worse = regression_pct(metric, b, c)
        row = {
            "figure": name,
            "label": FIGURES[metric][1],
            "baseline": b,
            "current": c,
            "min": cur[name]["min"],
            "max": cur[name]["max"],
            "worse_pct": round(worse, 2),
            "runs": runs,
        }
        checked.append(row)
        if not worse <= threshold:
            failed.append(row)
    return {"ok": not failed, "failed": failed, "checked": checked, "threshold_pct": threshold}


def _unusable(value, which: str) -> str | None:
    """Why a median cannot be gated on (None: it can): missing, not a number, not
    finite, or a baseline of 0 (no percentage of it means anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{which} median is {value!r}, not a number"
    if not math.isfinite(value) or value < 0:
        return f"{which} median is {value!r}, not a finite number >= 0"
    if which == "baseline" and value == 0:
        return "baseline median is 0: no percentage of it can be gated"
    return None


def gate_line(host: str, verdict: dict) -> str:
    """One line naming the figure, the baseline value and the measured value."""
    f = verdict["failed"][0]
    if "why" in f:
        return f"gate failed on {host}: {f['figure']} {f['why']}"
    more = f" (and {len(verdict['failed']) - 1} more)" if len(verdict["failed"]) > 1 else ""
    return (
        f"gate failed on {host}: {f['figure']} ({f['label']}) measured {f['current']:g} vs baseline "
        f"{f['baseline']:g}: {f['worse_pct']:.1f}% worse, threshold {verdict['threshold_pct']:g}% "
        f"(median of {f['runs']} run(s), min-max {f['min']:g}-{f['max']:g}){more}"
    )


def cells_for(figures: list[str]) -> tuple[list[int], list[float]]:
    cs, ts = [], []
    for name in figures:
        _m, c, t = parse_figure(name)
        if c is None:  # a start-up figure: the host's last start, no cell to run
            continue
        cs += [c] if c not in cs else []
        ts += [t] if t not in ts else []
    return cs, ts
