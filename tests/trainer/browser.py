"""Rendering a report in headless Chromium (Debian's ``chromium``, installed by ``make test``)
and finding what each chart drew."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

_LAYOUT = """<script>
window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('figure.chart')].map(f => {
    const r = f.querySelector('img').getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY,
            plot: f.dataset.plot.split(',').map(Number)};
  });
  const pre = document.createElement('pre'); pre.id = 'layout';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""
_SIZE = (1100, 3200)


def chromium() -> str:
    """The browser's path (the test fails, saying what to install, without it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("needs Debian's chromium (apt-get install chromium; make test installs it)")
    return found


def _run(*args: str) -> str:
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", "--force-device-scale-factor=1",
                        f"--window-size={_SIZE[0]},{_SIZE[1]}", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def chart_ink(page: Path, workdir: Path) -> list[int]:
    """For each chart of ``page``, the coloured pixels inside its plot area, as the browser
    shows it (a series is drawn in colour; axes, text and background are grey to white)."""
    from matplotlib import image

    probe = workdir / "probe.html"
    probe.write_text(page.read_text().replace("</body>", _LAYOUT + "</body>"))
    dom = _run("--dump-dom", probe.as_uri())
    layout = json.loads(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S).group(1)
                        .replace("&quot;", '"'))
    shot = workdir / "shot.png"
    _run(f"--screenshot={shot}", page.as_uri())
    pixels = image.imread(str(shot))[:, :, :3]
    ink = []
    for chart in layout:
        left, top, right, bottom = chart["plot"]
        x, y = int(chart["x"]), int(chart["y"])
        area = pixels[y + top + 3:y + bottom - 3, x + left + 3:x + right - 3]
        colour = area.max(axis=2) - area.min(axis=2)
        ink.append(int((colour > 0.25).sum()))
    return ink

