"""Late arrival: the rank the others wait for at the matched collectives.

The straggler verdict of a window too short for the persistent rule, when no other rule
named a rank (:mod:`gpudiag.analysis.stragglers.detect` gives the rule in full).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.model.diagnosis import (
    CollectivesSummary,
    Finding,
    FindingKind,
    LateArrival,
    Severity,
    StepBreakdown,
)
from gpudiag.analysis.model.metrics import LateArrivalMetrics
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.stragglers.cause import CAUSE_WORDS, StragglerContext, cause_of
from gpudiag.analysis.stragglers.stepmatrix import StepMatrix, sign_test, trace_matrix
from gpudiag.config import CollectiveRules, StragglerRules


def late_arrival(
    coll: CollectivesSummary | None,
    trace_steps: Sequence[StepBreakdown],
    findings: Sequence[Finding],
    rules: StragglerRules | None = None,
    crules: CollectiveRules | None = None,
) -> list[Finding]:
    """The rank everyone waits for at the collectives, when no straggler rule named one.

    From matched collectives (``CollectivesSummary.late_arrival``), the rank the others
    waited for longest, when it arrives last *often* — at ``collectives.late_share`` (half)
    of them or more, at least twice as often as any other rank and more often than chance
    makes one of R ranks last (binomial, 1/R, at ``persistent_alpha``) — or *late*: half or
    more of all the waiting for the last rank is waiting for it, twice as much as for the
    next rank (a rank that enters the step late makes everyone wait at the first
    collective; who is last at the later ones is a race that host noise decides), while
    the others' waiting for it comes to at least
    ``excess_ratio`` of a step — the straggler verdict of a window too short for the
    persistent rule (one profiled step is enough). Its cause comes from its own parts
    against the others'.
    """
    rules, crules = rules or StragglerRules(), crules or CollectiveRules()
    if (
        coll is None
        or not coll.late_arrival
        or any(f.kind == FindingKind.STRAGGLER for f in findings)
    ):
        return []
    # how late first (the waiting it caused), then how often
    counts = sorted(coll.late_arrival.items(), key=lambda kv: (-kv[1].waited_ns, -kv[1].last))
    (rank_s, top), rest = counts[0], counts[1:]
    second = max((v.last for _, v in rest), default=0)
    next_wait = rest[0][1].waited_ns if rest else 0
    total_wait = sum(v.waited_ns for v in coll.late_arrival.values())
    wait_share = top.waited_ns / total_wait if total_wait else 0.0
    trace = trace_matrix(trace_steps)
    if trace is None or int(rank_s) not in trace.ranks:
        return []
    step = float(nputil.median(trace.duration))
    # what each other rank loses per step: its exposed communication wait beyond the late
    # rank's own (collectives in flight together would be counted twice by their durations)
    i = trace.ranks.index(int(rank_s))
    others = np.median(np.delete(trace.wait, i, axis=0), axis=0)
    per_step = float(np.mean(np.clip(others - trace.wait[i], 0, None)))
    chance = sign_test(top.last, coll.matched, 1 / max(len(trace.ranks), 2))
    often = (
        top.last >= crules.late_share * coll.matched
        and top.last >= 2 * second
        and chance < rules.persistent_alpha
    )
    # one late entry makes everyone wait at the first collective; the later ones of the
    # step are then a race that host noise decides: the waiting is the evidence
    late = wait_share >= crules.late_share and top.waited_ns >= 2 * next_wait
    if not (often or late) or per_step < rules.excess_ratio * step:
        return []
    then = f" (then rank {rest[0][0]}: {rest[0][1].last})" if rest and rest[0][1].last else ""
    return [
        _late_finding(
            trace, rules, coll.matched, int(rank_s), top, then, second, wait_share, per_step
        )
    ]


def _late_finding(
    trace: StepMatrix,
    rules: StragglerRules,
    matched: int,
    rank: int,
    top: LateArrival,
    then: str,
    second: int,
    wait_share: float,
    per_step: float,
) -> Finding:
    """The straggler finding of :func:`late_arrival`: the rank, its waiting and its cause."""
    step = float(nputil.median(trace.duration))
    ctx = StragglerContext(trace, (), rules, {}, {})
    cause, parts = cause_of(trace, ctx, rank, trace.steps, True)
    low, high = duration(top.waited_ns_min, "brief"), duration(top.waited_ns_max, "brief")
    span = low if top.waited_ns_min == top.waited_ns_max else f"{low}–{high}"
    msg = (
        f"rank {rank} arrives last at {top.last} of {matched} collectives{then}, "
        f"{wait_share:.0%} of all waiting for the last rank; "
        f"the other ranks wait {span} for it each time "
        f"({duration(per_step, 'brief')} a step each, "
        f"{per_step / step:.0%} of a step), {CAUSE_WORDS[cause]}"
    )
    return Finding(
        kind=FindingKind.STRAGGLER,
        severity=Severity.WARNING,
        message=msg,
        ranks=[rank],
        steps=list(trace.steps),
        metrics=LateArrivalMetrics(
            source="late_arrival",
            last_at=top.last,
            collectives_matched=matched,
            next_rank_last_at=second,
            wait_share=wait_share,
            waited_ns_per_step=round(per_step),
            median_excess_ns=round(per_step),
            excess_by_part_ns={k: round(v) for k, v in parts.items()},
            steps_compared=len(trace.steps),
            step_time_ns_median=round(step),
        ),
        cause=cause,
        persistent=None,
        wait_caused_ns=top.waited_ns,
    )
