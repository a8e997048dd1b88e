"""Issue 12: `gpudiag run` coexists with a job that runs its own torch.profiler.

Each real 2-rank gloo job runs under `gpudiag run` (default window 5:10): the exit code the
job has alone and the output of the job run directly (one direct run: no profiler changes
what the job prints), the job's own traces complete, gpudiag's telemetry for every step and
a manifest that says what happened to its window.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from run_helpers import DEMO, TORCHRUN, run_direct, run_gpudiag

from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import load_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

STEPS = 12
SMALL = ["--steps", str(STEPS), "--hidden", "64", "--layers", "2", "--batch", "16", "--print-loss"]


def _trace_names(path: Path) -> Counter[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        return Counter(e.get("name", "") for e in json.load(f)["traceEvents"])


@pytest.fixture(scope="module")
def direct() -> Any:
    """The job without a profiler of its own, run once directly: what it prints (its loss at
    every step) is what each variant below prints, directly or under gpudiag, since no
    profiler changes a loss; what each variant's own profiler records is known from its
    arguments (the steps it profiles), so it needs no direct run of its own."""
    r = run_direct([*TORCHRUN, str(DEMO), *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(r.stdout.splitlines()) == STEPS
    return r


def _under(tmp_path: Path, direct: Any, job_args: Any, exit_code: int = 0) -> tuple[Path, Path]:
    """Run the demo under gpudiag; the job writes its own traces under the returned dir."""
    d = tmp_path / "gpudiag"
    d.mkdir()
    cmd = [*TORCHRUN, str(DEMO), *SMALL, *job_args(d)]
    r = run_gpudiag(["run", "--out", str(d / "run"), "--no-analyze", "--", *cmd])
    # THEN the job cannot tell: its exit code, and the output of the job run directly
    assert r.returncode == exit_code, r.stderr[-3000:]
    assert r.stdout == direct.stdout
    assert "Segmentation fault" not in r.stderr
    return d, d / "run"


def _telemetry(run: Path) -> tuple[rundir.RunManifest, Any, list[dict[str, Any]]]:
    m = rundir.read_manifest(run / "manifest.json")
    df = load_steps(run)
    for rank in (0, 1):  # telemetry covers every step either way
        assert sorted(df.loc[df["rank"] == rank, "step"]) == list(range(STEPS))
    recs = [
        json.loads(x)
        for x in rundir.steps_path(run, 0).read_text().splitlines()
        if '"type":"step"' in x
    ]
    assert m.diagnosis_incomplete == []
    return m, df, recs


def test_job_profiling_from_step_0(tmp_path: Path, direct: Any) -> None:
    # GIVEN a job that profiles every step in a plain `with profile()` and exits with 3
    under, run = _under(
        tmp_path,
        direct,
        lambda d: [
            *("--profile-from", "0", "--exit-code", "3"),
            *("--profile-export", str(d / "job-{rank}.json")),
        ],
        exit_code=1,  # torchrun exits 1 when its ranks fail (here with 3)
    )
    # THEN its traces are complete (every optimizer step)
    for rank in (0, 1):
        assert _trace_names(under / f"job-{rank}.json")["Optimizer.step#SGD.step"] == STEPS
    # AND gpudiag stood down, said why, and points at the job's traces
    m, _, recs = _telemetry(run)
    assert m.exit_code == 1
    k = m.sources["kineto"]
    assert not k.captured
    assert k.reason.startswith(
        "the job runs its own torch.profiler.profile from step 0; no gpudiag window"
    )
    assert not list((run / "ranks").glob("*.pt.trace.json.gz"))
    jt = sorted(m.extra["job_traces"], key=lambda t: t["rank"])
    assert [(t["rank"], t["api"], t["path"]) for t in jt] == [
        (r, "export_chrome_trace", str(under / f"job-{r}.json")) for r in (0, 1)
    ]
    assert all(t["exists"] for t in jt)
    assert all(r["job_profiler"] for r in recs)
    assert not any(r["profiled"] for r in recs)


def test_job_starting_its_profiler_inside_gpudiags_window(tmp_path: Path, direct: Any) -> None:
    # GIVEN a job that starts its own profiler at step 7, inside gpudiag's window 5:10
    under, run = _under(
        tmp_path,
        direct,
        lambda d: ["--profile-from", "7", "--profile-export", str(d / "job-{rank}.json.gz")],
    )
    for rank in (0, 1):  # its own trace: steps 7-11
        assert _trace_names(under / f"job-{rank}.json.gz")["Optimizer.step#SGD.step"] == 5
    # THEN gpudiag closed its window first and kept the complete steps 5 and 6
    m, df, recs = _telemetry(run)
    k = m.sources["kineto"]
    assert k.captured
    assert k.reason.startswith(
        "window 5:10 cut at step 7: the job started its own profiler (torch.profiler.profile); "
        "steps 5-6 kept"
    )
    for rank in (0, 1):
        names = _trace_names(rundir.trace_path(run, rank))
        assert {"ProfilerStep#5", "ProfilerStep#6"} <= set(names)
    assert set(df.loc[df["profiled"], "step"]) == {5, 6}
    assert [r["step"] for r in recs if r["job_profiler"]] == [7, 8, 9, 10, 11]
    profile = [
        json.loads(x)
        for x in rundir.steps_path(run, 0).read_text().splitlines()
        if '"type":"profile"' in x
    ]
    assert [(p["start_step"], p["end_step"], p["cut_at_step"]) for p in profile] == [(5, 7, 7)]
    assert {t["api"] for t in m.extra["job_traces"]} == {"export_chrome_trace"}


def test_job_with_schedule_and_tensorboard_handler(tmp_path: Path, direct: Any) -> None:
    # GIVEN the demo's own schedule (wait 2, warm-up 1, active 5) + tensorboard_trace_handler
    under, run = _under(tmp_path, direct, lambda d: ["--profile-dir", str(d / "tb")])
    files = sorted((under / "tb").iterdir())
    assert len(files) == 2  # one per rank
    for f in files:
        names = _trace_names(f)
        assert {f"ProfilerStep#{s}" for s in range(3, 8)} <= set(names)
    # THEN gpudiag did not open its window (the job records steps 2-7) and lists the traces
    m, _, recs = _telemetry(run)
    k = m.sources["kineto"]
    assert not k.captured
    assert k.reason.startswith(
        "window 5:10 not opened at step 4: the job's own torch.profiler.profile records since "
        "step 2"
    )
    jt = m.extra["job_traces"]
    assert {t["api"] for t in jt} == {"tensorboard_trace_handler"}
    assert sorted(Path(t["path"]) for t in jt) == sorted((under / "tb").iterdir())
    assert [r["step"] for r in recs if r["job_profiler"]] == [2, 3, 4, 5, 6, 7]
    sessions = [s for s in m.extra["job_profiler"] if s["rank"] == 0]
    assert [(s["start_step"], s["stop_step"]) for s in sessions] == [(2, 8)]


def test_job_schedule_that_would_start_inside_the_window(tmp_path: Path, direct: Any) -> None:
    # GIVEN a job whose schedule records steps 6-10: idle when gpudiag's window would open
    _, run = _under(
        tmp_path, direct, lambda d: ["--profile-dir", str(d / "tb"), "--profile-wait", "5"]
    )
    # THEN gpudiag looked ahead in the job's schedule and stood down instead of being cut
    m, _, recs = _telemetry(run)
    assert not m.sources["kineto"].captured
    assert "schedule records during gpudiag's window" in m.sources["kineto"].reason
    assert [r["step"] for r in recs if r["job_profiler"]] == [5, 6, 7, 8, 9, 10]
