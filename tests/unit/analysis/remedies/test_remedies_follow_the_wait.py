"""Remedies follow the wait's decomposition (issue 30, point 3), on hand-built inputs.

Waiting for a straggler is recovered by fixing the straggler: without matched collectives
to split the wait, the communication remedies act only on the comm-wait less the
persistent stragglers' cost; a remedy's gain never exceeds the part it acts on; a failed or
interrupted run gets its failure's remedy first.
"""

from __future__ import annotations

from gpudiag.analysis.model.diagnosis import (
    Cause,
    Finding,
    FindingKind,
    Mode,
    RunSummary,
    Severity,
    Shares,
    StepBreakdown,
    WhatIf,
)
from gpudiag.analysis.model.metrics import CommBoundMetrics, JobFailedMetrics, StragglerMetrics
from gpudiag.analysis.remedies import comm
from gpudiag.analysis.remedies.advice import _straggler_wait, recommend
from gpudiag.analysis.remedies.remedy import Context
from gpudiag.config import AdviceRules

MS = 1_000_000
RUN = RunSummary(2, 2, 8, 200 * MS, 210 * MS, Shares(0.3, 0.6, 0.0, 0.1), 0.0, 0.7, Mode.CPU)


def _steps(last_wait_ms: int = 4) -> list[StepBreakdown]:
    """Rank 0 waits 150 ms a step in communication: 146 ms for rank 1, 4 ms of transfer
    (rank 1, the last to arrive, waits for the transfer alone)."""
    return [
        StepBreakdown(
            r,
            s,
            s * 200 * MS,
            200 * MS,
            (44 if r == 0 else 196 - last_wait_ms) * MS,
            (150 if r == 0 else last_wait_ms) * MS,
            0,
            6 * MS,
            0,
        )
        for s in range(8)
        for r in (0, 1)
    ]


def _straggler() -> Finding:
    return Finding(
        FindingKind.STRAGGLER,
        Severity.ERROR,
        "rank 1 …",
        ranks=[1],
        metrics=StragglerMetrics(
            "telemetry", "", 0.25, 146 * MS, 0.73, 8, 8, {}, [], 200 * MS, 54 * MS, False, 200 * MS
        ),
        cause=Cause.COMPUTE,
        persistent=True,
    )


def _comm() -> Finding:
    return Finding(
        FindingKind.COMM_BOUND,
        Severity.WARNING,
        "rank 0 …",
        ranks=[0],
        metrics=CommBoundMetrics({"0": 0.75}, 0.3),
    )


def test_the_straggler_wait_is_not_communication_time() -> None:
    assert _straggler_wait([_straggler(), _comm()]) == 146 * MS
    wi = WhatIf(200 * MS, 196 * MS, 200 * MS, 54 * MS, 50 * MS)
    c = Context(RUN, {}, _steps(), {}, AdviceRules(), wi, _straggler_wait([_straggler()]))
    # the comm-wait of rank 0 is 150 ms a step; 146 ms of it is the straggler's
    assert comm._transfer(_comm(), c) == 4 * MS
    # under a tenth of the wait is transfer: no communication remedy applies
    assert not comm._is_transfer(_comm(), c)
    # without a straggler named, the last arrival's wait still bounds the transfer
    c0 = Context(RUN, {}, _steps(), {}, AdviceRules(), wi, 0)
    assert c0.least_wait_ns == 4 * MS
    assert comm._transfer(_comm(), c0) == 4 * MS
    assert comm._overlap_gain(_comm(), c0) == 4 * MS


def test_a_gain_is_bounded_by_the_part_it_acts_on() -> None:
    # without a what-if, the overlap gain is the transfer: the wait less the straggler's
    c = Context(RUN, {}, _steps(last_wait_ms=60), {}, AdviceRules(), None, 100 * MS)
    assert comm._transfer(_comm(), c) == 50 * MS  # 150 ms of wait less the straggler's 100
    assert comm._overlap_gain(_comm(), c) == 50 * MS
    c = Context(RUN, {}, _steps(last_wait_ms=30), {}, AdviceRules(), None, 100 * MS)
    assert comm._transfer(_comm(), c) == 30 * MS  # the last arrival's wait
    assert comm._overlap_gain(_comm(), c) == 30 * MS


def test_a_failed_run_gets_its_failure_remedy_first() -> None:
    failed = Finding(
        FindingKind.JOB_FAILED,
        Severity.ERROR,
        "rank 1 raised RuntimeError in step 5",
        ranks=[1],
        steps=[5],
        metrics=JobFailedMetrics(
            exit_code=1,
            interrupted=False,
            first_rank=1,
            step=5,
            how="error",
            error="RuntimeError: boom",
        ),
    )
    recs = recommend(RUN, [], _steps(), [_straggler(), failed])
    assert [r.id for r in recs][:2] == ["job-failed", "investigate-rank-1"]
    assert recs[0].title == "Fix the error that ended rank 1 in step 5"
    assert recs[0].estimated_gain_ns is None and "RuntimeError: boom" in recs[0].detail


def test_an_interrupted_run_says_its_speed_ups_are_of_the_steps_it_ran() -> None:
    stop = Finding(
        FindingKind.JOB_FAILED,
        Severity.WARNING,
        "the run was interrupted (Ctrl-C)",
        metrics=JobFailedMetrics(exit_code=130, interrupted=True),
    )
    recs = recommend(RUN, [], _steps(), [_straggler(), stop])
    assert recs[0].id == "interrupted" and recs[0].estimated_gain_ns is None
    assert recs[1].id == "investigate-rank-1"
