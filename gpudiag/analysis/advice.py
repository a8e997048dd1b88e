"""Rules mapping Findings to Recommendations; each cites its evidence and the time it could recover.

No remedy is proposed without a finding behind it, and each carries the numbers that
triggered it. Estimated gains are first-order, per *mean* step, and stated as upper
bounds. One step model (:mod:`gpudiag.analysis.whatif`): where the what-if models the
change a remedy makes, the remedy's gain is the what-if's saving, and every ratio is over
the what-if's mean step:

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
* host-bound → up to the "other" time per step. CUDA graphs and fusion are proposed only
  with evidence of launch overhead: at least ``advice.launch_bound_share`` (half) of the
  "other" time spent in GPU-idle gaps shorter than ``advice.launch_gap_ns`` (100 µs) while
  the host is inside the step; copies alone (no compute beside them) for half of it get
  the pinned-memory / side-stream remedy; otherwise the remedy is to find the host work
  (syncs, Python, logging) behind the long gaps;
* compute-bound (information) → no gain is estimated: fusion when elementwise, reduction
  and normalisation kernels hold ``advice.fusion_share`` of compute, bf16/TF32 when GEMMs
  hold ``advice.gemm_share`` of it and ``advice.fp32_gemm_share`` of their time is fp32;
* pipeline bubble → the schedule bubble saved by ``pipeline.micro_batches_per_stage`` (4)
  micro-batches per stage: ((p−1)/(m+p−1) − (p−1)/(4p+p−1)) × step time.

The rules are one table, :data:`RULES`: finding kind → remedies, each with its text, the
condition under which it applies, its evidence and its gain function.

Remedies that act on the same time overlap — the communication remedies all act on the
same exposed transfer — so their gains are not additive: each recommendation lists the
others it overlaps with (``overlaps_with``), and ``what_if.if_all_ns`` gives the step time
with every modelled change at once.

The what-if step times are modelled in :mod:`gpudiag.analysis.whatif`, the min/max
across ranks in :mod:`gpudiag.analysis.spread`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpudiag.analysis.comm_remedies import COMM
from gpudiag.analysis.metrics import (
    ComputeMetrics,
    LateArrivalMetrics,
    PipelineSummary,
    ShareMetrics,
    StragglerMetrics,
)
from gpudiag.analysis.model import (
    Cause,
    Finding,
    FindingKind,
    Mode,
    RankSummary,
    Recommendation,
    RunSummary,
    StepBreakdown,
    WhatIf,
)
from gpudiag.analysis.remedy import Context, Remedy, mean_part
from gpudiag.analysis.remedy import const as _const
from gpudiag.config import AdviceRules

# ---- data ----


def _single_loader(f: Finding, c: Context) -> bool:
    return any("_SingleProcessDataLoaderIter" in (e.data_range or "") for e in c.evidence(f.ranks))


def _data_detail(f: Finding, c: Context) -> str:
    gpu = c.run.mode == Mode.GPU
    if _single_loader(f, c):
        return ("The loader runs inside the training process (num_workers=0): set "
                "DataLoader(num_workers=4..8 per GPU, persistent_workers=True"
                + (", pin_memory=True" if gpu else "") + ") so batches are prepared in "
                "parallel with the step.")  # fmt: skip
    return ("The loader's workers do not keep up: raise num_workers and prefetch_factor, keep "
            "persistent_workers=True"
            + (", use pin_memory=True with non_blocking copies" if gpu else "")
            + "; if the workers are already busy, the storage or decoding is the limit "
            "(cache the dataset, use a faster format, or decode on the GPU with NVIDIA "
            "DALI or torchvision.io's GPU decoders).")  # fmt: skip


def _data_gain(f: Finding, c: Context) -> int | None:
    # the what-if's "no data wait" (the mean step: a loader that runs dry every few steps
    # costs its stalls on average, while its typical step waits for nothing)
    gain = c.what_if_gain("if_no_data_wait_ns")
    return (gain or None) if gain is not None else mean_part(c.steps, f.ranks, "data_wait_ns")


DATA = Remedy(
    id=_const("dataloader"),
    title=_const("Feed the step faster: DataLoader workers, pinning and prefetch"),
    detail=_data_detail,
    gain=_data_gain,
    evidence=lambda f, c: {"data_wait_ns_per_step": _data_gain(f, c), "ranks": f.ranks,
                           "per_rank_share": f.metrics_as(ShareMetrics).per_rank,
                           "single_process_loader": _single_loader(f, c)},
)  # fmt: skip


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
}  # fmt: skip


def _cause(f: Finding) -> Cause:
    return f.cause or Cause.UNKNOWN


def _excess(f: Finding) -> int:
    m = f.metrics
    return m.median_excess_ns if isinstance(m, (StragglerMetrics, LateArrivalMetrics)) else 0


def _straggler_gain(f: Finding, c: Context) -> int | None:
    """The what-if's "straggler at median speed", else the straggler's typical excess."""
    gain = c.what_if_gain("if_straggler_at_median_speed_ns")
    return (gain or None) if gain is not None else _excess(f)


STRAGGLER = Remedy(
    id=lambda f, c: f"investigate-rank-{f.ranks[0]}",
    title=lambda f, c: f"Investigate rank {f.ranks[0]} ({_cause(f)})",
    detail=lambda f, c: f"Rank {f.ranks[0]} holds every other rank back: "
                        f"{_STRAGGLER_HINTS[_cause(f)]}",
    gain=lambda f, c: _straggler_gain(f, c) if f.persistent else None,
    evidence=lambda f, c: {"rank": f.ranks[0], "cause": _cause(f),
                           "wait_caused_ns": f.wait_caused_ns, "persistent": f.persistent,
                           "steps": f.steps, "median_excess_ns": _excess(f)},
    applies=lambda f, c: bool(f.ranks),
)  # fmt: skip


# ---- pipeline ----


def _pipe(f: Finding) -> PipelineSummary:
    return f.metrics_as(PipelineSummary)


def _pipe_gain(f: Finding, c: Context) -> int | None:
    pm = _pipe(f)
    return round(max(0.0, pm.ideal_bubble_ratio - pm.bubble_ratio_at_target) * c.step_ns) or None


def _pipe_title(f: Finding, _c: Context) -> str:
    pm = _pipe(f)
    return (f"Use at least {pm.target_micro_batches} micro-batches per step "
            f"({pm.target_micro_batches // pm.stages}× the {pm.stages} stages) and a 1F1B "
            "schedule")  # fmt: skip


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
)


# ---- host ----


def _other(f: Finding, c: Context) -> int:
    return mean_part(c.steps, f.ranks, "other_ns")


def _idle_in_steps(f: Finding, c: Context) -> dict[str, Any]:
    """The flagged ranks' GPU-idle gaps inside their steps, summed (analysis evidence)."""
    gaps = [g for e in c.evidence(f.ranks) if (g := e.gpu_idle_in_steps) is not None]
    return {"total_ns": sum(g.total_ns for g in gaps),
            "short_gaps": sum(g.short_gaps for g in gaps),
            "short_gaps_ns": sum(g.short_gaps_ns for g in gaps),
            "long_gaps": sum(g.long_gaps for g in gaps)}  # fmt: skip


