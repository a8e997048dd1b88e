"""Pipeline parallelism: finds point-to-point stages, compares measured and schedule bubbles.

A run is treated as a pipeline when at least two ranks communicate (almost) only by
point-to-point ``send``/``recv`` (≥ 80% of their collectives), as the collective args of
the trace name them — a bare ``SendRecv`` kernel is not enough, since NCCL runs all-to-all
with the same kernels. Then, with p = the number
of such ranks (analyse every stage's trace together) and m = the micro-batches per step
(forward sends per step of the first stage):

* the **measured bubble** of a stage is its idle ratio (1 − compute ÷ step time), averaged
  over the stages;
* the **schedule's bubble** for GPipe and 1F1B is (p − 1) / (m + p − 1).

A ``pipeline_bubble`` finding is raised when the measured bubble exceeds the idle threshold;
its message says whether more micro-batches would help (m < 4·p, the usual rule) or the
stages are unbalanced (measured well above the schedule's bubble: compare stage compute).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpudiag.analysis.collectives import Collectives
from gpudiag.analysis.model import Finding, RankSummary

# Explicit point-to-point only: a bare ``SendRecv`` kernel is also how NCCL runs all-to-all.
P2P = ("send", "recv")
MIN_P2P_SHARE = 0.8
MICROBATCHES_PER_STAGE = 4


def ideal_bubble(p: int, m: int) -> float:
    """(p − 1) / (m + p − 1): GPipe/1F1B idle share of p stages and m micro-batches."""
    return (p - 1) / (m + p - 1) if m + p > 1 else 0.0


def analyse_pipeline(
    colls: Sequence[Collectives], ranks: Sequence[RankSummary], idle_ratio_max: float
) -> tuple[dict[str, Any], list[Finding]]:
    """The pipeline section of a Diagnosis and its finding; ({}, []) when not a pipeline."""
    stages = []
    for c in colls:
        if not c.type:
            continue
        share = sum(t in P2P for t in c.type) / len(c.type)
        if share >= MIN_P2P_SHARE:
            stages.append(c)
    if len(stages) < 2:
        return {}, []
    stages.sort(key=lambda c: c.rank)
    first = stages[0]
    steps = sorted(set(first.step.tolist()) - {-1}) or [-1]
    sends = [t == "send" for t in first.type]
    per_step = []
    for s in steps:
        in_step = first.step == s
        n_send = int(np.count_nonzero(np.asarray(sends) & in_step))
        n_p2p = int(np.count_nonzero(in_step))
        per_step.append(n_send if any(sends) else n_p2p // 2)  # recv-only first stage
    m = max(1, round(float(np.median(per_step))))
    p = len(stages)
    stage_ranks = {c.rank for c in stages}
    summaries = [r for r in ranks if r.rank in stage_ranks]
    measured = float(np.mean([r.idle_ratio for r in summaries])) if summaries else 0.0
    ideal = ideal_bubble(p, m)
    target_m = MICROBATCHES_PER_STAGE * p
    compute = {str(r.rank): r.shares.compute for r in summaries}
    section = {
        "stages": p,
        "stage_ranks": sorted(stage_ranks),
        "micro_batches": m,
        "bubble_ratio": measured,
        "ideal_bubble_ratio": ideal,
        "bubble_ratio_at_target": ideal_bubble(p, max(m, target_m)),
        "target_micro_batches": target_m,
        "stage_compute_ratio": compute,
    }
    findings: list[Finding] = []
    if measured > idle_ratio_max:
        why = []
        if m < target_m:
            why.append(f"{m} micro-batches for {p} stages leave a schedule bubble of "
                       f"{ideal:.0%}; with {target_m} it would be "
                       f"{ideal_bubble(p, target_m):.0%}")  # fmt: skip
        if measured > ideal + 0.10:
            why.append(
                f"the stages idle {measured - ideal:.0%} of the step beyond the schedule's "
                "bubble: unbalanced stages or slow point-to-point transfers"
            )
        findings.append(Finding(
            kind="pipeline_bubble", severity="warning",
            message=(f"pipeline of {p} stages: {measured:.0%} of step time idle "
                     f"(schedule bubble (p−1)/(m+p−1) = {ideal:.0%} for m = {m})"
                     + ("; " + "; ".join(why) if why else "")),
            ranks=sorted(stage_ranks),
            metrics=section,
        ))  # fmt: skip
    return section, findings
