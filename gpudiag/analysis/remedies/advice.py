"""Rules mapping Findings to Recommendations; each cites its evidence and the time it could recover.

No remedy is proposed without a finding behind it, and each carries the numbers that
triggered it. Estimated gains are first-order, per step on the what-if's statistic (the
*median* step, the headline's), and stated as upper bounds. One step model
(:mod:`gpudiag.analysis.run.whatif`): where the what-if models the change a remedy makes,
the remedy's gain is the what-if's saving on that step, and every ratio is over it (a
change that saves only on the mean step, such as a loader that runs dry in a minority of
the steps, shows in the what-if's ``on_mean``: the loader remedy then quotes that step's
saving, with ``evidence.gain_statistic`` ``mean`` and its ratio over the mean step):

* data-wait → "no data wait" (else the worst flagged rank's mean data-wait per step: a
  synchronous step waits for the slowest rank's batch; the mean, since a loader that runs
  dry every few steps makes few steps wait long);
* exposed communication → only its transfer part counts: comm-wait minus the
  synchronisation wait of matched collectives (waiting for a slower rank is the
  straggler's cost, not the network's); remedies are omitted when under
  ``advice.min_transfer_share`` (a tenth) of the wait is transfer. Overlap: the exposed
  transfer per step, as the what-if's "comm fully overlapped" measures it; gradient
  accumulation over k micro-batches with ``no_sync``: communication per optimizer step
  ÷ k, i.e. a gain of comm-wait × (1 − 1/k) per micro-batch
  (k = ``advice.accumulation_micro_batches``, 4, shown); compression to fp16/bf16: half
  the bytes, so up to half the comm-wait when bandwidth-bound;
* straggler → "straggler at median speed": the step time recovered if it ran at the
  other ranks' speed;
* host-bound → up to the named cause's own time per step (``cause.ns_per_step``,
  analysis/causes.py), never more than the "other" time; no gain when no cause is named
  (host work the trace does not show cannot be promised back: the detail says what to
  capture). CUDA graphs and fusion are proposed only
  with evidence of launch overhead: at least ``advice.launch_bound_share`` (half) of the
  "other" time spent in GPU-idle gaps shorter than ``advice.launch_gap_ns`` (100 µs) while
  the host is inside the step; copies alone (no compute beside them) for half of it get
  the copy remedies (:mod:`gpudiag.analysis.remedies.copies`: overlap, gaining at most the
  compute per step; pinning only for pageable copies; moving less when the copies dwarf
  the compute); otherwise the remedy is to find the host work
  (syncs, Python, logging) behind the long gaps;
* compute-bound (information) → no gain is estimated: fusion when elementwise, reduction
  and normalisation kernels hold ``advice.fusion_share`` of compute (unless the shapes
  measured their bytes), bf16/TF32 when GEMMs hold ``advice.gemm_share`` of it and
  ``advice.fp32_gemm_share`` of their time is fp32 (only where the device's peak is unknown);
* below the peak (information, any compute share) → precision, fusion, bigger GEMMs,
  channels-last, each gaining the time its families spend above what their work needs at
  the device's peak, when that is at least ``advice.min_gain_share`` of the median step
  (:mod:`~gpudiag.analysis.remedies.efficiency`); a low-bandwidth bucket → the link
  topology, gaining its transfer time above the link's peak, at most the exposed wait;
* pipeline bubble → the schedule bubble saved by ``pipeline.micro_batches_per_stage`` (4)
  micro-batches per stage: ((p−1)/(m+p−1) − (p−1)/(4p+p−1)) × step time.

The rules are one table, :data:`RULES`: finding kind → remedies, each with its text, the
condition under which it applies, its evidence and its gain function.

Remedies that act on the same time overlap — the communication remedies all act on the
same exposed transfer — so their gains are not additive: each recommendation lists the
others it overlaps with (``overlaps_with``), and ``what_if.if_all_ns`` gives the step time
with every modelled change at once.

The what-if step times are modelled in :mod:`gpudiag.analysis.run.whatif`, the min/max
across ranks in :mod:`gpudiag.analysis.run.spread`.
The rows of the larger kinds are modules of their own: :mod:`~gpudiag.analysis.remedies.comm`,
:mod:`~gpudiag.analysis.remedies.host`, :mod:`~gpudiag.analysis.remedies.compute` and
:mod:`~gpudiag.analysis.remedies.ended`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import cast

from gpudiag.analysis.model.diagnosis import (
    Cause,
    Finding,
    FindingKind,
    Mode,
    RankSummary,
    Recommendation,
    RunSummary,
    Severity,
    StepBreakdown,
    WhatIf,
)
from gpudiag.analysis.model.metrics import (
    JsonObject,
    LateArrivalMetrics,
    PipelineSummary,
    ShareMetrics,
    StragglerMetrics,
)
from gpudiag.analysis.remedies.comm import COMM
from gpudiag.analysis.remedies.compute import COMPUTE
from gpudiag.analysis.remedies.copies import MOVE_LESS as COPY_LESS
from gpudiag.analysis.remedies.copies import OVERLAP as COPY_OVERLAP
from gpudiag.analysis.remedies.efficiency import BELOW_PEAK, TOPOLOGY
from gpudiag.analysis.remedies.ended import FAILURE as FAILURE_REMEDY
from gpudiag.analysis.remedies.ended import HANG as HANG_REMEDY
from gpudiag.analysis.remedies.ended import MISMATCH as MISMATCH_REMEDY
from gpudiag.analysis.remedies.host import HOST
from gpudiag.analysis.remedies.remedy import Context, Remedy
from gpudiag.analysis.remedies.remedy import const as _const
from gpudiag.analysis.stragglers.busy_host import busy_host_words
from gpudiag.config import AdviceRules

# ---- data ----


def _single_loader(f: Finding, c: Context) -> bool:
    return any("_SingleProcessDataLoaderIter" in (e.data_range or "") for e in c.evidence(f.ranks))


def _data_detail(f: Finding, c: Context) -> str:
    gpu = c.run.mode == Mode.GPU
    if _single_loader(f, c):
        return (
            "The loader runs inside the training process (num_workers=0): set "
            "DataLoader(num_workers=4..8 per GPU, persistent_workers=True"
            + (", pin_memory=True" if gpu else "")
            + ") so batches are prepared in "
            "parallel with the step."
        )
    return (
        "The loader's workers do not keep up: raise num_workers and prefetch_factor, keep "
        "persistent_workers=True"
        + (", use pin_memory=True with non_blocking copies" if gpu else "")
        + "; if the workers are already busy, the storage or decoding is the limit "
        "(cache the dataset, use a faster format, or decode on the GPU with NVIDIA "
        "DALI or torchvision.io's GPU decoders)."
    )


def _data_gain(f: Finding, c: Context) -> int | None:
    # the what-if's "no data wait" (its median step: one story with the what-if; its mean
    # step where only that saves: a loader running dry in a minority of the steps); without
    # a what-if, the worst flagged rank's mean data-wait per step
    gain = c.what_if_gain("if_no_data_wait_ns", mean_fallback=True)
    return (gain or None) if gain is not None else c.median_part(f.ranks, "data_wait_ns", "mean")


DATA = Remedy(
    id=_const("dataloader"),
    title=_const("Feed the step faster: DataLoader workers, pinning and prefetch"),
    detail=_data_detail,
    gain=_data_gain,
    evidence=lambda f, c: {
        "data_wait_ns_per_step": _data_gain(f, c),
        "ranks": f.ranks,
        "per_rank_share": f.metrics_as(ShareMetrics).per_rank,
        "single_process_loader": _single_loader(f, c),
        # the what-if step the gain is on: "mean" where the median step saves nothing
        **({"gain_statistic": "mean"} if c.gain_on_mean("if_no_data_wait_ns") else {}),
    },
)


# ---- stragglers ----

_STRAGGLER_HINTS = {
    Cause.DATA: "its input pipeline is slower: check its data shard, storage and loader "
    "workers; if the slow rank changes between epochs, balance sample sizes or "
    "sequence lengths across ranks.",
    Cause.COMPUTE: "it takes longer for the same work: check uneven sharding, its GPU's "
    "clocks and temperature (nvidia-smi -q -d CLOCK,TEMPERATURE) and other "
    "processes on that GPU.",
    Cause.HARDWARE: "its GPU is being slowed by the driver (thermal, power or hardware "
    "slowdown) or clocks low: move the job off that GPU or node and check its "
    "cooling and power.",
    Cause.HOST: "it spends more time on the host outside compute and data: garbage collection "
    "(gc.freeze() after setup), logging or checkpointing on that rank only, or "
    "CPU contention (bind ranks to cores/NUMA nodes).",
    Cause.UNKNOWN: "profile a window that contains its slow steps to see which part grows "
    "(gpudiag attach --run RUN_DIR --profile-next N).",
}


# a CPU job's compute is the host's: no GPU to check
_CPU_COMPUTE = (
    "it takes longer for the same work: check uneven sharding, the CPU cores it "
    "runs on (frequency, other processes on them) and its thread count "
    "(OMP_NUM_THREADS, torch.set_num_threads) against the others'."
)


def _cause(f: Finding) -> Cause:
    return f.cause or Cause.UNKNOWN


def _busy(f: Finding) -> dict[str, float] | None:
    """The recorded host contention that likely explains the straggler, if any."""
    return getattr(f.metrics, "host_contention", None)


def _straggler_title(f: Finding, c: Context) -> str:
    if _busy(f):
        return f"Re-run on a quiet host before investigating rank {f.ranks[0]}"
    return f"Investigate rank {f.ranks[0]} ({_cause(f)})"


def _straggler_detail(f: Finding, c: Context) -> str:
    busy = _busy(f)
    if busy:
        words = busy_host_words(busy)
        return (
            f"{words[:1].upper()}{words[1:]}: on a busy host the rank that falls "
            f"behind is the one they took CPU from, so rank {f.ranks[0]} may be no "
            "straggler of the job's own. Re-run with the host to the job (or pin each "
            "rank to its own cores: taskset, numactl) and see whether it still lags."
        )
    if c.run.mode == Mode.CPU and _cause(f) == Cause.COMPUTE:
        return f"Rank {f.ranks[0]} holds every other rank back: {_CPU_COMPUTE}"
    return f"Rank {f.ranks[0]} holds every other rank back: {_STRAGGLER_HINTS[_cause(f)]}"


def _excess(f: Finding) -> int:
    m = f.metrics
    return m.median_excess_ns if isinstance(m, (StragglerMetrics, LateArrivalMetrics)) else 0


def _straggler_gain(f: Finding, c: Context) -> int | None:
    """The what-if's "straggler at median speed", else the straggler's typical excess."""
    gain = c.what_if_gain("if_straggler_at_median_speed_ns")
    m = f.metrics
    if gain is None and isinstance(m, StragglerMetrics) and m.step_time_ns_mean:
        return (m.step_time_ns_mean - m.step_time_ns_if_median_speed) or None
    return (gain or None) if gain is not None else _excess(f)


STRAGGLER = Remedy(
    id=lambda f, c: (
        f"quiet-host-rank-{f.ranks[0]}" if _busy(f) else f"investigate-rank-{f.ranks[0]}"
    ),
    title=_straggler_title,
    detail=_straggler_detail,
    gain=lambda f, c: _straggler_gain(f, c) if f.persistent else None,
    evidence=lambda f, c: {
        "rank": f.ranks[0],
        "cause": _cause(f),
        "wait_caused_ns": f.wait_caused_ns,
        "persistent": f.persistent,
        "steps": f.steps,
        "median_excess_ns": _excess(f),
        **({"host_contention": _busy(f)} if _busy(f) else {}),
    },
    applies=lambda f, c: bool(f.ranks),
)


# ---- pipeline ----


def _pipe(f: Finding) -> PipelineSummary:
    return f.metrics_as(PipelineSummary)


def _pipe_gain(f: Finding, c: Context) -> int | None:
    pm = _pipe(f)
    return round(max(0.0, pm.ideal_bubble_ratio - pm.bubble_ratio_at_target) * c.step_ns) or None


def _pipe_title(f: Finding, _c: Context) -> str:
    pm = _pipe(f)
    return (
        f"Use at least {pm.target_micro_batches} micro-batches per step "
        f"({pm.target_micro_batches // pm.stages}× the {pm.stages} stages) and a 1F1B "
        "schedule"
    )


def _pipe_detail(f: Finding, _c: Context) -> str:
    pm = _pipe(f)
    return (
        f"With m = {pm.micro_batches} the schedule alone idles "
        f"{pm.ideal_bubble_ratio:.0%} of each stage; with "
        f"m = {pm.target_micro_batches} it would idle "
        f"{pm.bubble_ratio_at_target:.0%}. Interleaved 1F1B (virtual stages) "
        "cuts the bubble further; if the measured bubble "
        f"({pm.bubble_ratio:.0%}) stays above the schedule's, balance layers "
        "across stages."
    )


PIPELINE = Remedy(
    id=_const("pipeline-microbatches"),
    title=_pipe_title,
    detail=_pipe_detail,
    gain=_pipe_gain,
    evidence=lambda f, c: f.metrics.to_json(),
    # a bubble within the threshold: worth it only while more micro-batches would shrink it
    applies=lambda f, c: f.severity != Severity.INFO or _pipe_gain(f, c) is not None,
)


def _gain_base(ctx: Context, evidence: Mapping[str, object]) -> int:
    """The step a gain's ratio is over: the what-if's median step, or its mean step."""
    m = ctx.what_if.on_mean if ctx.what_if is not None else None
    if evidence.get("gain_statistic") == "mean" and m is not None:
        return max(m.step_time_ns, 1)
    return ctx.step_ns


def _straggler_wait(findings: Sequence[Finding]) -> int:
    """The others' wait per step for the persistent stragglers: their cost, summed."""
    total = 0
    for f in findings:
        m = f.metrics
        if f.kind != FindingKind.STRAGGLER or not f.persistent:
            continue
        if isinstance(m, StragglerMetrics):
            cost = m.step_time_ns_mean and m.step_time_ns_mean - m.step_time_ns_if_median_speed
            total += cost or m.median_excess_ns
        elif isinstance(m, LateArrivalMetrics):
            total += m.waited_ns_per_step
    return max(0, total)