def _launch_share(f: Finding, c: Context) -> float:
    """The share of the flagged ranks' "other" time spent in short GPU-idle gaps."""
    other = sum(s.other_ns for s in c.steps if s.rank in f.ranks)
    return _idle_in_steps(f, c)["short_gaps_ns"] / other if other else 0.0


def _copy_share(f: Finding, c: Context) -> float:
    """The share of the flagged ranks' "other" time in copies with nothing beside them."""
    other = sum(s.other_ns for s in c.steps if s.rank in f.ranks)
    copies = sum(e.copies_alone_ns or 0 for e in c.evidence(f.ranks))
    return copies / other if other else 0.0


def _copy_bound(f: Finding, c: Context) -> bool:
    return c.run.mode == Mode.GPU and _copy_share(f, c) >= c.rules.launch_bound_share


def _launch_bound(f: Finding, c: Context) -> bool:
    return (c.run.mode == Mode.GPU and not _copy_bound(f, c)
            and _launch_share(f, c) >= c.rules.launch_bound_share)  # fmt: skip


def _host_evidence(f: Finding, c: Context) -> dict[str, Any]:
    return {"other_ns_per_step": _other(f, c), "ranks": f.ranks,
            "launch_gap_share": _launch_share(f, c), "copies_alone_share": _copy_share(f, c),
            "gpu_idle_in_steps": _idle_in_steps(f, c)}  # fmt: skip


