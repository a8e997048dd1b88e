"""Why a straggler is slow: the part of its busy time that exceeds the other ranks'.

The straggler's own parts in its slow steps against the others' median (the median over
those steps, so one host-disturbed step does not decide): the largest excess among
data-wait (→ ``data``), compute (→ ``compute``, or ``hardware`` when NVML shows that
rank's GPU slowed down by the driver or clocked low) and the rest (→ ``host``); a second
part of about the same size is named too (:mod:`gpudiag.analysis.stragglers.detect`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.analysis.model.diagnosis import Cause, GpuStats
from gpudiag.analysis.stragglers.stepmatrix import F64, StepMatrix
from gpudiag.config import StragglerRules


@dataclass
class StragglerContext:
    """What every straggler decision of one run reads."""

    trace: StepMatrix | None
    gpus: Sequence[GpuStats]
    rules: StragglerRules
    sync: Mapping[tuple[int, int], int]
    sync_totals: dict[int, int]  # every rank's sync wait per step, summed once


def cause_of(
    m: StepMatrix, ctx: StragglerContext, rank: int, flagged_steps: list[int], persistent: bool
) -> tuple[Cause, dict[str, float]]:
    """Which part of the straggler's busy time exceeds the others' (ns per slow step)."""
    trace = ctx.trace
    src, cols = m, [m.steps.index(s) for s in flagged_steps if s in m.steps]
    if m.source == "telemetry" and trace is not None and rank in trace.ranks:
        # the profiled window splits compute from host: use its slow steps if it saw any
        seen = [trace.steps.index(s) for s in flagged_steps if s in trace.steps]
        if seen or persistent:
            src, cols = trace, seen or list(range(len(trace.steps)))
    i = src.ranks.index(rank)

    def delta(a: F64) -> float:
        # the typical slow step: a median, so one host-disturbed step does not decide
        others = np.median(np.delete(a, i, axis=0), axis=0)
        return float(np.nanmedian((a[i] - others)[cols])) if cols else float("nan")

    data = delta(src.data)
    if src.source == "trace":
        parts = {
            "data": data,
            "compute": delta(src.compute),
            "host": delta(src.busy - src.data - src.compute),
        }
    else:
        parts = {"data": data, "other": delta(src.busy - src.data)}
    parts = {k: v for k, v in parts.items() if not np.isnan(v)}
    if not parts or max(parts.values()) <= 0:
        return Cause.UNKNOWN, parts
    top = max(parts, key=lambda k: parts[k])
    # telemetry alone ("other") cannot tell compute from host
    cause = Cause.UNKNOWN if top == "other" else Cause(top)
    if cause in (Cause.COMPUTE, Cause.UNKNOWN) and _hardware(rank, ctx.gpus, ctx.rules):
        cause = Cause.HARDWARE
    return cause, parts


def also_parts(
    cause: Cause, parts: Mapping[str, float], step_median: float, rules: StragglerRules
) -> list[str]:
    """Other parts whose excess is at least ``also_ratio`` of the cause's, and of a step."""
    key = "compute" if cause == Cause.HARDWARE else str(cause)
    top = parts.get(key, 0.0)
    if top <= 0:
        return []
    return [
        k
        for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
        if k != key
        and k in ("data", "compute", "host")
        and v >= rules.also_ratio * top
        and v >= rules.also_step_ratio * step_median
    ]


def _hardware(rank: int, gpus: Sequence[GpuStats], rules: StragglerRules) -> bool:
    """The rank's GPU was slowed down by the driver, or clocked well below the others."""
    mine = [g for g in gpus if g.rank == rank]
    if not mine:
        return False
    g = mine[0]
    if g.slowdown_ratio is not None and g.slowdown_ratio >= rules.slowdown_ratio:
        return True
    clocks = [o.sm_clock_mhz for o in gpus if o.rank not in (None, rank) and o.sm_clock_mhz]
    return bool(
        g.sm_clock_mhz
        and clocks
        and g.sm_clock_mhz < (1 - rules.clock_deficit_ratio) * float(nputil.median(clocks))
    )


CAUSE_WORDS = {
    Cause.DATA: "waiting for its data",
    Cause.COMPUTE: "computing longer",
    Cause.HOST: "in host-side work outside compute and data (Python, launches, sleeps)",
    Cause.HARDWARE: "on a GPU the driver slowed down or clocked low",
    Cause.UNKNOWN: "for a reason the telemetry cannot split",
}


PART_WORDS = {
    "data": "waiting for data",
    "compute": "computing longer",
    "host": "in host-side work (Python, launches, sleeps)",
}
