"""An interrupted run's verdict: where it stopped, then the bottleneck of the finished steps.

Truth from outside gpudiag: the findings are built by hand (a data-bound finding of 46%
and the run's interrupt, as /tmp/trial/int1's Ctrl-C in step 14); the verdict must carry
that finding's bottleneck, share and ranks, and say where the run stopped.
"""

from __future__ import annotations

from gpudiag.analysis.hangs.runend import run_end_findings
from gpudiag.analysis.model.diagnosis import Finding, Mode, RunSummary, Shares
from gpudiag.analysis.model.kinds import FindingKind, Severity
from gpudiag.analysis.model.metrics import DataBoundMetrics
from gpudiag.analysis.verdict import verdict
from gpudiag.traces.runfiles.runend import RankEnd, RunEnd


def _run(steps: int = 10) -> RunSummary:
    return RunSummary(2, 2, steps, 100, 120, Shares(0.5, 0.0, 0.46, 0.04), 0.0, 0.5, Mode.GPU)


def _interrupt() -> Finding:
    end = RunEnd(
        ends=(
            RankEnd(0, 14, 1, False, error_ns=1, error="KeyboardInterrupt: "),
            RankEnd(1, 14, 1, False),
        ),
        exit_code=130,
        interrupted=True,
    )
    (f,) = run_end_findings(end)
    return f


def test_interrupted_run_keeps_its_bottleneck() -> None:
    data = Finding(
        FindingKind.DATA_BOUND,
        Severity.WARNING,
        "ranks 0–1 wait for input",
        ranks=[0, 1],
        metrics=DataBoundMetrics({"0": 0.46, "1": 0.46}, 0.3),
    )
    v = verdict(_run(), [_interrupt(), data])
    assert v.headline == (
        "interrupted in step 14 (Ctrl-C); until then: data-bound: ranks 0–1 wait for input "
        "46% of each step"
    )
    assert (v.bottleneck, round(v.share, 2), v.ranks, v.interrupted) == ("data", 0.46, [0, 1], True)
    assert v.finding == 1


def test_interrupted_before_any_step_stays_interrupted() -> None:
    v = verdict(_run(steps=0), [_interrupt()])
    assert v.bottleneck == "interrupted" and v.interrupted is None
