"""Issue 24: the HTML report as Chromium lays it out, measured in the page.

A probe script appended to a copy of the report measures the laid-out page after load and
writes what it found into the DOM, which ``--dump-dom`` prints: the top-kernels table fits
the window (long cuDNN names are cut with an ellipsis, the full name in the tooltip; the
time and share columns in view), the stragglers table says in how many steps the straggler
was slow, and a bimodal run's header names both kinds of step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_html_report import run_chromium
from testpaths import TESTS

import gpudiag
from gpudiag.report.html_report import render

PROBE = """<script>
addEventListener('load', () => {
  const t = document.querySelector('table.kernels');
  const view = document.documentElement.clientWidth;
  const cells = [...t.querySelectorAll('tr')].map(r => r.lastElementChild.getBoundingClientRect());
  const names = [...t.querySelectorAll('.kname')];
  const out = {
    view, page: document.documentElement.scrollWidth, table: t.getBoundingClientRect().right,
    share_right: Math.max(...cells.map(c => c.right)),
    cut: names.filter(n => n.scrollWidth > n.clientWidth).length,
    titled: names.filter(n => n.title && n.title.length >= n.textContent.length).length,
    rows: names.length,
  };
  const p = document.createElement('pre'); p.id = 'probe'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});
</script>"""


def _probe(d, tmp_path: Path, width: int) -> dict:
    html = tmp_path / "report.html"
    with html.open("w") as f:
        render(d, f)
    html.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = run_chromium(html, tmp_path, "--dump-dom", f"--window-size={width},900")
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout)
    assert m, dom.stdout[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"'))


@pytest.mark.parametrize("name", ["rtx2080ti_dataloader_nostep", "edge_mi300x_infer_1step"])
def test_top_kernels_table_fits_the_window_with_long_kernel_names(kineto_sets, tmp_path, name):
    d = gpudiag.analyze(kineto_sets / name, jobs=1)
    assert max(len(e.name) for e in d.kernels.top) > 60  # long cuDNN / hipBLASLt names
    for width in (1280, 900):
        p = _probe(d, tmp_path, width)
        if width >= 1280:
            assert p["page"] <= p["view"], p  # no horizontal scrollbar on a laptop window
        assert p["table"] <= p["view"] and p["share_right"] <= p["view"], p
        assert p["titled"] == p["rows"], p  # the full name on hover
        if name.startswith("edge_mi300x"):
            assert p["cut"] >= 1, p  # 450-character hipBLASLt names end in an ellipsis


def test_stragglers_table_counts_the_slow_steps(tmp_path):
    d = gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1)
    html = tmp_path / "s.html"
    with html.open("w") as f:
        render(d, f)
    row = re.search(r"<h2>Stragglers</h2>\s*<table>.*?</tr><tr>(.*?)</tr>", html.read_text(), re.S)
    assert row
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells[1] == "4 of 4", cells  # persistent in every compared step, not "0"


def test_bimodal_steps_are_described_as_two_kinds(kineto_sets, tmp_path):
    d = gpudiag.analyze(kineto_sets / "rtx2080ti_dataloader_nostep", jobs=1)
    html = tmp_path / "b.html"
    with html.open("w") as f:
        render(d, f)
    text = html.read_text()
    assert "two kinds of step: 15 around 158.0 ms" in text and "14 around 479.6 ms" in text
