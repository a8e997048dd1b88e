"""Issue 12, launch side of "a diagnosis from telemetry alone": a job shorter than the
profiling window is never left without a trace silently, and still ends with a diagnosis.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from run_helpers import DEMO, TORCHRUN, run_gpudiag

import gpudiag
from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import load_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

SMALL = ["--hidden", "64", "--layers", "2", "--batch", "16"]


@pytest.mark.parametrize(
    ("steps", "fit"),
    [(3, "1:3"), (4, "1:4")],  # window never opened; window in its warm-up step at the end
)
def test_job_shorter_than_the_window(tmp_path: Path, steps: int, fit: str) -> None:
    out = tmp_path / "run"
    r = run_gpudiag(
        ["run", "--out", str(out), "--", *TORCHRUN, str(DEMO), "--steps", str(steps), *SMALL]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    want = f"profile window 5:10 not reached: ranks ran {steps} steps; rerun with --profile-steps {fit}"
    # THEN stderr says so once, the manifest says exactly why, telemetry covers every step
    assert r.stderr.count(f"gpudiag: {want}") == 1, r.stderr[-3000:]
    m = rundir.read_manifest(out / "manifest.json")
    assert m.sources["kineto"] == rundir.SourceStatus(False, want)
    assert m.sources["telemetry"].captured
    assert {w["status"] for w in m.extra["profile_windows"]} == {"not_reached"}
    df = load_steps(out)
    for rank in (0, 1):
        assert sorted(df.loc[df["rank"] == rank, "step"]) == list(range(steps))
    # AND the run still ends with a diagnosis, from the step telemetry
    assert "step telemetry (no trace)" in r.stdout, r.stdout[-2000:]
    d = gpudiag.analyze(out, jobs=1)
    assert d.run.mode == "telemetry" and d.run.steps >= steps - 1


def test_job_ending_inside_the_window_keeps_its_complete_steps(tmp_path: Path) -> None:
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
            "7",
            *SMALL,
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    m = rundir.read_manifest(out / "manifest.json")
    k = m.sources["kineto"]
    assert k.captured
    assert k.reason == "window 5:10 cut by the job's exit; steps 5-6 kept (every rank)"
    df = load_steps(out)
    assert set(df.loc[df["profiled"], "step"]) == {5, 6}
