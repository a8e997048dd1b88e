"""What every remedy reads and is: the Context, the Remedy row, and the per-step statistics.

A remedy (one row of :data:`gpudiag.analysis.advice.RULES`) is five functions of
(finding, context): its id, title and detail, its estimated gain per step and its
evidence, plus the condition under which it applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis import workload
from gpudiag.analysis.devices import Capability, common_capability
from gpudiag.analysis.model import (
    Finding,
    RankEvidence,
    RankSummary,
    RunSummary,
    StepBreakdown,
    by_rank,
)
from gpudiag.config import AdviceRules


def median_part(
    steps: Sequence[StepBreakdown], ranks: Sequence[int], attr: str, stat: Any = np.median
) -> int:
    """The largest per-rank median (or ``stat``) of one part over the given ranks' steps."""
    best = 0.0
    grouped = by_rank(steps)
    for r in ranks:
        vals = [getattr(s, attr) for s in grouped.get(r, [])]
        if vals:
            best = max(best, float(stat(vals)))
    return round(best)


def exposed_transfer(
    steps: Sequence[StepBreakdown], ranks: Sequence[int], sync: Mapping[tuple[int, int], int]
) -> int:
    """The largest per-rank median of comm-wait minus synchronisation wait per step."""
    best = 0.0
    grouped = by_rank(steps)
    for r in ranks:
        vals = [max(0, s.comm_wait_ns - sync.get((r, s.step), 0)) for s in grouped.get(r, [])]
        if vals:
            best = max(best, float(np.median(vals)))
    return round(best)


@dataclass(frozen=True)
class Context:
    """What every remedy reads: the run, its ranks and steps, sync waits and the rules."""

    run: RunSummary
    ranks: Mapping[int, RankSummary]
    steps: Sequence[StepBreakdown]
    sync: Mapping[tuple[int, int], int]
    rules: AdviceRules

    @property
    def step_ns(self) -> int:
        """The run's median step time (≥ 1 ns), the base of every gain ratio."""
        return max(self.run.step_time_ns_median, 1)

    def evidence(self, ranks: Sequence[int]) -> list[RankEvidence]:
        """The evidence of those of ``ranks`` the run has."""
        return [self.ranks[r].evidence for r in ranks if r in self.ranks]

    def workload(self, ranks: Sequence[int] = ()) -> dict[str, Any]:
        """The workload tags of some ranks (every rank when none is named)."""
        which = [self.ranks[r] for r in ranks if r in self.ranks] or list(self.ranks.values())
        return workload.merged(r.evidence.workload or {} for r in which)

    def device(self) -> Capability:
        """What every rank's GPUs support (analysis/devices.py)."""
        caps = [Capability(**r.evidence.device) for r in self.ranks.values()
                if r.evidence.device]  # fmt: skip
        return common_capability(caps)

    def low_precision_share(self) -> float:
        """The share of compute kernel time in half-precision kernels, over every rank."""
        vals = [float(r.evidence.low_precision_share) for r in self.ranks.values()
                if r.evidence.low_precision_share is not None]  # fmt: skip
        return max(vals, default=0.0)


Text = Callable[[Finding, Context], str]
Gain = Callable[[Finding, Context], "int | None"]
Evidence = Callable[[Finding, Context], dict[str, Any]]


def always(_f: Finding, _c: Context) -> bool:
    """The default condition: the remedy applies to every finding of its kind."""
    return True


@dataclass(frozen=True)
class Remedy:
    """One row of the table: what to change, when, why, and what it could recover."""

    id: Text
    title: Text
    detail: Text
    gain: Gain
    evidence: Evidence
    applies: Callable[[Finding, Context], bool] = always


def const(text: str) -> Text:
    """A text that does not depend on the finding."""
    return lambda _f, _c: text
