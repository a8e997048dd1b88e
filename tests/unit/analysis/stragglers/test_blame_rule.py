"""Who is to blame on a busy host (issue 30, point 2): the job's straggler or the host.

Hand-built profiled windows with injected effects: a rank that computes a steady 150 ms
more every step is the job's straggler whatever the host's load; an excess that moves
between ranks, or whose size swings as contention does, is named the host's likely doing.
"""

from __future__ import annotations

import numpy as np

from gpudiag.analysis.model.diagnosis import Cause, FindingKind, Severity, StepBreakdown
from gpudiag.analysis.model.metrics import StragglerMetrics
from gpudiag.analysis.stragglers.busy_host import on_busy_host, own_straggler
from gpudiag.analysis.stragglers.detect import find_stragglers
from gpudiag.config import StragglerRules

MS = 1_000_000
BUSY = {"other_cpu_ratio": 0.66}


def _window(extra_ms: list[tuple[int, float]], base_ms: float = 50.0) -> list[StepBreakdown]:
    """A synchronous window: step s's slow rank computes ``extra`` ms more; the other waits."""
    rng = np.random.default_rng(7)
    out, t = [], 0
    for s, (slow, extra) in enumerate(extra_ms):
        comp = {r: base_ms + float(rng.uniform(-1, 1)) for r in (0, 1)}
        comp[slow] += extra
        step = max(comp.values()) + 2.0  # 2 ms of transfer
        for r in (0, 1):
            wait = step - comp[r]
            out.append(
                StepBreakdown(
                    r, s, t, round(step * MS), round(comp[r] * MS), round(wait * MS), 0, 0, 0
                )
            )
        t += round(step * MS)
    return out


def _straggler(steps: list[StepBreakdown]):
    (f,) = [f for f in find_stragglers(steps) if f.kind == FindingKind.STRAGGLER]
    return f


def test_a_steady_one_sided_compute_excess_is_the_jobs_straggler_on_a_busy_host() -> None:
    f = _straggler(_window([(1, 150.0 + (s % 3)) for s in range(16)]))
    m = f.metrics_as(StragglerMetrics)
    assert f.ranks == [1] and f.persistent and f.cause == Cause.COMPUTE
    assert m.moved_steps_ratio == 0.0 and m.excess_spread_ratio is not None
    assert m.excess_spread_ratio < 0.05  # 150–152 ms: steady
    assert own_straggler(f, StragglerRules())
    (b,) = on_busy_host([f], BUSY, gpu=False, rules=StragglerRules())
    assert b.severity == Severity.ERROR and "likely the host" not in b.message
    assert "host_contention" not in b.metrics.to_json()
    assert "its excess stays on rank 1 (16 of 16 steps; another rank slow in 0%)" in b.message
    assert "the job's own" in b.message


def test_an_excess_that_moves_between_ranks_is_named_the_hosts() -> None:
    # rank 1 behind in 12 of 16 steps, rank 0 in the other 4: contention taking turns
    plan = [(0 if s % 4 == 3 else 1, 150.0) for s in range(16)]
    f = _straggler(_window(plan))
    m = f.metrics_as(StragglerMetrics)
    assert f.ranks == [1] and f.persistent
    assert m.moved_steps_ratio == 0.25
    assert not own_straggler(f, StragglerRules())
    (b,) = on_busy_host([f], BUSY, gpu=False, rules=StragglerRules())
    assert b.severity == Severity.WARNING and "likely the host, not the job" in b.message
    assert b.metrics_as(StragglerMetrics).host_contention == BUSY


def test_an_excess_whose_size_swings_is_named_the_hosts() -> None:
    # one-sided, but 20 ms in some steps and 300 ms in others: it follows the load
    sizes = [20.0, 300.0, 40.0, 260.0, 25.0, 310.0, 60.0, 280.0] * 2
    f = _straggler(_window([(1, x) for x in sizes]))
    m = f.metrics_as(StragglerMetrics)
    assert f.ranks == [1] and f.persistent and m.moved_steps_ratio == 0.0
    assert m.excess_spread_ratio is not None and m.excess_spread_ratio > 0.5
    (b,) = on_busy_host([f], BUSY, gpu=False, rules=StragglerRules())
    assert "likely the host" in b.message


def test_the_rule_constants_decide() -> None:
    f = _straggler(_window([(0 if s % 4 == 3 else 1, 150.0) for s in range(16)]))
    # with a looser "moves" limit the same straggler is the job's
    assert own_straggler(f, StragglerRules(own_moved_ratio=0.3, own_steps_ratio=0.7))
    # a quiet host: nothing to qualify
    assert on_busy_host([f], {}, gpu=False) == [f]
