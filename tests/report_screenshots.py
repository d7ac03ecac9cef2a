"""Make docs/report-gate.png and docs/report-phone.png: the report of a canary gate drawn from
the two recorded H200 benches of tests/data/serving (the same engine, sglang 0.5.17 on the
lent H200: SGLang's own benchmark as the canary, k26ops' loadgen as the baseline
`k26-baseline`), opened in headless Chromium (Debian's `chromium`) as test_report.py does.

    python3 tests/report_screenshots.py      # from the checkout's root

Not a test: it writes into docs/. The desktop shot is Chromium's 1000 px window scaled to
615 px wide and cut at the second chart; the phone shot is 390 px wide, cut at the latency."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's k26ops, then labtools

import json  # noqa: E402

from k26ops.enginebench import figures as figs  # noqa: E402
from k26ops.report import model, page  # noqa: E402
from labtools import REPO  # noqa: E402
from labtools.browser import browse  # noqa: E402

DATA = REPO / "tests/data/serving"
NB = json.loads((DATA / "h200-bench-sglang.json").read_text())["hosts"]["h200"]["bench"]
OB = json.loads((DATA / "h200-bench-k26ops.json").read_text())["hosts"]["h200"]["bench"]


def gate_doc() -> dict:
    verdict = figs.gate_verdict(NB, OB, list(figs.DEFAULT_GATE), 5.0)
    return {
        "command": "deploy",
        "hosts": {
            "h200": {
                "status": "failed",
                "bench": NB,
                "gate": {
                    "tag": "k26-baseline",
                    "baseline_host": "h200",
                    "ok": verdict["ok"],
                    "line": figs.gate_line("h200", verdict),
                    **verdict,
                },
            }
        },
    }


def small(img):
    """48 colours: about 50 kB a shot instead of 200 (the page is flat colour)."""
    from PIL import Image

    return img.quantize(colors=48, method=Image.Quantize.MEDIANCUT)


def main() -> None:
    from PIL import Image

    html = page.build_html(model.from_run(gate_doc(), stored={"h200": OB}, generated="from tests/data/serving"))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        report.write_text(html)
        _laid, desk = browse(report, Path(tmp) / "desktop", width=1000, height=1600)
        _laid, phone = browse(report, Path(tmp) / "phone", width=390, height=2600, phone=True)
        img = Image.open(desk).convert("RGB")
        img = img.resize((615, round(img.height * 615 / img.width)), Image.LANCZOS).crop((0, 0, 615, 975))
        small(img).save(REPO / "docs/report-gate.png", optimize=True)
        img = Image.open(phone).convert("RGB").crop((0, 1350, 390, 2350))
        small(img).save(REPO / "docs/report-phone.png", optimize=True)
    print("wrote docs/report-gate.png, docs/report-phone.png")


if __name__ == "__main__":
    main()
