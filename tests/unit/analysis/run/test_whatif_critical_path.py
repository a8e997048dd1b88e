"""What-ifs on the critical path (issue 30, point 4), on hand-built windows with known work.

No what-if step is shorter than the work left on the rank that is then slowest (issue 30
saw "all together → 17.7 ms" where the healthy rank alone computed 42 ms a step), and every
figure says its statistic over the steps: the median, the headline's, with the mean step beside
it where a change saves a different share of it (the verdict's shares are of the run's time).
"""

from __future__ import annotations

from gpudiag.analysis.model.diagnosis import Cause, Finding, FindingKind, Severity, StepBreakdown
from gpudiag.analysis.model.metrics import StragglerMetrics
from gpudiag.analysis.run.whatif import what_if

MS = 1_000_000


def _window(
    n: int = 8, healthy_ms: float = 42.0, extra_ms: float = 150.0, data_ms: float = 3.0
) -> list[StepBreakdown]:
    """Rank 0 computes ``healthy_ms`` (after ``data_ms`` of data-wait); rank 1 as much plus
    ``extra_ms``; rank 0 waits for it, both pay 2 ms of transfer."""
    out, t = [], 0
    for s in range(n):
        busy = {0: healthy_ms + data_ms, 1: healthy_ms + data_ms + extra_ms}
        step = max(busy.values()) + 2.0
        out += [
            StepBreakdown(
                r,
                s,
                t,
                round(step * MS),
                round((busy[r] - data_ms) * MS),
                round((step - busy[r]) * MS),
                round(data_ms * MS),
                0,
                0,
            )
            for r in (0, 1)
        ]
        t += round(step * MS)
    return out


def _telemetry_straggler(cost_ms: float) -> Finding:
    """A persistent straggler of the step telemetry whose cost the window does not bound."""
    mean = 200 * MS
    return Finding(
        FindingKind.STRAGGLER,
        Severity.ERROR,
        "rank 1 …",
        ranks=[1],
        metrics=StragglerMetrics(
            "telemetry",
            "",
            0.3,
            150 * MS,
            0.75,
            16,
            17,
            {},
            [],
            mean,
            round(mean - cost_ms * MS),
            False,
            mean,
        ),
        cause=Cause.COMPUTE,
        persistent=True,
    )


def test_all_together_is_never_below_the_healthy_ranks_work() -> None:
    # a telemetry cost larger than the window's excess (the steps differ): the old model
    # subtracted it below the healthy rank's own 42 ms of compute
    w = what_if(_window(), [_telemetry_straggler(cost_ms=185.0)])
    assert w is not None and w.statistic == "median" and w.on_mean is None
    assert w.critical_rank == 0
    assert w.critical_path_ns == 42 * MS  # rank 0: busy less its data wait
    assert w.if_all_ns is not None and w.if_all_ns >= 42 * MS
    assert w.if_all_ns == 42 * MS
    # at median speed the straggler still waits for rank 0's busy time and the transfer
    assert w.if_straggler_at_median_speed_ns == (42 + 3 + 2) * MS


def test_a_window_straggler_is_set_to_the_others_speed_down_to_them() -> None:
    f = Finding(
        FindingKind.STRAGGLER,
        Severity.ERROR,
        "rank 1 …",
        ranks=[1],
        metrics=StragglerMetrics(
            "trace", "", 0.3, 150 * MS, 0.75, 8, 8, {}, [], 197 * MS, 47 * MS, False, 197 * MS
        ),
        cause=Cause.COMPUTE,
        persistent=True,
    )
    w = what_if(_window(), [f])
    assert w is not None
    assert w.step_time_ns == (42 + 3 + 150 + 2) * MS
    assert w.if_straggler_at_median_speed_ns == (42 + 3 + 2) * MS
    assert w.if_all_ns == 42 * MS  # no data wait, no transfer, no straggler: rank 0's compute


def test_every_figure_is_the_median_step() -> None:
    # 7 steps of 197 ms and one of 1.347 s (rank 1 stalls 1.15 s more): the median does not
    # pay it, the mean would
    steps = _window(n=7) + [
        StepBreakdown(
            r,
            7,
            10**12,
            round(1347 * MS),
            round((42 + (1150 if r else 0)) * MS),
            round((1347 - 45 - (1150 if r else 0)) * MS),
            3 * MS,
            0,
            0,
        )
        for r in (0, 1)
    ]
    w = what_if(steps, [])
    assert w is not None and w.statistic == "median"
    assert w.step_time_ns == 197 * MS
    assert w.if_no_data_wait_ns == w.step_time_ns - 3 * MS
    assert w.if_comm_overlapped_ns == w.step_time_ns - 2 * MS


def _stalled_loader(normal: int, stalled: int) -> list[StepBreakdown]:
    """Both ranks compute 48 ms and pay 2 ms of transfer; ``stalled`` steps wait 300 ms more
    for input (both ranks), the ``normal`` ones not at all."""
    out, t = [], 0
    for s in range(normal + stalled):
        data = 300 if s >= normal else 0
        step = 48 + data + 2
        out += [StepBreakdown(r, s, t, step * MS, 48 * MS, 2 * MS, data * MS, 0, 0) for r in (0, 1)]
        t += step * MS
    return out


def test_a_loader_stalling_in_a_minority_of_steps_shows_on_the_mean_step() -> None:
    # 5 steps of 50 ms and 3 of 350 ms: the median step never waits for input, the run's
    # time does (mean step 162.5 ms, 112.5 ms of it input): on_mean carries it
    w = what_if(_stalled_loader(5, 3), [])
    assert w is not None and w.statistic == "median"
    assert w.step_time_ns == 50 * MS and w.if_no_data_wait_ns == 50 * MS
    m = w.on_mean
    assert m is not None and m.statistic == "mean"
    assert m.step_time_ns == round(162.5 * MS)
    assert m.if_no_data_wait_ns == 50 * MS
    # stalling in 7 steps of 8 it saves 86% of the median step and 84% of the mean one, under
    # advice.what_if_mean_gap_ratio (5 points) apart: the median says it
    w = what_if(_stalled_loader(1, 7), [])
    assert w is not None and w.if_no_data_wait_ns == 50 * MS and w.step_time_ns == 350 * MS
    assert w.on_mean is None
