"""The HTML report in a real browser (Debian's chromium, headless)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


# Injected into a copy of the page (the report itself has no script): what the browser laid out.
_MEASURE = """<script>
const charts = [...document.querySelectorAll('figure[data-chart]')].map(f => {
  const svg = f.querySelector('svg'); const box = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll('path,use,rect')].filter(e => {
    const b = e.getBoundingClientRect(); return b.width > 0 || b.height > 0; }).length;
  return {name: f.dataset.chart, width: box.width, height: box.height, drawn: drawn,
          text: svg.textContent};
});
const pre = document.createElement('pre'); pre.id = 'k26-measure';
pre.textContent = JSON.stringify({charts: charts, scroll_width: document.documentElement.scrollWidth,
                                  inner_width: window.innerWidth});
document.body.appendChild(pre);
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browse(page: Path, work: Path, width: int = 1000, height: int = 2400, phone: bool = False) -> tuple[dict, Path]:
    """Open `page` in headless Chromium at width x height (a fresh profile, no network):
    (what it laid out: each chart's size and drawn elements, the page's scroll width;
    a screenshot PNG of the page as it is, without the measuring script).
    phone: headless Chromium's window is at least 500 px wide, so the page is laid out in
    a frame of `width` px inside a wider window (as a phone's browser would show it)."""
    exe = chromium()
    if not exe:
        pytest.skip("chromium is not installed (Debian package `chromium`; `make system-deps` installs it)")
    work.mkdir(parents=True, exist_ok=True)
    measured = work / f"measured-{width}.html"
    measured.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))

    def run(*args: str) -> subprocess.CompletedProcess:
        profile = tempfile.mkdtemp(prefix="chromium-", dir=work)
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": profile})

    target, shown = measured, page
    if phone:
        frame = (
            '<!DOCTYPE html><html><body style="margin:0">'
            f'<iframe id="f" src="{{}}" style="width:{width}px;height:{height}px;border:0"></iframe>'
            "<script>addEventListener('load', () => document.body.appendChild("
            "document.importNode(frames[0].document.getElementById('k26-measure'), true)));</script>"
            "</body></html>"
        )
        target, shown = work / "phone-measured.html", work / "phone.html"
        target.write_text(frame.format(measured.name))
        shown.write_text(frame.format(page.as_uri()).replace("<script>", "<!--").replace("</script>", "-->"))
        width = max(width, 500)
    proc = run("--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom", target.as_uri())
    import html as html_mod
    import re

    m = re.search(r'<pre id="k26-measure">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"chromium ran no layout (rc {proc.returncode}): {proc.stderr[-2000:]}"
    shot = work / f"screenshot-{width}.png"
    proc = run(f"--screenshot={shot}", shown.as_uri())
    assert shot.exists(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html_mod.unescape(m.group(1))), shot


def colour_pixels(png: Path, rgb: tuple[int, int, int], tol: int = 12) -> int:
    """How many pixels of the screenshot are within `tol` of colour `rgb`."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=img.width * img.height)
    return sum(n for n, px in colours if all(abs(a - b) <= tol for a, b in zip(px, rgb)))
