"""Pipeline parallelism: finds point-to-point stages, measures their bubble against the schedule's.

A run is treated as a pipeline when at least two ranks communicate (almost) only by
point-to-point ``send``/``recv`` (≥ ``pipeline.min_p2p_share``, 80%, of their
collectives), as the collective args (or gloo's operation ranges) name them — a bare
``SendRecv`` kernel is not enough, since NCCL runs all-to-all with the same kernels. Then,
with p = the number of such ranks (analyse every stage's trace together) and m = the
micro-batches per step (forward sends per step of the first stage):

* the **measured bubble** of a stage is the time it is blocked waiting for a receive
  (activations forward, gradients backward) with nothing computing, ÷ its step time
  (``evidence.p2p_recv_wait_ns``); a send merely in flight while the stage computes is
  not waiting. Without receive ranges in the trace, the stage's idle ratio stands in;
* the **schedule** is read from the first stage's order of sends and receives in a step:
  GPipe (all forward sends, then all backward receives) or 1F1B (p − 1 warm-up sends,
  then send/receive pairs, then the remaining receives); anything else is reported as an
  unknown schedule and not compared;
* the **schedule's bubble** for GPipe and 1F1B is (p − 1) / (m + p − 1).

Every recognised pipeline has a ``pipeline_bubble`` finding: a warning when the measured
bubble or the schedule's own bubble exceeds the idle threshold, or the measured bubble
exceeds the schedule's by more than ``pipeline.imbalance_margin``; else an info finding
that says the bubble is within the threshold (so a pipeline's receive waits are never left
unexplained, whatever its bubble). The schedule's bubble also holds each stage's idle
drain at the end of a step (stage s finishes its backward s slots early), which is not a
receive wait: a balanced GPipe pipeline measures below (p − 1)/(m + p − 1), so only an
excess is compared. The excess
over the schedule is put on the stages' balance when their compute per step differs by
more than that margin (the heaviest stage is named), else on slow point-to-point
transfers. More micro-batches are proposed while m < 4·p
(``pipeline.micro_batches_per_stage``). A pipeline's receive waits are its bubble, not
"communication not hidden behind compute", and its stages are not stragglers of each
other: the diagnosis drops those findings for stage ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    PipelineSummary,
    RankSummary,
    Severity,
    StepBreakdown,
    by_rank,
)
from gpudiag.analysis.model.kinds import PipelineSchedule
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.run.collectives import Collectives
from gpudiag.config import PipelineRules

# Explicit point-to-point only: a bare ``SendRecv`` kernel is also how NCCL runs all-to-all.
P2P = ("send", "recv")


def ideal_bubble(p: int, m: int) -> float:
    """(p − 1) / (m + p − 1): GPipe/1F1B idle share of p stages and m micro-batches."""
    return (p - 1) / (m + p - 1) if m + p > 1 else 0.0


def _p2p_share(c: Collectives) -> float:
    return sum(t in P2P for t in c.type) / len(c.type)


def schedule_of(first: Collectives, p: int, m: int) -> PipelineSchedule:
    """``gpipe``, ``1f1b`` or ``unknown`` from the first stage's sends and receives."""
    w = min(p - 1, m)
    expected: dict[PipelineSchedule, str] = {
        "gpipe": "s" * m + "r" * m,
        "1f1b": "s" * w + "sr" * (m - w) + "r" * w,
    }
    votes: dict[PipelineSchedule, int] = {}
    for s in sorted(set(first.step.tolist()) - {-1}):
        idx = np.flatnonzero(first.step == s)
        idx = idx[np.argsort(first.start[idx], kind="stable")]
        seq = "".join(
            "s" if first.type[i] == "send" else "r" for i in idx.tolist() if first.type[i] in P2P
        )
        name: PipelineSchedule = next((k for k, v in expected.items() if v == seq), "unknown")
        votes[name] = votes.get(name, 0) + 1
    return max(votes, key=lambda k: votes[k]) if votes else "unknown"