def _stall_detail(f: Finding, c: Context) -> str:
    gaps = _idle_in_steps(f, c)
    many = (f" ({gaps['long_gaps']} gaps of {c.rules.launch_gap_ns / 1e3:.0f} µs or more in the "
            "profiled steps)") if gaps["long_gaps"] else ""  # fmt: skip
    return ("The GPU sits idle for long stretches while the host is inside the step" + many
            + ": look for synchronising calls (.item(), .cpu(), torch.cuda.synchronize, "
            "printing tensors), Python-side preprocessing, logging or checkpointing in the "
            "loop; py-spy or torch.profiler(with_stack=True) shows where the host spends "
            "them. Short launch gaps are not the problem here, so CUDA graphs would not "
            "help much.")  # fmt: skip


HOST = (
    Remedy(
        id=_const("exposed-copies"),
        title=_const("Hide host-device copies: pinned memory, non_blocking, a side stream"),
        detail=_const(
            "Most of the time outside compute is memory copies with nothing running beside "
            "them: allocate host tensors in pinned memory (DataLoader(pin_memory=True) or "
            ".pin_memory()), copy with .to(device, non_blocking=True), prefetch the next "
            "batch on a side CUDA stream, and avoid device-to-host copies inside the step "
            "(.cpu(), .item(), .tolist())."
        ),
        gain=_other,
        evidence=_host_evidence,
        applies=_copy_bound,
    ),
    Remedy(
        id=_const("launch-bound"),
        title=_const("Cut launch and host overhead: CUDA graphs, torch.compile, larger batches"),
        detail=_const(
            "The GPU idles in short gaps between kernels while the host launches them: "
            "capture the step in a CUDA graph (torch.cuda.graphs / "
            "torch.compile(mode='reduce-overhead')), fuse small kernels with torch.compile, "
            "raise the batch size, and remove synchronisations (.item(), .cpu(), "
            "torch.cuda.synchronize) from the step."
        ),
        gain=_other,
        evidence=_host_evidence,
        applies=_launch_bound,
    ),
    Remedy(
        id=_const("host-stalls"),
        title=_const("Find the host work that stalls the GPU inside the step"),
        detail=_stall_detail,
        gain=_other,
        evidence=_host_evidence,
        applies=lambda f, c: (c.run.mode == Mode.GPU and not _launch_bound(f, c)
                              and not _copy_bound(f, c)),
    ),
    Remedy(
        id=_const("host-overhead"),
        title=_const("Cut Python overhead in the step"),
        detail=_const(
            "Time passes outside operators: compile the model (torch.compile), use "
            "larger batches, and move logging and metric computation out of the step."
        ),
        gain=_other,
        evidence=lambda f, c: {"other_ns_per_step": _other(f, c), "ranks": f.ranks},
        applies=lambda f, c: c.run.mode != Mode.GPU,
    ),
)  # fmt: skip


# ---- compute ----


def _cm(f: Finding) -> ComputeMetrics:
    return f.metrics_as(ComputeMetrics)


def _compute_evidence(f: Finding, _c: Context) -> dict[str, Any]:
    m = _cm(f)
    return {"compute_share": m.compute_share, "unit": m.unit, "fusable_share": m.fusable_share,
            "gemm_share": m.gemm_share, "fp32_gemm_share": m.fp32_gemm_share,
            "top": list(m.top)}  # fmt: skip