RULES: dict[FindingKind, tuple[Remedy, ...]] = {
    FindingKind.DATA_BOUND: (DATA,),
    FindingKind.COMM_BOUND: COMM,
    FindingKind.STRAGGLER: (STRAGGLER,),
    FindingKind.PIPELINE_BUBBLE: (PIPELINE,),
    FindingKind.HOST_BOUND: HOST,
    FindingKind.EXPOSED_COPIES: (COPY_OVERLAP, COPY_LESS),
    # slow steps filled by one class of host calls: that cause's remedy
    FindingKind.STEP_VARIABILITY: HOST[1:5],
    FindingKind.COMPUTE_BOUND: COMPUTE,
    FindingKind.BELOW_PEAK: BELOW_PEAK,
    FindingKind.LOW_BANDWIDTH: (TOPOLOGY,),
    # a hang or a collective mismatch: fix it first (no step time estimated)
    FindingKind.HANG: (HANG_REMEDY,),
    FindingKind.COLLECTIVE_MISMATCH: (MISMATCH_REMEDY,),
    FindingKind.JOB_FAILED: (MISMATCH_REMEDY, FAILURE_REMEDY),
}
_ENDED = (FindingKind.HANG, FindingKind.COLLECTIVE_MISMATCH, FindingKind.JOB_FAILED)


