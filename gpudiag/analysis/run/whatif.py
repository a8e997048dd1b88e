"""The step-time model behind ``Diagnosis.what_if``: first-order step times under three changes.

The what-if figures (``Diagnosis.what_if``) model each profiled step as synchronous:
``step ≈ max_r busy_r + min_r wait_r`` — the last rank's own work (busy = step − comm
wait), then the transfer, taken as the least wait of any rank (the last arrival waits only
for the transfer). "Communication fully overlapped" drops the transfer: ``max_r busy``;
"no data wait" subtracts each rank's data wait from its busy time; "straggler at median
speed" gives each persistent straggler the median busy time of the other ranks; "all"
applies the three together. Every figure is the **median** over the steps
(``WhatIf.statistic``), the statistic of the headline's step time, and the current step is
the median of each step's longest rank; every figure is clamped between 0 and it.

**The mean step beside it.** The verdict's shares and costs are over the run's time ("wait
for input 49% of each step"): a loader that runs dry in a minority of the steps costs the
run its stalls while the median step never waits. When any change saves, on the mean step,
a share of it that differs from its share of the median step by at least
``advice.what_if_mean_gap_ratio``, the same model on the mean step is ``WhatIf.on_mean``
(statistic ``mean``) and the what-if says both; a remedy whose change saves nothing on the
median step but saves on the mean one quotes the mean's gain, and says so.

**The critical path.** No change makes a step shorter than the work that remains on the
rank that is then slowest: "straggler at median speed" is never below the other ranks'
slowest busy time plus the transfer, and "all" never below the slowest other rank's busy
time less its data wait (``WhatIf.critical_path_ns``, the same statistic; the rank is
``critical_rank``; not known when the comm-wait is not measured, as in the step telemetry,
where the others' busy time holds their waiting). A straggler of the step telemetry whose
cost is subtracted (below) cannot take a step under it either.

This is the one step model: the remedies' gains for the same changes (no data wait: the
loader remedy; comm fully overlapped: the communication remedies; a straggler at median
speed: its remedy) are these differences, and their ratios are over this median step.

A persistent straggler of the step telemetry (``metrics.source`` ``telemetry``) is found on
the run's steady steps, not the window's: its cost is the same model on those steps, with
the time in backward as the wait (:func:`gpudiag.analysis.stragglers.stepmatrix.at_median_speed`),
and that cost (ns per step) is what "straggler at median speed" and "all" subtract here,
down to the critical path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    StepBreakdown,
    WhatIf,
    WhatIfFigures,
)
from gpudiag.analysis.model.metrics import StragglerMetrics


def _telemetry_stragglers(persistent: Sequence[Finding]) -> list[StragglerMetrics]:
    """Stragglers of the step telemetry, whose cost a window may not show.

    Their cost is on their own steps: the same model, on every steady step, with backward as
    the wait.
    """
    return [
        f.metrics
        for f in persistent
        if isinstance(f.metrics, StragglerMetrics)
        and f.metrics.source == "telemetry"
        and f.metrics.step_time_ns_mean
    ]


def what_if(
    steps: Sequence[StepBreakdown],
    findings: Sequence[Finding],
    comm_measured: bool = True,
    mean_gap_ratio: float = 0.05,
) -> WhatIf | None:
    """First-order step times under three changes (the module docstring states the model).

    Without a measured comm-wait (``comm_measured`` False: telemetry only) there is no
    "comm fully overlapped" (None) rather than "no change".
    """
    per = _per_step(steps, findings, comm_measured)
    if per is None:
        return None
    median = _figures(per, "median", comm_measured)
    mean = _figures(per, "mean", comm_measured)
    figures = {f.name: getattr(mean, f.name) for f in dataclasses.fields(WhatIfFigures)}
    on_mean = WhatIfFigures(**figures) if _differs(median, mean, mean_gap_ratio) else None
    return dataclasses.replace(median, on_mean=on_mean)


_CHANGES = (
    "if_comm_overlapped_ns",
    "if_no_data_wait_ns",
    "if_straggler_at_median_speed_ns",
    "if_all_ns",
)


def _differs(median: WhatIf, mean: WhatIf, gap: float) -> bool:
    """Some change saves a share of the mean step ``gap`` away from its share of the median."""
    if not median.step_time_ns or not mean.step_time_ns:
        return False
    for name in _CHANGES:
        a, b = getattr(median, name), getattr(mean, name)
        if a is None or b is None:
            continue
        on_median = (median.step_time_ns - a) / median.step_time_ns
        on_mean = (mean.step_time_ns - b) / mean.step_time_ns
        if abs(on_mean - on_median) >= gap:
            return True
    return False


@dataclass(frozen=True)
class _PerStep:
    """Each step's modelled time under each change (one entry a step)."""

    cur: list[float]
    no_comm: list[float]
    no_data: list[float]
    no_strag: list[float]
    everything: list[float]
    floor_strag: list[float]
    floor_all: list[float]
    critical: list[tuple[float, int]]
    cost: float  # the telemetry stragglers' cost, ns a step
    tele: bool


