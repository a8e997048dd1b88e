"""`gpudiag report` of a run carries the gains, what-if and evidence that `gpudiag run` printed.

A 2-rank CPU job whose rank 1 sleeps 100 ms a step under `gpudiag run` (so there is a
straggler, a remedy with a gain and a what-if); the console's own lines are the truth, the
HTML's are what Chromium lays out. On this CPU-only host the run says nothing about NVML on
stderr and carries one note that GPU telemetry does not apply, not a finding.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_runner import ROOT, run_cli

sys.path.insert(0, str(ROOT / "tests" / "unit" / "report"))
from test_html_matches_console import SHARED, _unmarked
from test_html_report import run_chromium

from gpudiag.collect.samplers.nvml import nvidia_driver_loaded

JOB = [
    "torchrun",
    "--standalone",
    "--nproc-per-node",
    "2",
    "-m",
    "gpudiag.demo.train",
    "--steps",
    "14",
    "--batch",
    "512",
    "--sleep-rank",
    "1",
    "--sleep-s",
    "0.1",
]
PROBE = """<script>
addEventListener('load', () => {
  const p = document.createElement('pre'); p.id = 'probe';
  p.textContent = document.body.innerText;
  document.body.appendChild(p);
});
</script>"""


@pytest.mark.usefixtures("torch_required")
def test_report_of_a_run_says_what_its_console_said(tmp_path: Path) -> None:
    import html as htmllib
    import re

    out = tmp_path / "run"
    # 1000 columns: the console's lines unwrapped, one logical line each
    r = run_cli(
        "run", "--out", str(out), "--", *JOB, cwd=tmp_path, timeout=600, env={"COLUMNS": "1000"}
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [" ".join(x.split()) for x in r.stdout.splitlines() if x.strip()]
    shared = [x for x in lines if x.startswith(SHARED)]
    assert any(x.startswith("what if:") for x in shared), r.stdout
    assert any(x.startswith("→ ") and "could recover ~" in x for x in shared), r.stdout
    html = tmp_path / "report.html"
    rep = run_cli("report", str(out), "-o", str(html), timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    html.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = run_chromium(html, tmp_path, "--dump-dom", "--window-size=1280,900")
    assert dom.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert m, dom.stdout[-2000:]
    page = " ".join(htmllib.unescape(m.group(1)).split())
    missing = [x for x in shared if _unmarked(x) not in page]
    assert not missing, "\n".join(missing)
    if not nvidia_driver_loaded():  # a CPU-only host
        assert "NVML" not in r.stderr, r.stderr
        assert any(x.startswith("note: GPU telemetry (NVML) does not apply") for x in lines)
        assert not any("GPU samples (NVML) not captured" in x for x in lines)
