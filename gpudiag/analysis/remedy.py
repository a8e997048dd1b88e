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

from gpudiag.analysis.model import (
    Finding,
    RankEvidence,
    RankSummary,
    RunSummary,
    StepBreakdown,
    WhatIf,
    by_rank,
)
from gpudiag.config import AdviceRules


def mean_part(steps: Sequence[StepBreakdown], ranks: Sequence[int], attr: str) -> int:
    """The largest per-rank mean of one part per step over the given ranks' steps.

    The mean, as the shares and the what-if use (one step model): a part that is large in
    a few steps costs its total over all of them, while its typical step holds none.
    """
    best = 0.0
    grouped = by_rank(steps)
    for r in ranks:
        vals = [getattr(s, attr) for s in grouped.get(r, [])]
        if vals:
            best = max(best, float(np.mean(vals)))
    return round(best)


def exposed_transfer(
    steps: Sequence[StepBreakdown], ranks: Sequence[int], sync: Mapping[tuple[int, int], int]
) -> int:
    """The largest per-rank mean of comm-wait minus synchronisation wait per step."""
    best = 0.0
    grouped = by_rank(steps)
    for r in ranks:
        vals = [max(0, s.comm_wait_ns - sync.get((r, s.step), 0)) for s in grouped.get(r, [])]
        if vals:
            best = max(best, float(np.mean(vals)))
    return round(best)


@dataclass(frozen=True)
class Context:
    """What every remedy reads: the run, its ranks and steps, sync waits and the rules."""

    run: RunSummary
    ranks: Mapping[int, RankSummary]
    steps: Sequence[StepBreakdown]
    sync: Mapping[tuple[int, int], int]
    rules: AdviceRules
    what_if: WhatIf | None = None

    @property
    def step_ns(self) -> int:
        """The base of every gain ratio (≥ 1 ns): the what-if's mean step, else the median."""
        if self.what_if is not None:
            return max(self.what_if.step_time_ns, 1)
        return max(self.run.step_time_ns_median, 1)

    def what_if_gain(self, field: str) -> int | None:
        """The step time one change of the what-if saves (``if_no_data_wait_ns`` …)."""
        if self.what_if is None:
            return None
        after = getattr(self.what_if, field)
        return None if after is None else self.what_if.step_time_ns - after

    def evidence(self, ranks: Sequence[int]) -> list[RankEvidence]:
        """The evidence of those of ``ranks`` the run has."""
        return [self.ranks[r].evidence for r in ranks if r in self.ranks]


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
