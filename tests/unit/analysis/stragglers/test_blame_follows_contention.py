"""Who is to blame on a busy host, over time (docs/definitions.md, "who is to blame").

Hand-built telemetry steps and hand-built contention samples with known answers: one
sample per 1 s step, rank 1 computing an injected excess on top of rank 0's 500 ms. An
excess whose size tracks the contention series is the host's likely doing, even at a size
steady enough for the no-series rule to call it the job's; an excess that stays on one rank
while the contention is flat is the job's, even when its size swings.
"""

from __future__ import annotations

import numpy as np

from gpudiag.analysis.model.diagnosis import FindingKind, RunStep, Severity, StepBreakdown
from gpudiag.analysis.model.metrics import StragglerMetrics
from gpudiag.analysis.stragglers.busy_host import (
    follows_contention,
    on_busy_host,
    own_straggler,
    step_contention,
)
from gpudiag.analysis.stragglers.detect import find_stragglers
from gpudiag.config import StragglerRules
from gpudiag.rundir.conditions import ContentionSample

MS = 1_000_000
T0 = 1_796_000_000 * 1_000_000_000  # time.time_ns scale
BUSY = {"other_cpu_ratio": 0.55}
N = 16


def _telemetry(excess_ms: list[float]) -> list[RunStep]:
    """Step s: 1 s long from T0 + s s; rank 0 busy 500 ms, rank 1 500 ms + excess; the rest
    of each step is backward (the wait)."""
    out = []
    for s, ex in enumerate(excess_ms):
        for r in (0, 1):
            busy = 500.0 + (ex if r else 0.0)
            out.append(
                RunStep(
                    r, s, T0 + s * 1000 * MS, 1000 * MS, 0, None, round((1000 - busy) * MS), False
                )
            )
    return out


def _samples(ratios: list[float]) -> list[ContentionSample]:
    """One sample over each step's second."""
    return [
        ContentionSample("h", T0 + s * 1000 * MS, T0 + (s + 1) * 1000 * MS, c)
        for s, c in enumerate(ratios)
    ]


def _finding(excess_ms: list[float]):
    """The persistent straggler of a profiled window with the same excesses."""
    rng = np.random.default_rng(3)
    steps, t = [], 0
    for s, ex in enumerate(excess_ms):
        comp = {0: 50.0 + float(rng.uniform(-1, 1)), 1: 50.0 + ex}
        step = max(comp.values()) + 2.0
        steps += [
            StepBreakdown(
                r,
                s,
                t,
                round(step * MS),
                round(comp[r] * MS),
                round((step - comp[r]) * MS),
                0,
                0,
                0,
            )
            for r in (0, 1)
        ]
        t += round(step * MS)
    (f,) = [f for f in find_stragglers(steps) if f.kind == FindingKind.STRAGGLER]
    assert f.ranks == [1] and f.persistent
    return f


def test_step_contention_weights_the_samples_by_overlap() -> None:
    samples = [ContentionSample("h", 0, 10, 0.2), ContentionSample("h", 10, 20, 0.8)]
    assert step_contention(5, 15, samples) == 0.5
    assert step_contention(8, 18, samples) == (2 * 0.2 + 8 * 0.8) / 10
    assert step_contention(30, 40, samples) is None


def test_an_excess_that_tracks_the_contention_is_the_hosts() -> None:
    # contention in blocks of 0.3 and 0.7 of the CPUs; rank 1's excess 100 ms + 100 ms × it:
    # 130 or 170 ms, steady enough for the no-series rule (spread under half its median)
    cont = [0.3 if (s // 2) % 2 == 0 else 0.7 for s in range(N)]
    excess = [100.0 + 100.0 * c for c in cont]
    f = _finding(excess)
    rules = StragglerRules()
    assert own_straggler(f, rules)  # without the series: the job's
    follow = follows_contention(_telemetry(excess), 1, _samples(cont), rules)
    assert follow is not None
    rho, spread, n = follow
    assert rho == 1.0 and spread == 0.4 and n == N
    (b,) = on_busy_host([f], BUSY, False, rules, _telemetry(excess), {1: _samples(cont)})
    assert b.severity == Severity.WARNING
    assert "its excess follows the host's contention (rank correlation +1.00 over 16 steps)" in (
        b.message
    )
    assert "likely the host, not the job" in b.message
    m = b.metrics_as(StragglerMetrics)
    assert m.host_contention == BUSY and m.contention_follow == {
        "rho": 1.0,
        "range": 0.4,
        "steps": N,
    }


def test_an_excess_on_one_rank_with_flat_contention_is_the_jobs() -> None:
    # contention flat at 0.55; rank 1's excess swings 20–300 ms (the no-series rule would
    # call that the host's): it stays on rank 1 and cannot follow what does not move
    sizes = [20.0, 300.0, 40.0, 260.0, 25.0, 310.0, 60.0, 280.0] * 2
    cont = [0.55] * N
    f = _finding(sizes)
    rules = StragglerRules()
    assert not own_straggler(f, rules)  # without the series: the host's
    (b,) = on_busy_host([f], BUSY, False, rules, _telemetry(sizes), {1: _samples(cont)})
    assert b.severity == Severity.ERROR and "likely the host" not in b.message
    assert "host_contention" not in b.metrics.to_json()
    assert (
        "the contention hardly varied (0% of the CPUs between its p10 and p90 over 16 steps)"
        in (b.message)
    )
    assert "the job's own" in b.message


def test_an_excess_that_ignores_a_varying_contention_is_the_jobs() -> None:
    # contention varies (0.3/0.7 blocks) but the excess's size swings on its own period
    cont = [0.3 if (s // 4) % 2 == 0 else 0.7 for s in range(N)]
    sizes = [100.0, 300.0] * (N // 2)
    f = _finding(sizes)
    rules = StragglerRules()
    follow = follows_contention(_telemetry(sizes), 1, _samples(cont), rules)
    assert follow is not None and abs(follow[0]) < rules.follow_rho and follow[1] == 0.4
    (b,) = on_busy_host([f], BUSY, False, rules, _telemetry(sizes), {1: _samples(cont)})
    assert b.severity == Severity.ERROR and "does not follow the contention" in b.message


def test_too_few_sampled_steps_fall_back_to_the_steady_size_rule() -> None:
    cont = [0.3, 0.7] * 3
    excess = [100.0 + 100.0 * c for c in cont]
    rules = StragglerRules()
    assert follows_contention(_telemetry(excess), 1, _samples(cont), rules) is None
    # a lower step floor reads the same 6 steps
    assert follows_contention(
        _telemetry(excess), 1, _samples(cont), StragglerRules(follow_min_steps=6)
    )
