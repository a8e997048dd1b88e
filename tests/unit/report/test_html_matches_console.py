"""The HTML report says what the console says: gains, what-if, evidence lines, collectives.

The truth is the console's own text of the same Diagnosis, read line by line (rich's
wrapping undone); the HTML's is what Chromium lays out (``innerText`` of the page after
load, via a probe script), so a line the page hides or mangles does not count.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from test_html_report import run_chromium
from testpaths import TESTS

import gpudiag
from gpudiag.report import console, html_report

PROBE = """<script>
addEventListener('load', () => {
  const p = document.createElement('pre'); p.id = 'probe';
  p.textContent = JSON.stringify({text: document.body.innerText});
  document.body.appendChild(p);
});
</script>"""

# the console's lines that every renderer must carry, by how they start: its marks (a
# remedy's arrow, a finding's severity, a note's label) are the console's own
SHARED = (
    "what if:",
    "across ranks:",
    "waiting for the last rank",
    "whole run (telemetry): ",
    "shares of all ",
    "→ ",
    "collectives: ",
    "! ",
    "· ",
    "✗ ",
    "note: ",
)
MARKS = ("→ ", "! ", "· ", "✗ ", "note: ")


def _unmarked(line: str) -> str:
    for m in MARKS:
        line = line.removeprefix(m)
    return line


def _console_lines(d) -> list[str]:
    """The console's logical lines (a wrapped line and its continuations joined)."""
    buf = io.StringIO()
    console.render(d, buf, width=400, color=False)
    return [" ".join(x.split()) for x in buf.getvalue().splitlines() if x.strip()]


def _page_text(d, tmp_path: Path) -> str:
    html = tmp_path / "report.html"
    with html.open("w") as f:
        html_report.render(d, f)
    html.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = run_chromium(html, tmp_path, "--dump-dom", "--window-size=1280,900")
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert m, dom.stdout[-2000:]
    raw = m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    return " ".join(json.loads(raw.replace("&amp;", "&"))["text"].split())


def _diagnoses(kineto_sets: Path) -> dict[str, object]:
    return {
        "straggler": gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1),
        "cpu_ddp": gpudiag.analyze(TESTS / "data" / "saved" / "demo_cpu_ddp2.json"),
        "host_bound": gpudiag.analyze(kineto_sets / "a100x2_r0_pgcfg", jobs=1),
    }


@pytest.mark.parametrize("name", ["straggler", "cpu_ddp", "host_bound"])
def test_every_console_line_of_gains_what_if_and_evidence_is_in_the_page(
    kineto_sets, tmp_path, name
):
    d = _diagnoses(kineto_sets)[name]
    lines = [x for x in _console_lines(d) if x.startswith(SHARED)]
    assert any(x.startswith("what if:") for x in lines)  # the case has a what-if
    page = _page_text(d, tmp_path)
    missing = [x for x in lines if _unmarked(x) not in page]
    assert not missing, "\n".join(missing)


def test_the_page_names_each_remedys_gain_as_the_console_does(tmp_path):
    d = gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1)
    gains = [r for r in d.recommendations if r.estimated_gain_ns]
    assert gains  # the straggler's remedy carries its gain
    page = _page_text(d, tmp_path)
    for r in gains:
        assert "could recover ~" in page and r.title in page


def test_the_collectives_table_shows_the_consoles_readable_names(tmp_path):
    d = gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1)
    raw = {n for r in d.ranks for n in r.evidence.comm_names or []}
    assert raw and all(n.startswith("nccl") for n in raw)  # kernel names in the evidence
    page = _page_text(d, tmp_path)
    section = page.split("Collectives", 1)[1].split("Inputs and notes", 1)[0]
    for n in raw:
        assert n not in section  # shown by type (the raw name is the tooltip)
    types = {row.type for row in d.collectives.by_type}
    assert types and all(t in section for t in types)
