"""Real ``gpudiag run -- torchrun`` jobs on CPU with gloo: traces, telemetry and manifest; and
``gpudiag report`` of a run, which carries the gains, what-if and evidence its console printed.

The report's check: the console's own lines are the truth, the HTML's are what Chromium lays
out. On a CPU-only host the run says nothing about NVML on stderr and carries one note that
GPU telemetry does not apply, not a finding.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ROOT, run_cli
from run_helpers import DEMO, run_gpudiag

from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import load_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2"]
SMALL = ["--hidden", "64", "--layers", "2", "--batch", "16"]


# A 2-rank job whose rank 1 sleeps 100 ms a step (so there is a straggler, a remedy with a
# gain and a what-if), profiled at steps 3-5; its console is read at 1000 columns (one
# logical line each) by the report test below.
STRAGGLER = ["--steps", "14", "--batch", "512", "--sleep-rank", "1", "--sleep-s", "0.1"]


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("straggler")
    out = tmp / "run"
    r = run_cli(
        "run",
        "--out",
        str(out),
        "--profile-steps",
        "3:6",
        "--",
        *TORCHRUN,
        str(DEMO),
        *STRAGGLER,
        cwd=tmp,
        timeout=600,
        env={"COLUMNS": "1000"},
    )
    return out, r


def test_two_ranks_traces_telemetry_manifest_and_straggler(
    straggler_run: tuple[Path, Any],
) -> None:
    # GIVEN a 2-rank job where rank 1 sleeps 100 ms before each forward
    out, r = straggler_run
    # THEN the job succeeded and the diagnosis is on stdout after it
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank" in r.stdout
    m = rundir.read_manifest(out / "manifest.json")
    assert m.exit_code == 0
    assert m.world_size == 2
    assert [x.rank for x in m.ranks] == [0, 1]
    assert m.sources["kineto"].captured
    assert m.sources["telemetry"].captured
    assert m.sources["nvml"].captured is False
    assert m.sources["nvml"].reason
    for rank in (0, 1):
        with gzip.open(rundir.trace_path(out, rank)) as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {f"ProfilerStep#{s}" for s in (3, 4, 5)} <= names
    df = load_steps(out)
    assert sorted(set(df["rank"])) == [0, 1]
    assert all(sorted(g["step"]) == list(range(14)) for _, g in df.groupby("rank"))
    assert set(df.loc[df["profiled"], "step"]) == {3, 4, 5}
    # AND the straggler shows: the fast rank waits for it inside backward (DDP all-reduce)
    steady = df[df["step"] >= 2]
    bw = steady.groupby("rank")["backward_ns"].median()
    assert bw[0] - bw[1] > 30_000_000, bw


def test_rank_raising_mid_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--no-analyze",
            "--",
            *TORCHRUN,
            str(DEMO),
            "--steps",
            "10",
            "--raise-at",
            "4",
            *SMALL,
        ]
    )
    assert r.returncode != 0
    m = rundir.read_manifest(out / "manifest.json")
    assert m.exit_code == r.returncode
    errors = m.extra["rank_errors"]
    assert any(e["rank"] == 1 and "injected failure at step 4" in e["message"] for e in errors)
    df = load_steps(out)
    assert sorted(df.loc[df["rank"] == 1, "step"]) == [0, 1, 2, 3]


PROBE = """<script>
addEventListener('load', () => {
  const p = document.createElement('pre'); p.id = 'probe';
  p.textContent = document.body.innerText;
  document.body.appendChild(p);
});
</script>"""


def test_report_of_a_run_says_what_its_console_said(
    straggler_run: tuple[Path, Any], tmp_path: Path
) -> None:
    import html as htmllib
    import re

    sys.path.insert(0, str(ROOT / "tests" / "unit" / "report"))
    from test_html_matches_console import SHARED, _unmarked
    from test_html_report import run_chromium

    from gpudiag.collect.samplers.nvml import nvidia_driver_loaded

    out, r = straggler_run
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
