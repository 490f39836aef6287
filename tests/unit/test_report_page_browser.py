"""The report as a person sees it: rendered by headless Chromium at a 1,280-pixel viewport, nothing is
wider than the screen (no horizontal scroll, no element past the right edge). A full-page screenshot is
kept under the test's tmp dir as evidence (its path is printed; ``pytest -s`` shows it).

The run folder is a full recipe run in the real formats (``tests/support/runs.py``: steps 00-07, a real
benchmark at the seed's conditions, so the published-anchor and workload tables are there) plus a check
whose observation is one long unbroken path, the kind of cell that used to push the page wide.
Chromium loads only the file: the report is self-contained, and a dead loopback proxy stops anything else.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runbook.report import write
from runbook.report.html_parts import PAGE_WIDTH
from runbook.report.index import REPORT_NAME
from runbook.secrets import Redactor
from support.runs import build_full_run, build_run, chk, edit_sidecar, recipe_profile, seed_bench_output

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} missing: apt-get install -y --no-install-recommends chromium")]

# Runs at load: the viewport, the document's width and every element wider than the layout viewport
# (the outermost one only: its children are wide because it is), written into the DOM for --dump-dom.
PROBE = """<script>addEventListener('load', () => {
  const W = document.documentElement.clientWidth, wide = [];
  const over = (el) => { const r = el.getBoundingClientRect(); return r.right > W + 0.5 || r.width > W + 0.5; };
  for (const el of document.querySelectorAll('body *'))
    if (over(el) && !(el.parentElement && el.parentElement !== document.body && over(el.parentElement)))
      wide.push(el.tagName + ' ' + Math.round(el.getBoundingClientRect().width) + 'px: '
                + (el.textContent || '').slice(0, 80));
  const out = document.createElement('pre'); out.id = 'overflow-probe';
  out.textContent = JSON.stringify({inner: innerWidth, client: W, scroll: document.documentElement.scrollWidth,
                                    height: document.documentElement.scrollHeight, elements: document.querySelectorAll('body *').length, wide});
  document.body.appendChild(out);
});</script>"""


def chromium(url: str, profile_dir: Path, height: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--proxy-server=http://127.0.0.1:9", f"--user-data-dir={profile_dir}",
         f"--window-size={PAGE_WIDTH},{height}", *extra, url],
        capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A validated recipe run and a lab run (a candidate missing most requirements), each with its report,
    and the results index listing both."""
    tmp = tmp_path_factory.mktemp("report-page")
    profile = recipe_profile()
    run = build_full_run(tmp / "results", "20261201-040000-exl3", profile,
                         bench=seed_bench_output(tmp / "bench", profile))
    deep = "/".join(f"models--deepseek-ai--DeepSeek-V4-Flash-part{i:02d}" for i in range(6))
    edit_sidecar(run, "00_preflight", lambda sc: sc["checks"].append(
        chk("model cache path", observed=f"/var/cache/hf/{deep}/snapshots/{'f' * 40}", expected="present")))
    write.write_report(run, redactor=Redactor(), index=False)
    write.write_report(build_run(tmp / "results", "20261201-050000-lab", created="2026-12-01T05:00:00+00:00"),
                       redactor=Redactor())
    return tmp / "results"


def measure(page: Path, tmp: Path) -> dict:
    """What Chromium lays out for ``page`` at the page width (see PROBE)."""
    probed = tmp / f"probed-{page.parent.name}-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    done = chromium(probed.as_uri(), tmp / f"chromium-{probed.stem}", 900, "--dump-dom")
    found = re.search(r'<pre id="overflow-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"chromium wrote no measurement (exit {done.returncode}): {done.stderr[-1500:]}"
    return json.loads(html.unescape(found.group(1)))


def test_the_report_fits_a_1280_pixel_screen(results, tmp_path):
    report_file = results / "20261201-040000-exl3" / REPORT_NAME
    seen = measure(report_file, tmp_path)
    # the full page, for a person to look at
    shot = tmp_path / "report-1280.png"
    chromium(report_file.as_uri(), tmp_path / "chromium-shot", min(seen["height"] + 40, 16000),
             "--hide-scrollbars", f"--screenshot={shot}")
    print(f"\nscreenshot: {shot} ({PAGE_WIDTH} x {min(seen['height'] + 40, 16000)} px); measured: "
          f"{ {k: v for k, v in seen.items() if k != 'wide'} }")
    assert shot.is_file() and shot.stat().st_size > 10_000, f"no screenshot: {shot}"
    assert seen["inner"] == PAGE_WIDTH and seen["elements"] > 500          # the page rendered, at 1,280
    assert "Published anchors beside ours" in report_file.read_text()       # the wide tables are in it
    assert seen["scroll"] <= seen["client"], f"document {seen['scroll']} px wide in a {seen['client']} px view: " \
                                             f"{seen['wide']}; screenshot {shot}"
    assert seen["wide"] == [], f"wider than the {seen['client']} px view: {seen['wide']}; screenshot {shot}"


def test_the_results_index_fits_a_1280_pixel_screen(results, tmp_path):
    page = results / "index.html"
    assert "missing: hardware, image" in page.read_text()         # the candidate's reasons are listed
    seen = measure(page, tmp_path)
    assert seen["inner"] == PAGE_WIDTH and seen["elements"] > 50
    assert seen["scroll"] <= seen["client"] and seen["wide"] == [], seen
