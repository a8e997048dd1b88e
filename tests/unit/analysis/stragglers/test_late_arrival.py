"""The late-arrival verdict on synthetic matched collectives with known answers.

One profiled step, 4 ranks; rank 2 enters the step 300 ms late (the others wait in their
communication); afterwards the race for last place is decided by noise.
"""

from __future__ import annotations

from gpudiag.analysis.model.diagnosis import CollectivesSummary, LateArrival, StepBreakdown
from gpudiag.analysis.stragglers.late_arrival import late_arrival

MS = 1_000_000


def _steps(late_rank: int | None, late_ms: int) -> list[StepBreakdown]:
    out = []
    for r in range(4):
        wait = 5 * MS if r == late_rank or late_rank is None else (late_ms + 5) * MS
        other = (late_ms + 5) * MS if r == late_rank else 5 * MS
        compute = 20 * MS
        out.append(StepBreakdown(r, 3, 0, compute + wait + other, compute, wait, 0, other, 0))
    return out


def _summary(late: dict[str, LateArrival], matched: int) -> CollectivesSummary:
    return CollectivesSummary("order", matched, False, [], late_arrival=late)


def test_the_rank_everyone_waited_for_is_named_even_when_the_count_is_a_race():
    # last at only 3 of 6 (1 and 3 share the rest), but 98% of the waiting is for it
    late = {
        "2": LateArrival(3, 900 * MS, 1 * MS, 298 * MS),
        "1": LateArrival(2, 10 * MS, 4 * MS, 6 * MS),
        "3": LateArrival(1, 5 * MS, 5 * MS, 5 * MS),
    }
    (f,) = late_arrival(_summary(late, 6), _steps(2, 300), [])
    assert f.ranks == [2] and f.metrics.source == "late_arrival"
    assert f.metrics.wait_share > 0.95
    assert 250 * MS < f.metrics.waited_ns_per_step < 350 * MS
    assert f.cause == "host"  # its excess is in "other", not compute or data
    assert "rank 2 arrives last at 3 of 6 collectives" in f.message


def test_often_last_by_count_is_named():
    late = {
        "0": LateArrival(8, 400 * MS, 40 * MS, 60 * MS),
        "1": LateArrival(1, 350 * MS, 350 * MS, 350 * MS),
    }
    (f,) = late_arrival(_summary(late, 9), _steps(0, 300), [])
    assert f.ranks == [0]


def test_balanced_noise_names_nobody():
    # every rank last about equally often, waits of a millisecond: jitter
    late = {str(r): LateArrival(2, 2 * MS, 1 * MS, 1 * MS) for r in range(4)}
    assert late_arrival(_summary(late, 8), _steps(None, 0), []) == []


def test_a_late_rank_costing_little_of_a_step_is_not_named():
    # rank 2 is last everywhere, but the others lose 1 ms of a 30 ms step (< 10%)
    late = {"2": LateArrival(8, 8 * MS, 1 * MS, 1 * MS)}
    assert late_arrival(_summary(late, 8), _steps(2, 1), []) == []
