"""The step matrix the straggler rules compare: per (rank, step) busy time, waiting and parts.

Rows are ranks, columns the steps every rank has, from the profiled window
(:func:`trace_matrix`) or the step telemetry (:func:`telemetry_matrix`); the per-step rule
(:func:`slow_steps`, offline and live alike), the leave-one-out excess over the other ranks,
the cost of a rank at the others' speed, the jitter and the sign test are computed on it
(:mod:`gpudiag.analysis.stragglers.detect` says why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gpudiag._support import nputil
from gpudiag._support.nputil import median_without_each
from gpudiag._support.records import dataclass
from gpudiag.analysis.model.diagnosis import RunStep, StepBreakdown, WholeRun, by_rank
from gpudiag.analysis.model.kinds import StragglerSource
from gpudiag.analysis.reading.steady import steady_steps
from gpudiag.config import SteadyRules, StragglerRules

F64 = npt.NDArray[np.float64]


MAD_TO_SIGMA = 1.4826  # median absolute deviation → standard deviation of a normal sample


@dataclass
class StepMatrix:
    """Per (rank, step) values aligned on steps every rank has: rows = ranks, cols = steps."""

    ranks: list[int]
    steps: list[int]
    duration: F64
    busy: F64
    wait: F64  # time the rank waited for the others (nan when unknown)
    compute: F64  # nan when unknown (telemetry)
    data: F64
    source: StragglerSource


def _matrix(
    ranks: list[int],
    steps: list[int],
    rows: Mapping[tuple[int, int], tuple[float, ...]],
    source: StragglerSource,
) -> StepMatrix:
    arr = np.full((6, len(ranks), len(steps)), np.nan)
    for i, r in enumerate(ranks):
        for j, s in enumerate(steps):
            arr[:, i, j] = rows[(r, s)]
    return StepMatrix(ranks, steps, arr[0], arr[1], arr[2], arr[3], arr[4], source)


def trace_matrix(steps: Sequence[StepBreakdown]) -> StepMatrix | None:
    """The profiled window's steps that every rank has."""
    ranks = sorted({s.rank for s in steps})
    if len(ranks) < 2:
        return None
    grouped = by_rank(steps)
    common = sorted(set.intersection(*[{s.step for s in grouped[r]} for r in ranks]))
    if not common:
        return None
    keep = set(common)
    rows = {
        (s.rank, s.step): (
            s.duration_ns,
            s.duration_ns - s.comm_wait_ns,
            s.comm_wait_ns,
            s.compute_ns,
            s.data_wait_ns,
            s.other_ns,
        )
        for s in steps
        if s.step in keep
    }
    return _matrix(ranks, common, rows, "trace")


def telemetry_matrix(whole: WholeRun | None, steady: SteadyRules) -> StepMatrix | None:
    """The run's steady steps that every rank has, from telemetry.

    None unless backward (or comm wait) was measured.
    """
    if whole is None:
        return None
    ranks = sorted({s.rank for s in whole.steps})
    if len(ranks) < 2:
        return None
    keep = steady_steps(whole.steps, steady)
    per_rank = [{st for r2, st in keep if r2 == r} for r in ranks]
    return steps_matrix(whole.steps, ranks, sorted(set.intersection(*per_rank)))


def steps_matrix(
    steps: Sequence[RunStep], ranks: list[int], common: list[int]
) -> StepMatrix | None:
    """The telemetry steps ``common`` of ``ranks`` (each must have every one of them).

    busy = step time − backward (else − comm wait); None when neither was measured.
    """
    keep, members = set(common), set(ranks)
    rows: dict[tuple[int, int], tuple[float, ...]] = {}
    for s in steps:
        if s.step not in keep or s.rank not in members:
            continue
        wait = s.backward_ns if s.backward_ns is not None else s.comm_wait_ns
        if wait is None:
            return None
        data = float(s.data_wait_ns) if s.data_wait_ns is not None else np.nan
        rows[(s.rank, s.step)] = (s.duration_ns, s.duration_ns - wait, wait, np.nan, data, np.nan)
    if len(rows) != len(ranks) * len(common) or not common:
        return None
    return _matrix(ranks, common, rows, "telemetry")


def excess(busy: F64) -> F64:
    """busy[r, s] − median of the other ranks' busy in step s (leave-one-out)."""
    return busy - others_median(busy)


def others_median(a: F64) -> F64:
    """out[r, s] = median of the other ranks' values in step s, for every rank r.

    One sort per step (:func:`gpudiag._support.nputil.median_without_each`), not one median of a
    copy per rank: linear-logarithmic in ranks, not quadratic. With one rank, or a NaN,
    the per-rank medians themselves (NaN where there are no others, as before).
    """
    n = a.shape[0]
    if n >= 2 and not np.isnan(a).any():
        return median_without_each(a)
    out = np.empty_like(a)
    for i in range(n):
        out[i] = np.median(np.delete(a, i, axis=0), axis=0)
    return out


def slow_steps(m: StepMatrix, rules: StragglerRules) -> tuple[F64, npt.NDArray[np.bool_], float]:
    """(excess, slow, typical step): the per-step rule, offline and live alike.

    (r, s) is slow when its excess is at least ``excess_ratio`` × the typical step (the
    median step time of ``m``, not the possibly stalled step itself) and the rank waited no
    more than the others' median in that step.
    """
    ex = excess(m.busy)
    step = float(nputil.median(m.duration))
    others_wait = others_median(m.wait)
    return ex, (ex >= rules.excess_ratio * step) & (m.wait <= others_wait), step


def at_median_speed(m: StepMatrix, i: int) -> tuple[float, float]:
    """(mean step now, mean step were rank ``i`` as fast as the others): the what-if's model.

    :mod:`gpudiag.analysis.run.whatif`'s synchronous step, on this matrix: the mean of each
    step's longest rank now, and of ``max_r busy + min_r wait`` with rank ``i``'s busy time
    set to the others' median in that step, clamped to [0, now]. In the step telemetry the
    wait is backward (DDP's all-reduce wait is in it), so a rank that works longer outside
    backward shows here, where the ranks' step times alone (equal: the others wait) do not.
    """
    now = float(np.mean(m.duration.max(axis=0)))
    busy = m.busy.copy()
    busy[i] = np.median(np.delete(m.busy, i, axis=0), axis=0)
    after = float(np.mean(busy.max(axis=0) + np.nanmin(m.wait, axis=0)))
    return now, min(now, max(0.0, after))


def jitter_ns(ex: F64) -> float:
    """One robust standard deviation of excesses (MAD × 1.4826)."""
    return MAD_TO_SIGMA * float(nputil.median(np.abs(ex - nputil.median(ex)))) if ex.size else 0.0


def sign_test(positive: int, n: int, p: float = 0.5) -> float:
    """P(X ≥ positive) for X ~ Binomial(n, p).

    How often chance alone puts a rank ahead of the others' median (p = 1/2) in that many
    of n steps, or makes it the last of R ranks (p = 1/R) at that many of n collectives.
    """
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(positive, n + 1))
