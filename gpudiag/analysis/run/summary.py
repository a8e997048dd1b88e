"""Per-rank and run summaries of the analysed steps: medians, shares, idle ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.model.diagnosis import (
    Mode,
    RankSummary,
    RunSummary,
    Shares,
    StepBreakdown,
)
from gpudiag.analysis.rank.analyse import RankResult


def _percentile(values: np.ndarray[Any, Any], q: float) -> int:
    return round(nputil.percentile(values, q)) if values.size else 0


def step_time_stats(durations: Sequence[int]) -> tuple[int, int]:
    """(median, p90) of step times, ns: the one function behind every header and table.

    The run's figures are it over every analysed (rank, step), each rank's over its own
    steps; with several ranks they can differ from every row, and renderers say so.
    """
    arr = np.asarray(durations, dtype=np.int64)
    return _percentile(arr, 50), _percentile(arr, 90)


def _gpu_idle(steps: Sequence[StepBreakdown]) -> float | None:
    """Time-weighted GPU idle (no GPU activity of any kind); None without GPU steps."""
    gpu = [s for s in steps if s.gpu_idle_ns is not None]
    total = sum(s.duration_ns for s in gpu)
    return sum(s.gpu_idle_ns or 0 for s in gpu) / total if total > 0 else None


def _shares(
    steps: Sequence[StepBreakdown], measured: bool = True
) -> tuple[Shares, float, float, float | None]:
    """Time-weighted shares, overlapped ratio, idle ratio and hidden ratio of some steps."""
    total = sum(s.duration_ns for s in steps)
    if total <= 0:
        return Shares(0.0, 0.0, 0.0, 0.0, measured), 0.0, 0.0, None
    c = sum(s.compute_ns for s in steps)
    w = sum(s.comm_wait_ns for s in steps)
    d = sum(s.data_wait_ns for s in steps)
    o = sum(s.other_ns for s in steps)
    ov = sum(s.comm_overlapped_ns for s in steps)
    hidden = ov / (ov + w) if (ov + w) > 0 and measured else None
    shares = Shares(c / total, w / total, d / total, o / total, measured)
    return shares, ov / total, 1.0 - c / total, hidden


def comm_measured(results: Sequence[RankResult]) -> bool:
    """Whether any source measured the communication wait of these ranks.

    A trace does. Step telemetry alone times only the collectives Python calls (not DDP's
    C++ reducer, docs/definitions.md): when it saw no collective wait at all, the wait is
    not measured, rather than 0.
    """
    if any(r.mode != Mode.TELEMETRY for r in results):
        return True
    return any(s.comm_wait_ns > 0 for r in results for s in r.steps)


def summarize_rank(res: RankResult) -> RankSummary:
    """A rank's summary over its analysed steps."""
    median, p90 = step_time_stats([s.duration_ns for s in res.steps])
    shares, ov, idle, hidden = _shares(res.steps, comm_measured([res]))
    return RankSummary(
        rank=res.rank,
        steps=len(res.steps),
        step_time_ns_median=median,
        step_time_ns_p90=p90,
        shares=shares,
        comm_overlapped_ratio=ov,
        comm_hidden_ratio=hidden,
        idle_ratio=idle,
        mode=res.mode,
        step_source=res.step_source,
        source=res.meta.source,
        devices=sorted(set(res.meta.devices))[:1] if res.meta.devices else [],
        notes=res.notes,
        evidence=res.evidence,
        gpu_idle_ratio=_gpu_idle(res.steps),
    )


def run_summary(results: Sequence[RankResult], steps: Sequence[StepBreakdown]) -> RunSummary:
    """The run's summary over every rank's analysed steps."""
    median, p90 = step_time_stats([s.duration_ns for s in steps])
    shares, ov, idle, _ = _shares(steps, comm_measured(results))
    modes = {r.mode for r in results}
    world = [r.meta.world_size for r in results if r.meta.world_size]
    return RunSummary(
        ranks=len(results),
        world_size=max(world) if world else None,
        steps=len({s.step for s in steps}),
        step_time_ns_median=median,
        step_time_ns_p90=p90,
        shares=shares,
        comm_overlapped_ratio=ov,
        idle_ratio=idle,
        mode=modes.pop() if len(modes) == 1 else Mode.MIXED,
        gpu_idle_ratio=_gpu_idle(steps),
    )