def find_pipeline(
    colls: Sequence[Collectives],
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    idle_ratio_max: float,
    rules: PipelineRules,
) -> tuple[PipelineSummary | None, list[Finding]]:
    """The pipeline section of a Diagnosis and its finding; (None, []) when not a pipeline."""
    stages = [c for c in colls if c.type and _p2p_share(c) >= rules.min_p2p_share]
    if len(stages) < 2:
        return None, []
    stages.sort(key=lambda c: c.rank)
    first = stages[0]
    per_step = []
    for s in sorted(set(first.step.tolist()) - {-1}) or [-1]:
        in_step = first.step == s
        sends = np.asarray([t == "send" for t in first.type]) & in_step
        per_step.append(
            int(np.count_nonzero(sends))
            if any(t == "send" for t in first.type)
            else int(np.count_nonzero(in_step)) // 2
        )
    m = max(1, round(float(nputil.median(per_step))))
    p = len(stages)
    stage_ranks = sorted(c.rank for c in stages)
    summaries = {r.rank: r for r in ranks if r.rank in stage_ranks}
    mine = by_rank(s for s in steps if s.rank in summaries)
    bubbles = {r: _bubble(summaries[r], mine.get(r, [])) for r in summaries}
    measured = float(np.mean(list(bubbles.values()))) if bubbles else 0.0
    schedule = schedule_of(first, p, m)
    ideal = ideal_bubble(p, m)
    target_m = rules.micro_batches_per_stage * p
    compute = {
        r: float(np.mean([s.compute_ns for s in mine.get(r, [])] or [0.0])) for r in summaries
    }
    section = PipelineSummary(
        stages=p,
        stage_ranks=stage_ranks,
        micro_batches=m,
        bubble_ratio=measured,
        ideal_bubble_ratio=ideal,
        bubble_ratio_at_target=ideal_bubble(p, max(m, target_m)),
        target_micro_batches=target_m,
        stage_compute_ratio={str(r): summaries[r].shares.compute for r in summaries},
        schedule=schedule,
        stage_bubble_ratio={str(r): v for r, v in bubbles.items()},
    )
    excess = measured - ideal if schedule != "unknown" else 0.0
    within = max(measured, ideal) <= idle_ratio_max and excess <= rules.imbalance_margin
    why = []
    if m < target_m:
        why.append(
            f"{m} micro-batches for {p} stages leave a schedule bubble of {ideal:.0%}; "
            f"with {target_m} it would be {ideal_bubble(p, target_m):.0%}"
        )
    if schedule == "unknown":
        why.append(
            "the schedule is neither GPipe nor 1F1B, so the measured bubble is not "
            "compared with a schedule's"
        )
    elif excess > rules.imbalance_margin:
        why.append(_excess_cause(excess, compute, rules))
    if within:
        # recognised at any bubble size: its receive waits are the bubble, said once
        why.insert(
            0,
            f"within the {idle_ratio_max:.0%} idle threshold: the stages' receive "
            "waits are this bubble, not communication left unhidden",
        )
    finding = Finding(
        kind=FindingKind.PIPELINE_BUBBLE,
        severity=Severity.INFO if within else Severity.WARNING,
        message=_message(section, bubbles) + ("; " + "; ".join(why) if why else ""),
        ranks=stage_ranks,
        metrics=section,
    )
    return section, [finding]


def _message(pipe: PipelineSummary, bubbles: dict[int, float]) -> str:
    """What the finding says first: stages, schedule, m, measured and schedule bubble."""
    name = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(pipe.schedule, "unknown schedule")
    stages_text = ", ".join(f"rank {r}: {v:.0%}" for r, v in bubbles.items())
    return (
        f"pipeline of {pipe.stages} stages ({name}, m = {pipe.micro_batches}): "
        f"{pipe.bubble_ratio:.0%} of step time blocked waiting for the neighbouring stage "
        f"({stages_text}); the schedule's bubble (p−1)/(m+p−1) is "
        f"{pipe.ideal_bubble_ratio:.0%}"
    )


def _bubble(rank: RankSummary, steps: Sequence[StepBreakdown]) -> float:
    """A stage's measured bubble: receive wait ÷ step time (its idle ratio without it)."""
    total = sum(s.duration_ns for s in steps)
    wait = rank.evidence.p2p_recv_wait_ns
    if wait is None or not total:
        return rank.idle_ratio
    return float(wait) / total


def _excess_cause(excess: float, compute: dict[int, float], rules: PipelineRules) -> str:
    """Why the stages wait more than the schedule says: imbalance, else slow transfers."""
    heavy = max(compute, key=lambda r: compute[r])
    light = min(compute, key=lambda r: compute[r])
    if compute[light] > 0 and compute[heavy] / compute[light] > 1 + rules.imbalance_margin:
        return (
            f"the stages wait {excess:.0%} of the step beyond the schedule's bubble: "
            f"unbalanced stages — rank {heavy} computes {duration(compute[heavy], 'human')} a "
            f"step against {duration(compute[light], 'human')} on rank {light}; move layers "
            "off the heavy stage"
        )
    return (
        f"the stages wait {excess:.0%} of the step beyond the schedule's bubble with "
        "balanced compute: slow point-to-point transfers or host overhead between "
        "micro-batches"
    )