def _fusion_detail(f: Finding, _c: Context) -> str:
    unit = "operators" if _cm(f).unit == "operator" else "kernels"
    return (
        f"Elementwise, reduction and normalisation {unit} take {_cm(f).fusable_share:.0%} of "
        "compute: each reads and writes its tensors from memory. torch.compile(model) fuses "
        "chains of them into few kernels (Inductor/Triton); fused optimizers (foreach=True or "
        "fused=True) and fused layers (e.g. apex/Transformer Engine LayerNorm, "
        "scaled_dot_product_attention) do the same for common patterns."
    )


def _precision_detail(f: Finding, _c: Context) -> str:
    cpu = _cm(f).unit == "operator"
    text = (
        f"GEMMs take {_cm(f).gemm_share:.0%} of compute and {_cm(f).fp32_gemm_share:.0%} of "
        "their time runs in full fp32: "
    )
    if cpu:
        return text + (
            "run the forward pass under torch.autocast('cpu', dtype=torch.bfloat16) on CPUs "
            "with bf16 support (AMX, AVX-512 BF16)."
        )
    return text + (
        "train under torch.autocast('cuda', dtype=torch.bfloat16) (mixed precision), or at "
        "least let fp32 matmuls use TF32 tensor cores with "
        "torch.backends.cuda.matmul.allow_tf32 = True / "
        "torch.set_float32_matmul_precision('high')."
    )


COMPUTE = (
    Remedy(
        id=_const("fuse-kernels"),
        title=_const("Fuse elementwise and normalisation work with torch.compile"),
        detail=_fusion_detail,
        gain=lambda f, c: None,
        evidence=_compute_evidence,
        applies=lambda f, c: _cm(f).fusable_share >= c.rules.fusion_share,
    ),
    Remedy(
        id=_const("reduced-precision"),
        title=_const("Run the GEMMs in bf16 (autocast) or TF32 instead of fp32"),
        detail=_precision_detail,
        gain=lambda f, c: None,
        evidence=_compute_evidence,
        applies=lambda f, c: (_cm(f).gemm_share >= c.rules.gemm_share
                              and _cm(f).fp32_gemm_share >= c.rules.fp32_gemm_share),
    ),
)  # fmt: skip


RULES: dict[FindingKind, tuple[Remedy, ...]] = {
    FindingKind.DATA_BOUND: (DATA,),
    FindingKind.COMM_BOUND: COMM,
    FindingKind.STRAGGLER: (STRAGGLER,),
    FindingKind.PIPELINE_BUBBLE: (PIPELINE,),
    FindingKind.HOST_BOUND: HOST,
    FindingKind.COMPUTE_BOUND: COMPUTE,
}


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
    remedy can recover (see :mod:`gpudiag.analysis.collectives`).
    """
    ctx = Context(
        run, {r.rank: r for r in ranks}, steps, sync_by_step or {}, rules or AdviceRules(), wi
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
            out.append(Recommendation(
                id=remedy.id(f, ctx), title=remedy.title(f, ctx), detail=remedy.detail(f, ctx),
                finding=f.kind, evidence=remedy.evidence(f, ctx), estimated_gain_ns=gain,
                estimated_gain_ratio=(gain / ctx.step_ns) if gain else None,
            ))  # fmt: skip
        groups.append(group)
    # a straggler slowed by its own data waits for the same loader the data remedy fixes
    data = [i for i, r in enumerate(out) if r.id == "dataloader"]
    groups += [[i, *data] for i in data_stragglers]
    out = _with_overlaps(out, groups)
    out.sort(key=lambda r: -(r.estimated_gain_ns or 0))
    return out


def _with_overlaps(out: list[Recommendation], groups: list[list[int]]) -> list[Recommendation]:
    """Each remedy with the ids of the others that act on the same time (not additive)."""
    links: dict[int, set[str]] = {}
    for g in groups:
        for i in g:
            links.setdefault(i, set()).update(out[j].id for j in g if j != i)
    return [dataclasses.replace(r, overlaps_with=sorted(links.get(i, set())))
            for i, r in enumerate(out)]  # fmt: skip