def _per_step(
    steps: Sequence[StepBreakdown], findings: Sequence[Finding], comm_measured: bool
) -> _PerStep | None:
    """The step model, step by step (the statistic over the steps is taken after)."""
    if not steps:
        return None
    by_step: dict[int, list[StepBreakdown]] = {}
    for s in steps:
        by_step.setdefault(s.step, []).append(s)
    persistent = [
        f for f in findings if f.kind == FindingKind.STRAGGLER and f.persistent and f.ranks
    ]
    tele = _telemetry_stragglers(persistent)
    cost = sum((m.step_time_ns_mean or 0) - m.step_time_ns_if_median_speed for m in tele)
    stragglers = {f.ranks[0] for f in persistent if f.metrics not in tele}
    slow = {f.ranks[0] for f in persistent}  # every straggler: the rest is the critical path

    def model(busy: dict[int, float], wait: dict[int, float]) -> float:
        # a synchronous step: the last rank's own work, then the transfer (the least wait)
        return max(busy.values()) + min(wait.values())

    def at_median(busy: dict[int, float]) -> dict[int, float]:
        others = [b for r, b in busy.items() if r not in stragglers]
        if not stragglers or not others:
            return busy
        med = float(nputil.median(others))
        return {r: (med if r in stragglers else b) for r, b in busy.items()}

    p = _PerStep([], [], [], [], [], [], [], [], float(cost), bool(tele))
    for v in by_step.values():
        busy = {x.rank: float(x.duration_ns - x.comm_wait_ns) for x in v}
        wait = {x.rank: float(x.comm_wait_ns) for x in v}
        fed = {x.rank: busy[x.rank] - x.data_wait_ns for x in v}
        p.cur.append(max(x.duration_ns for x in v))
        p.no_comm.append(max(busy.values()))
        p.no_data.append(model(fed, wait))
        # the critical path: the work left on the slowest rank that is no straggler
        rest = [r for r in busy if r not in slow] or list(busy)
        last = max(rest, key=lambda r: fed[r])
        p.critical.append((fed[last], last))
        # without a measured wait the others' busy time holds their waiting: no floor here
        # (a telemetry straggler's cost is its own model's, bounded by its critical path)
        p.floor_all.append(fed[last] if comm_measured else 0.0)
        p.floor_strag.append(
            max(busy[r] for r in rest) + min(wait.values()) if comm_measured else 0.0
        )
        if stragglers:
            p.no_strag.append(model(at_median(busy), wait))
        p.everything.append(max(at_median(fed).values()))
    return p


def _figures(p: _PerStep, statistic: str, comm_measured: bool) -> WhatIf:
    """The what-if's figures: ``statistic`` (median or mean) over the steps of each change."""

    def stat(values: list[float]) -> float:
        return float(nputil.median(values)) if statistic == "median" else float(np.mean(values))

    now = stat(p.cur)

    def clamped(values: list[float]) -> int:
        # a first-order model never predicts a step slower than now, nor below zero
        return round(min(now, max(0.0, stat(values))))

    no_strag, everything = p.no_strag, p.everything
    if p.tele:
        no_strag = [
            max(v - p.cost, lo) for v, lo in zip(no_strag or p.cur, p.floor_strag, strict=True)
        ]
        everything = [max(v - p.cost, lo) for v, lo in zip(everything, p.floor_all, strict=True)]
    ranks = [r for _, r in p.critical]
    return WhatIf(
        step_time_ns=round(now),
        if_comm_overlapped_ns=clamped(p.no_comm) if comm_measured else None,
        if_no_data_wait_ns=clamped(p.no_data),
        if_straggler_at_median_speed_ns=clamped(no_strag) if no_strag else None,
        if_all_ns=clamped(everything),
        statistic=statistic,
        critical_path_ns=clamped([c for c, _ in p.critical]) if comm_measured else None,
        critical_rank=max(set(ranks), key=ranks.count) if comm_measured else None,
    )
