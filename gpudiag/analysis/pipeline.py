"""Pipeline parallelism: finds point-to-point stages, compares measured and schedule bubbles.

A run is treated as a pipeline when at least two ranks communicate (almost) only by
point-to-point ``send``/``recv`` (≥ ``pipeline.min_p2p_share``, 80%, of their
collectives), as the collective args of the trace name them — a bare ``SendRecv`` kernel
is not enough, since NCCL runs all-to-all with the same kernels. Then, with p = the number
of such ranks (analyse every stage's trace together) and m = the micro-batches per step
(forward sends per step of the first stage):

* the **measured bubble** of a stage is its idle ratio (1 − compute ÷ step time), averaged
  over the stages;
* the **schedule's bubble** for GPipe and 1F1B is (p − 1) / (m + p − 1).

A ``pipeline_bubble`` finding is raised when the measured bubble exceeds the idle threshold;
its message says whether more micro-batches would help (m < 4·p, the usual rule:
``pipeline.micro_batches_per_stage``) or the stages are unbalanced (measured above the
schedule's bubble by more than ``pipeline.imbalance_margin``: compare stage compute).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from gpudiag.analysis.collectives import Collectives
from gpudiag.analysis.model import Finding, FindingKind, PipelineSummary, RankSummary, Severity
from gpudiag.config import PipelineRules

# Explicit point-to-point only: a bare ``SendRecv`` kernel is also how NCCL runs all-to-all.
P2P = ("send", "recv")


def ideal_bubble(p: int, m: int) -> float:
    """(p − 1) / (m + p − 1): GPipe/1F1B idle share of p stages and m micro-batches."""
    return (p - 1) / (m + p - 1) if m + p > 1 else 0.0


def analyse_pipeline(
    colls: Sequence[Collectives],
    ranks: Sequence[RankSummary],
    idle_ratio_max: float,
    rules: PipelineRules,
) -> tuple[PipelineSummary | None, list[Finding]]:
    """The pipeline section of a Diagnosis and its finding; (None, []) when not a pipeline."""
    stages = []
    for c in colls:
        if not c.type:
            continue
        share = sum(t in P2P for t in c.type) / len(c.type)
        if share >= rules.min_p2p_share:
            stages.append(c)
    if len(stages) < 2:
        return None, []
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
    target_m = rules.micro_batches_per_stage * p
    section = PipelineSummary(
        stages=p,
        stage_ranks=sorted(stage_ranks),
        micro_batches=m,
        bubble_ratio=measured,
        ideal_bubble_ratio=ideal,
        bubble_ratio_at_target=ideal_bubble(p, max(m, target_m)),
        target_micro_batches=target_m,
        stage_compute_ratio={str(r.rank): r.shares.compute for r in summaries},
    )
    findings: list[Finding] = []
    if measured > idle_ratio_max:
        why = []
        if m < target_m:
            why.append(f"{m} micro-batches for {p} stages leave a schedule bubble of "
                       f"{ideal:.0%}; with {target_m} it would be "
                       f"{ideal_bubble(p, target_m):.0%}")  # fmt: skip
        if measured > ideal + rules.imbalance_margin:
            why.append(
                f"the stages idle {measured - ideal:.0%} of the step beyond the schedule's "
                "bubble: unbalanced stages or slow point-to-point transfers"
            )
        findings.append(Finding(
            kind=FindingKind.PIPELINE_BUBBLE, severity=Severity.WARNING,
            message=(f"pipeline of {p} stages: {measured:.0%} of step time idle "
                     f"(schedule bubble (p−1)/(m+p−1) = {ideal:.0%} for m = {m})"
                     + ("; " + "; ".join(why) if why else "")),
            ranks=sorted(stage_ranks),
            metrics=asdict(section),
        ))  # fmt: skip
    return section, findings