def recommend(
    run: RunSummary,
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    findings: Sequence[Finding],
    sync_by_step: Mapping[tuple[int, int], int] | None = None,
    rules: AdviceRules | None = None,
    wi: WhatIf | None = None,
) -> list[Recommendation]:
    """Recommendations for every actionable finding, most time recovered first.

    ``sync_by_step`` (rank, step) → synchronisation wait from matched collectives: the part
    of a rank's communication wait spent waiting for a slower rank, which no communication
    remedy can recover (see :mod:`gpudiag.analysis.run.collectives`).
    """
    ctx = Context(
        run,
        {r.rank: r for r in ranks},
        steps,
        sync_by_step or {},
        rules or AdviceRules(),
        wi,
        _straggler_wait(findings),
    )
    out: list[Recommendation] = []
    groups: list[list[int]] = []  # remedies acting on the same time, by index into out
    data_stragglers: list[int] = []
    for f in findings:
        group = []
        for remedy in RULES.get(f.kind, ()):
            if not remedy.applies(f, ctx):
                continue
            gain = remedy.gain(f, ctx)
            group.append(len(out))
            if f.kind == FindingKind.STRAGGLER and _cause(f) == Cause.DATA:
                data_stragglers.append(len(out))
            out.append(
                Recommendation(
                    id=remedy.id(f, ctx),
                    title=remedy.title(f, ctx),
                    detail=remedy.detail(f, ctx),
                    finding=f.kind,
                    # each family's evidence is a TypedDict of JSON values (remedy.Evidence)
                    evidence=cast(JsonObject, dict(ev := remedy.evidence(f, ctx))),
                    estimated_gain_ns=gain,
                    estimated_gain_ratio=(gain / _gain_base(ctx, ev)) if gain else None,
                )
            )
        groups += _by_families(out, group) if f.kind == FindingKind.BELOW_PEAK else [group]
    # a straggler slowed by its own data waits for the same loader the data remedy fixes
    data = [i for i, r in enumerate(out) if r.id == "dataloader"]
    groups += [[i, *data] for i in data_stragglers]
    out, groups = _unique(out, groups)
    out = _with_overlaps(out, groups)
    # a run that hung or disagreed on a collective must be fixed before any speed-up
    out.sort(key=lambda r: (r.finding not in _ENDED, -(r.estimated_gain_ns or 0)))
    return out


