"""What every remedy reads and is: the Context, the Remedy row, and the per-step statistics.

A remedy (one row of :data:`gpudiag.analysis.remedies.advice.RULES`) is five functions of
(finding, context): its id, title and detail, its estimated gain per step and its
evidence, plus the condition under which it applies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gpudiag._support.nputil import group_medians, unique_inverse
from gpudiag._support.records import dataclass
from gpudiag.analysis.model.diagnosis import (
    Finding,
    RankEvidence,
    RankSummary,
    RunSummary,
    StepBreakdown,
    WhatIf,
)
from gpudiag.analysis.model.evidence import WorkloadTag
from gpudiag.analysis.rank import workload
from gpudiag.analysis.rank.devices import Capability, common_capability
from gpudiag.config import AdviceRules


class PerRankStats:
    """Per-rank medians and means of the run's step parts, each computed once, vectorised.

    A remedy asks for "the largest per-rank median of comm-wait over the flagged ranks"
    several times per finding; over thousands of ranks, one ``np.median`` per rank per
    question was most of the cross-rank work. Here each (part, statistic) is one sort of
    all steps (:func:`gpudiag._support.nputil.group_medians`), and a question is a lookup per rank.
    The values are exactly ``np.median`` / ``np.mean`` of each rank's steps.
    """

    def __init__(self, steps: Sequence[StepBreakdown], sync: Mapping[tuple[int, int], int]):
        self._steps, self._sync = steps, sync
        self._rank = np.fromiter((s.rank for s in steps), np.int64, len(steps))
        self._done: dict[tuple[str, str], dict[int, float]] = {}

    def of(self, part: str, stat: str) -> dict[int, float]:
        """Rank → ``stat`` (``median`` or ``mean``) of ``part`` over its steps.

        ``part`` is a StepBreakdown field, or ``exposed_transfer``: comm-wait less the
        synchronisation wait of the step (at least 0).
        """
        key = (part, stat)
        if key not in self._done:
            n = len(self._steps)
            if part == "exposed_transfer":
                sync = self._sync
                vals = np.fromiter(
                    (max(0, s.comm_wait_ns - sync.get((s.rank, s.step), 0)) for s in self._steps),
                    np.int64,
                    n,
                )
            else:
                vals = np.fromiter((getattr(s, part) for s in self._steps), np.int64, n)
            if stat == "median":
                ranks, v = group_medians(self._rank, vals)
            elif stat == "mean":  # integer sums are exact, so the order of summing is moot
                ranks, inverse = unique_inverse(self._rank)
                sums = np.zeros(ranks.size, np.int64)
                np.add.at(sums, inverse, vals)
                counts = np.bincount(inverse, minlength=ranks.size)
                v = sums.astype(np.float64) / counts
            else:
                raise ValueError(f"unknown statistic {stat!r}")
            self._done[key] = dict(zip(ranks.tolist(), v.tolist(), strict=True))
        return self._done[key]

    def largest(self, ranks: Sequence[int], part: str, stat: str = "median") -> int:
        """The largest per-rank ``stat`` of ``part`` over ``ranks`` (0 without steps), rounded."""
        per = self.of(part, stat)
        best = 0.0
        for r in ranks:
            v = per.get(r)
            if v is not None:
                best = max(best, v)
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
    # the others' wait per step for the persistent stragglers (their cost): the part of a
    # communication wait that only fixing the straggler recovers, where no matched
    # collectives split it (``sync``)
    straggler_wait_ns: int = 0

    @property
    def step_ns(self) -> int:
        """The base of every gain ratio (≥ 1 ns): the what-if's median step, else the run's."""
        if self.what_if is not None:
            return max(self.what_if.step_time_ns, 1)
        return max(self.run.step_time_ns_median, 1)

    def what_if_gain(self, field: str, mean_fallback: bool = False) -> int | None:
        """The step time one change of the what-if saves (``if_no_data_wait_ns`` …).

        On the what-if's median step; with ``mean_fallback``, where the median step saves
        nothing and the mean step beside it (``on_mean``) does, the mean step's saving
        (:meth:`gain_on_mean` says so).
        """
        if self.what_if is None:
            return None
        if mean_fallback and self.gain_on_mean(field):
            m = self.what_if.on_mean
            assert m is not None
            return int(m.step_time_ns - getattr(m, field))
        after = getattr(self.what_if, field)
        return None if after is None else self.what_if.step_time_ns - after

    def gain_on_mean(self, field: str) -> bool:
        """The change saves nothing on the median step but saves on the mean step beside it."""
        w = self.what_if
        m = w.on_mean if w is not None else None
        if w is None or m is None or getattr(w, field) is None or getattr(m, field) is None:
            return False
        return bool(w.step_time_ns - getattr(w, field) <= 0 < m.step_time_ns - getattr(m, field))

    def evidence(self, ranks: Sequence[int]) -> list[RankEvidence]:
        """The evidence of those of ``ranks`` the run has."""
        return [self.ranks[r].evidence for r in ranks if r in self.ranks]

    @functools.cached_property
    def per_rank(self) -> PerRankStats:
        """The steps' per-rank statistics, computed as remedies ask for them."""
        return PerRankStats(self.steps, self.sync)

    def median_part(self, ranks: Sequence[int], part: str, stat: str = "median") -> int:
        """The largest per-rank median (or mean) of one part over the given ranks' steps."""
        return self.per_rank.largest(ranks, part, stat)

    @functools.cached_property
    def least_wait_ns(self) -> int | None:
        """The median over steps of the least comm-wait of any rank (None: one rank a step).

        The last rank to reach a collective waits only for the transfer: no rank's transfer
        in that step is longer.
        """
        by_step: dict[int, list[int]] = {}
        for s in self.steps:
            by_step.setdefault(s.step, []).append(s.comm_wait_ns)
        least = [min(v) for v in by_step.values() if len(v) >= 2]
        return round(float(np.median(least))) if least else None

    def exposed_transfer(self, ranks: Sequence[int]) -> int:
        """The largest per-rank median of comm-wait minus synchronisation wait per step."""
        return self.per_rank.largest(ranks, "exposed_transfer")

    def workload(self, ranks: Sequence[int] = ()) -> dict[str, WorkloadTag]:
        """The workload tags of some ranks (every rank when none is named)."""
        which = [self.ranks[r] for r in ranks if r in self.ranks]
        if not which:
            return self._all_workload
        return workload.merged(r.evidence.workload or {} for r in which)

    @functools.cached_property
    def _all_workload(self) -> dict[str, WorkloadTag]:
        """Every rank's workload tags together (asked for by many remedies: merged once)."""
        return workload.merged(r.evidence.workload or {} for r in self.ranks.values())

    def device(self) -> Capability:
        """What every rank's GPUs support (analysis/devices.py)."""
        caps = [Capability(**r.evidence.device) for r in self.ranks.values() if r.evidence.device]
        return common_capability(caps)

    def low_precision_share(self) -> float:
        """The share of compute kernel time in half-precision kernels, over every rank."""
        vals = [
            float(r.evidence.low_precision_share)
            for r in self.ranks.values()
            if r.evidence.low_precision_share is not None
        ]
        return max(vals, default=0.0)


Text = Callable[[Finding, Context], str]
Gain = Callable[[Finding, Context], "int | None"]
# a remedy's evidence: a JSON object each remedy family types (CommEvidence, HostEvidence …)
Evidence = Callable[[Finding, Context], Mapping[str, object]]


def always(_f: Finding, _c: Context) -> bool:
    """The default condition: the remedy applies to every finding of its kind."""
    return True


def native(c: Context) -> bool:
    """A C/C++/CUDA program (no PyTorch name in the trace): no PyTorch advice.

    Only ranks whose names were read count (evidence ``workload``); without any, nothing
    says the program is not PyTorch.
    """
    read = any(r.evidence.workload is not None for r in c.ranks.values())
    return read and workload.native_program(c.workload())


def compiled(c: Context) -> bool:
    """torch.compile is already in use (its compiled graphs or Triton kernels run)."""
    return "compiled" in c.workload()


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
