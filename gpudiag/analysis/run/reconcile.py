"""Cross-rank reconciliation of findings once every rank is analysed.

A finding one analysis makes can be explained by another: a comm-bound rank that mostly
waits for a straggler, host-bound time that a pipeline bubble or a host-side straggler
explains. These functions adjust or drop such findings; they also add the findings and
notes about what the inputs lacked, and leave the warm-up steps out of the statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.findings.causes import cpu_host_cause, host_cause
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    Mode,
    PipelineSummary,
    RankSummary,
    RunSummary,
    Severity,
    StepBreakdown,
    StepSource,
)
from gpudiag.analysis.model.metrics import (
    CommBoundMetrics,
    HostMetrics,
    ShareMetrics,
    SourceMissingMetrics,
    WarmupMetrics,
)
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.rank.analyse import RankResult
from gpudiag.analysis.reading.steady import warmup_steps
from gpudiag.analysis.run.collectives import (
    SyncByStep,
)
from gpudiag.config import Thresholds


def without_warmup(
    results: list[RankResult], th: Thresholds
) -> tuple[list[RankResult], list[Finding]]:
    """The results without their warm-up steps (analysis/reading/steady.py), and the finding."""
    warm = warmup_steps([s for r in results for s in r.steps], th.steady)
    if not warm:
        return results, []
    kept = [_without_steps(r, warm) for r in results]
    rest = [s.duration_ns for r in kept for s in r.steps]
    median = float(nputil.median(rest)) if rest else 0.0
    nums = sorted(warm)
    took = ", ".join(duration(warm[n], "message") for n in nums[:4]) + (
        "…" if len(nums) > 4 else ""
    )
    which = f"step {nums[0]}" if len(nums) == 1 else f"steps {nums[0]}–{nums[-1]}"
    ratio = max(warm.values()) / median if median else 0.0
    msg = (
        f"{which}: {took}, warm-up ({ratio:.0f}× the median of the steps after it), left "
        "out of the statistics (--include-warmup keeps it)"
    )
    finding = Finding(
        FindingKind.WARMUP,
        Severity.INFO,
        msg,
        ranks=sorted(r.rank for r in results),
        steps=nums,
        metrics=WarmupMetrics({str(n): round(warm[n]) for n in nums}, round(median)),
    )
    return kept, [finding]


def _without_steps(r: RankResult, warm: Mapping[int, float]) -> RankResult:
    """``r`` without the steps numbered in ``warm``, its per-step evidence cut alike.

    A rank's per-step evidence lists run over the steps the rank analysed, which the
    warm-up cut (a run-level decision, made once every rank is in) shortens; the totals
    derived from a per-step list are recomputed from the kept steps, so a stage's
    receive wait and its step time cover the same steps. The rank's collectives in those
    steps go too: waits for the last rank are matched over the analysed steps only.
    """
    mask = [s.step not in warm for s in r.steps]
    ev = r.evidence
    change: dict[str, object] = {}
    if ev.p2p_recv_wait_ns_per_step is not None and len(ev.p2p_recv_wait_ns_per_step) == len(mask):
        per = [w for w, k in zip(ev.p2p_recv_wait_ns_per_step, mask, strict=True) if k]
        change |= {"p2p_recv_wait_ns_per_step": per, "p2p_recv_wait_ns": sum(per)}
    if ev.gpu_metrics_per_step is not None:
        change["gpu_metrics_per_step"] = {
            key: [v for v, k in zip(vals, mask, strict=True) if k]
            for key, vals in ev.gpu_metrics_per_step.items()
            if len(vals) == len(mask)
        }
    colls = r.collectives
    if colls is not None and len(colls.type):
        # the warm-up steps' collectives go with their steps: who waited for whom, and how
        # long, is read from the analysed steps only (issue 29)
        keep = ~np.isin(colls.step, np.fromiter(warm, np.int64, len(warm)))
        if not keep.all():
            colls = dataclasses.replace(
                colls,
                type=[t for t, k in zip(colls.type, keep.tolist(), strict=True) if k],
                key=colls.key[keep],
                nbytes=colls.nbytes[keep],
                start=colls.start[keep],
                dur=colls.dur[keep],
                step=colls.step[keep],
                dtype=[t for t, k in zip(colls.dtype, keep.tolist(), strict=True) if k]
                if len(colls.dtype) == len(keep)
                else colls.dtype,
            )
    return dataclasses.replace(
        r,
        steps=[s for s, k in zip(r.steps, mask, strict=True) if k],
        evidence=dataclasses.replace(ev, **change) if change else ev,  # type: ignore[arg-type]
        collectives=colls,
    )


def comm_wait_for_stragglers(
    findings: list[Finding],
    steps: Sequence[StepBreakdown],
    sync: SyncByStep,
    th: Thresholds | None = None,
) -> list[Finding]:
    """Say so when a comm-bound rank mostly waits for other ranks rather than the network.

    With a straggler named, the straggler finding carries the lost time and this one drops
    to ``info``; without one (the ranks take turns being late), the waiting is load
    imbalance between ranks, still lost time, and the finding keeps its severity.
    """
    if not sync:
        return findings
    slow = [f.ranks[0] for f in findings if f.kind == FindingKind.STRAGGLER and f.ranks]
    limit = (th or Thresholds()).stragglers.sync_wait_share
    out = []
    for f in findings:
        if f.kind == FindingKind.COMM_BOUND:
            flagged = set(f.ranks)  # a set: thousands of ranks × steps
            wait = sum(s.comm_wait_ns for s in steps if s.rank in flagged)
            # sync waits span whole collectives (hidden parts too): cap at the exposed wait
            waited = min(sum(v for (r, _), v in sync.items() if r in flagged), wait)
            share = waited / wait if wait else 0.0
            metrics = dataclasses.replace(f.metrics_as(CommBoundMetrics), sync_wait_share=share)
            if share > limit and slow:
                who = ", ".join(map(str, slow))
                f = dataclasses.replace(
                    f,
                    severity=Severity.INFO,
                    message=f"{f.message}; {share:.0%} of it is waiting for the "
                    f"straggler (rank {who}), not transfer",
                    metrics=metrics,
                )
            elif share > limit:
                f = dataclasses.replace(
                    f,
                    message=f"{f.message}; {share:.0%} of it is waiting for other ranks to "
                    "reach the collective (load imbalance between ranks), not transfer",
                    metrics=metrics,
                )
            else:
                f = dataclasses.replace(f, metrics=metrics)
        out.append(f)
    return out


def explained_by_pipeline(
    findings: list[Finding], pipe: PipelineSummary, ranks: Sequence[RankSummary], th: Thresholds
) -> list[Finding]:
    """Drop "host-bound" for stages whose idle time the pipeline schedule explains."""
    limit = pipe.ideal_bubble_ratio + th.pipeline.imbalance_margin
    explained = {r.rank for r in ranks if r.rank in pipe.stage_ranks and r.shares.other <= limit}
    return drop_host_bound(findings, explained)


def with_host_cause(
    findings: list[Finding],
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    th: Thresholds,
) -> list[Finding]:
    """Name the host-side cause of each host-bound finding (analysis/causes.py).

    GPU traces: the cause the runtime calls, gaps and operators show. CPU traces: none
    (``unknown``) when the step's thread runs no operator in the analysed steps.
    """
    gpu = {r.rank for r in ranks if r.mode == Mode.GPU}
    cpu = {r.rank for r in ranks if r.mode == Mode.CPU}
    out = []
    for f in findings:
        if f.kind != FindingKind.HOST_BOUND or not f.ranks:
            out.append(f)
            continue
        cause = (
            host_cause(ranks, steps, f.ranks, th.advice)
            if set(f.ranks) <= gpu
            else cpu_host_cause(ranks, f.ranks)
            if set(f.ranks) <= cpu
            else None
        )
        if cause is not None:
            msg = f.message
            if cause.text:
                head = msg.split(": host overhead, kernel-launch gaps", 1)[0]
                head = head.split(": Python/host overhead outside operators", 1)[0]
                msg = f"{head}: {cause.label} — {cause.text}"
            share = f.metrics_as(ShareMetrics)
            metrics = HostMetrics(share.per_rank, share.threshold, cause=cause)
            f = dataclasses.replace(f, message=msg, metrics=metrics)
        out.append(f)
    return out


def drop_host_bound(findings: list[Finding], explained: set[int]) -> list[Finding]:
    """Remove ranks whose "other" time a more specific finding explains from host_bound.

    A host-side straggler (a rank that sleeps, collects garbage or checkpoints) and a
    pipeline stage's bubble both show as "other": the generic launch-overhead remedy
    would send the user the wrong way.
    """
    return drop_ranks(findings, explained, FindingKind.HOST_BOUND)


def drop_ranks(findings: list[Finding], explained: set[int], kind: FindingKind) -> list[Finding]:
    """Remove ``explained`` ranks from the findings of one kind (and findings left empty)."""
    if not explained:
        return findings
    out = []
    for f in findings:
        if f.kind == kind:
            left = [r for r in f.ranks if r not in explained]
            if not left:
                continue
            if len(left) != len(f.ranks):
                m = f.metrics_as(ShareMetrics)
                per = {k: v for k, v in m.per_rank.items() if int(k) in left}
                f = dataclasses.replace(f, ranks=left, metrics=dataclasses.replace(m, per_rank=per))
        out.append(f)
    return out


def source_findings(results: Sequence[RankResult], run: RunSummary) -> list[Finding]:
    """What the inputs lacked: step markers, GPU activity, ranks, a complete last step."""
    out: list[Finding] = []
    by_note: dict[str, list[int]] = {}
    for r in results:
        if not r.step_source.is_marked:
            by_note.setdefault(r.step_note or f"steps from {r.step_source}", []).append(r.rank)
    for note, ranks in by_note.items():
        out.append(
            Finding(
                FindingKind.SOURCE_MISSING,
                Severity.INFO,
                note,
                ranks=ranks,
                metrics=SourceMissingMetrics("steps"),
            )
        )
    cpu_with_gpus = [r.rank for r in results if r.mode == Mode.CPU and r.meta.devices]
    if cpu_with_gpus:
        out.append(
            Finding(
                FindingKind.SOURCE_MISSING,
                Severity.WARNING,
                "the trace lists GPUs but holds no GPU activity: classified from CPU threads "
                "(profile with ProfilerActivity.CUDA to see the GPU)",
                ranks=cpu_with_gpus,
                metrics=SourceMissingMetrics("gpu_events"),
            )
        )
    truncated = [(r.rank, r.truncated_step) for r in results if r.truncated_step is not None]
    if truncated:
        out.append(
            Finding(
                FindingKind.TRUNCATED_STEP,
                Severity.INFO,
                "the last profiled step was cut off (far fewer GPU ops than the step before) "
                "and is left out of the statistics",
                ranks=[r for r, _ in truncated],
                steps=sorted({s for _, s in truncated if s is not None}),
            )
        )
    if run.world_size and run.world_size > run.ranks:
        present = sorted(r.rank for r in results)
        out.append(
            Finding(
                FindingKind.SOURCE_MISSING,
                Severity.INFO,
                f"{run.ranks} of {run.world_size} ranks "
                f"{'has' if run.ranks == 1 else 'have'} traces ({_span(present)}); "
                "cross-rank findings cover only those",
                ranks=present,
                metrics=SourceMissingMetrics("ranks", world_size=run.world_size),
            )
        )
    return out


def step_range_notes(results: Sequence[RankResult]) -> list[str]:
    """Where automatically found steps came from: once per distinct note, with the ranks."""
    by_note: dict[str, list[int]] = {}
    for r in results:
        if r.step_source == StepSource.USER_RANGE and r.step_note:
            by_note.setdefault(r.step_note, []).append(r.rank)
    if len(by_note) == 1:
        return list(by_note)
    return [f"{_span(sorted(ranks))}: {note}" for note, ranks in by_note.items()]


def _span(ranks: list[int]) -> str:
    return words.ranks(ranks)