def _families(r: Recommendation) -> set[str]:
    """The kernel families a remedy from efficiency acts on (its evidence's ``families``)."""
    v = r.evidence.get("families")
    return {str(x) for x in v} if isinstance(v, (list, tuple)) else set()


def _by_families(out: list[Recommendation], group: list[int]) -> list[list[int]]:
    """The remedies from efficiency overlap only where they act on the same families.

    Precision and bigger GEMMs both speed the GEMMs (not additive); fusion acts on the
    elementwise and normalisation kernels, apart from both.
    """
    fams = [_families(out[i]) for i in group]
    pairs = [
        [group[a], group[b]]
        for a in range(len(group))
        for b in range(a + 1, len(group))
        if fams[a] & fams[b]
    ]
    return pairs + [[i] for i in group]


def _unique(
    out: list[Recommendation], groups: list[list[int]]
) -> tuple[list[Recommendation], list[list[int]]]:
    """One recommendation per id (two findings may call for the same remedy): the larger gain."""
    best: dict[str, int] = {}
    for i, r in enumerate(out):
        j = best.get(r.id)
        if j is None or (r.estimated_gain_ns or 0) > (out[j].estimated_gain_ns or 0):
            best[r.id] = i
    keep = sorted(best.values())
    new = {old: k for k, old in enumerate(keep)}
    remap = {i: new[best[r.id]] for i, r in enumerate(out)}
    groups = [sorted({remap[i] for i in g}) for g in groups]
    return [out[i] for i in keep], groups


def _with_overlaps(out: list[Recommendation], groups: list[list[int]]) -> list[Recommendation]:
    """Each remedy with the ids of the others that act on the same time (not additive)."""
    links: dict[int, set[str]] = {}
    for g in groups:
        for i in g:
            links.setdefault(i, set()).update(out[j].id for j in g if j != i)
    return [
        dataclasses.replace(r, overlaps_with=sorted(links.get(i, set()))) for i, r in enumerate(out)
    ]
