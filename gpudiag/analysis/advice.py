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
* host-bound → up to the named cause's own time per step (``cause.ns_per_step``,
  analysis/causes.py), never more than the "other" time; no gain when no cause is named
  (host work the trace does not show cannot be promised back: the detail says what to
  capture). CUDA graphs and fusion are proposed only
  with evidence of launch overhead: at least ``advice.launch_bound_share`` (half) of the
  "other" time spent in GPU-idle gaps shorter than ``advice.launch_gap_ns`` (100 µs) while
  the host is inside the step; copies alone (no compute beside them) for half of it get
  the copy remedies (:mod:`gpudiag.analysis.copy_remedies`: overlap, gaining at most the
  compute per step; pinning only for pageable copies; moving less when the copies dwarf
  the compute); otherwise the remedy is to find the host work
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpudiag.analysis import workload
from gpudiag.analysis.causes import UNSEEN_HOST_WORK, ev, mx
from gpudiag.analysis.comm_remedies import COMM
from gpudiag.analysis.copy_remedies import MOVE_LESS as COPY_LESS
from gpudiag.analysis.copy_remedies import OVERLAP as COPY_OVERLAP
from gpudiag.analysis.eager_remedy import EAGER
from gpudiag.analysis.end_remedies import HANG as HANG_REMEDY
from gpudiag.analysis.end_remedies import MISMATCH as MISMATCH_REMEDY
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
    Severity,
    StepBreakdown,
    WhatIf,
)
from gpudiag.analysis.remedy import Context, Remedy
from gpudiag.analysis.remedy import const as _const
from gpudiag.analysis.stragglers import busy_host_words
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
    return (gain or None) if gain is not None else c.median_part(f.ranks, "data_wait_ns", "mean")


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


# a CPU job's compute is the host's: no GPU to check
_CPU_COMPUTE = ("it takes longer for the same work: check uneven sharding, the CPU cores it "
                "runs on (frequency, other processes on them) and its thread count "
                "(OMP_NUM_THREADS, torch.set_num_threads) against the others'.")  # fmt: skip


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
    id=lambda f, c: f"quiet-host-rank-{f.ranks[0]}" if _busy(f) else
                    f"investigate-rank-{f.ranks[0]}",
    title=_straggler_title,
    detail=_straggler_detail,
    gain=lambda f, c: _straggler_gain(f, c) if f.persistent else None,
    evidence=lambda f, c: {"rank": f.ranks[0], "cause": _cause(f),
                           "wait_caused_ns": f.wait_caused_ns, "persistent": f.persistent,
                           "steps": f.steps, "median_excess_ns": _excess(f),
                           **({"host_contention": _busy(f)} if _busy(f) else {})},
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
    # a bubble within the threshold: worth it only while more micro-batches would shrink it
    applies=lambda f, c: f.severity != Severity.INFO or _pipe_gain(f, c) is not None,
)


# ---- host ----


def _other(f: Finding, c: Context) -> int:
    return c.median_part(f.ranks, "other_ns", "mean")


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


def _host_cause(f: Finding) -> dict[str, Any]:
    """The host cause named on the finding (analysis/causes.py), ``{}`` when none."""
    cause = mx(f, "cause")
    return cause if isinstance(cause, dict) else {}


def _is(*kinds: str) -> Callable[[Finding, Context], bool]:
    return lambda f, c: c.run.mode == Mode.GPU and _host_cause(f).get("kind") in kinds


def _host_evidence(f: Finding, c: Context) -> dict[str, Any]:
    return {"other_ns_per_step": _other(f, c), "ranks": f.ranks,
            "launch_gap_share": _launch_share(f, c), "copies_alone_share": _copy_share(f, c),
            "gpu_idle_in_steps": _idle_in_steps(f, c), "cause": _host_cause(f)}  # fmt: skip


def _native(c: Context) -> bool:
    """A C/C++/CUDA program (no PyTorch name in the trace): no PyTorch advice.

    Only ranks whose names were read count (evidence ``workload``); without any, nothing
    says the program is not PyTorch.
    """
    read = any(ev(r, "workload") is not None for r in c.ranks.values())
    return read and workload.native_program(c.workload())


def _cause_gain(f: Finding, c: Context) -> int | None:
    """Up to the cause's own time per step, never more than the "other" time.

    For slow steps (a step-variability finding) the cause's time in them, spread over
    every analysed step: the mean a step would gain. None when the GPU was mostly busy
    while the calls blocked (a wait for its own work is not time it idles).
    """
    own = int(_host_cause(f).get("ns_per_step") or 0)
    waits = _host_cause(f).get("waits_for") or {}
    if float(waits.get("compute", 0.0)) + float(waits.get("communication", 0.0)) >= 0.5:
        return None  # the GPU was busy meanwhile: the wait is not the GPU's idle time
    if f.kind == FindingKind.STEP_VARIABILITY:
        n = max(len({s.step for s in c.steps}), 1)
        return round(own * len(_host_cause(f).get("steps") or [1]) / n)
    if own or _host_cause(f).get("kind", "unknown") != "unknown":
        return min(own, _other(f, c))  # a named cause: never more than its own time
    return None  # no cause the trace shows: no gain from time it did not see


def _stall_detail(f: Finding, c: Context) -> str:
    gaps = _idle_in_steps(f, c)
    many = (f" ({gaps['long_gaps']} gaps of {c.rules.launch_gap_ns / 1e3:.0f} µs or more in the "
            "profiled steps)") if gaps["long_gaps"] else ""  # fmt: skip
    if _host_cause(f).get("kind") == "python":
        return ("The host spends its time between operators — "
                + str(_host_cause(f)["text"])
                + ": Python-side work in the loop — logging, metrics, data reshaping, "
                "small tensor ops issued one by one. torch.compile the model and loss, move "
                "logging and metrics out of the step (every N steps), and look at "
                "py-spy or torch.profiler(with_stack=True) for the Python frames.")  # fmt: skip
    return ("The GPU sits idle for long stretches while the host is inside the step" + many
            + ": look for synchronising calls (.item(), .cpu(), torch.cuda.synchronize, "
            "printing tensors), Python-side preprocessing, logging or checkpointing in the "
            "loop; py-spy or torch.profiler(with_stack=True) shows where the host spends "
            "them. " + UNSEEN_HOST_WORK)  # fmt: skip


def _sync_detail(f: Finding, c: Context) -> str:
    cause = _host_cause(f)
    waits = cause.get("waits_for") or {}
    who = max(waits, key=lambda k: waits[k]) if waits else ""
    api = cause.get("api", "a synchronising call")
    head = f"The training thread blocks in {api} ({cause['text']}). "
    if _native(c):
        return head + ("Synchronise only where the host needs the result: replace "
                       "cudaDeviceSynchronize/cudaStreamSynchronize in the loop with events "
                       "(cudaEventRecord + cudaStreamWaitEvent) between streams, and check "
                       "convergence every N iterations instead of every one.")  # fmt: skip
    if who == "communication":
        return head + ("It waits for a collective: the time is set by the slowest rank's "
                       "arrival or by the transfer itself. Find the late rank (the straggler "
                       "findings), and drop host-side waits on collectives (.item() on a "
                       "reduced loss, work.wait() right after launch): let the GPU stream "
                       "order the work.")  # fmt: skip
    if who == "copy":
        return head + ("It waits for a copy to or from the host: .item(), .cpu(), .tolist() "
                       "or a pageable copy. Copy into pinned buffers with non_blocking=True "
                       "and read them one step later, or keep the value on the GPU.")  # fmt: skip
    return head + ("It waits for the GPU to drain its queue (.item(), .cpu(), print of a "
                   "tensor, torch.cuda.synchronize, _local_scalar_dense): the host cannot "
                   "queue the next kernels meanwhile. Log scalars every N steps, accumulate "
                   "metrics on the GPU, and use non_blocking copies to pinned memory.")  # fmt: skip


def _alloc_detail(f: Finding, c: Context) -> str:
    cause = _host_cause(f)
    head = f"Memory is allocated and freed through the driver inside the steps ({cause['text']}). "
    if _native(c):
        return head + ("Allocate device and pinned buffers once, before the loop, and reuse "
                       "them; where sizes vary, use stream-ordered pools (cudaMallocAsync / "
                       "cudaMemPool) instead of cudaMalloc/cudaFree.")  # fmt: skip
    env = "PYTORCH_HIP_ALLOC_CONF" if c.device().vendor == "amd" else "PYTORCH_CUDA_ALLOC_CONF"
    return head + ("PyTorch's caching allocator should make these rare: make sure "
                   "PYTORCH_NO_CUDA_MEMORY_CACHING is not set and torch.cuda.empty_cache() is "
                   f"not called in the loop; set {env}=expandable_segments:True so a "
                   "fragmented cache grows instead of freeing and retrying, and keep tensor "
                   "shapes stable (pad variable-length batches to a few sizes).")  # fmt: skip


def _copy_detail(f: Finding, c: Context) -> str:
    cause = _host_cause(f)
    head = f"Host-device copies block the training thread ({cause['text']}). "
    if _native(c):
        return head + ("Allocate the host buffers pinned (cudaMallocHost / cudaHostRegister) "
                       "and copy with cudaMemcpyAsync on a stream of its own, so copies "
                       "overlap the kernels; copy only what the host needs (a residual, not "
                       "the grid) and only every N iterations.")  # fmt: skip
    waits = cause.get("waits_for") or {}
    busy = float(waits.get("compute", 0.0)) + float(waits.get("communication", 0.0))
    if busy >= 0.5:
        return head + (
            f"While the call blocks, the GPU is still running earlier work ({busy:.0%} of the "
            "time): the copy waits for it, so it acts as a synchronisation — a device-to-host "
            "read (.item(), .cpu(), .tolist(), a size or length the host needs). Read such "
            "values a step later from a pinned buffer filled with non_blocking=True, or keep "
            "them on the GPU."
        )
    return head + (
        "A copy from pageable memory, or to the host, returns only when done: pin "
        "the host tensors (pin_memory=True, .pin_memory()), copy with "
        ".to(device, non_blocking=True), and avoid .cpu()/.item() in the step."
    )


def _gpu_busy_share(f: Finding) -> float:
    """The share of a sync/copy cause's blocking time with the GPU still running work."""
    waits = _host_cause(f).get("waits_for") or {}
    return float(waits.get("compute", 0.0)) + float(waits.get("communication", 0.0))


def _copy_title(f: Finding, c: Context) -> str:
    api = _host_cause(f).get("api")
    if _gpu_busy_share(f) >= 0.5:
        return f"Move device-to-host reads out of the step ({api} waits for the GPU)"
    return f"Make host-device copies asynchronous ({api} blocks)"


def _jit_detail(f: Finding, c: Context) -> str:
    cause = _host_cause(f)
    head = f"Kernels are compiled inside the measured steps ({cause['text']}). "
    if _native(c):
        return head + (
            "Compile once and cache the module: load it before the timed loop "
            "(cuModuleLoad once), keep the PTX/cubin cache (CUDA_CACHE_PATH, "
            "CUDA_CACHE_MAXSIZE), or compile ahead of time for the target "
            "architecture (-gencode): nothing is JIT-compiled at run time."
        )
    return head + ("Run warm-up iterations before measuring, keep shapes and dtypes stable so "
                   "nothing recompiles (TORCH_LOGS=recompiles shows why; mark_dynamic for "
                   "varying dimensions), and keep compiled artefacts across runs "
                   "(TORCHINDUCTOR_FX_GRAPH_CACHE / the Inductor cache; nvFuser and NVRTC "
                   "reuse their kernels once the same fusion is seen).")  # fmt: skip


def _launch_title(f: Finding, c: Context) -> str:
    if _native(c):
        return "Cut launch overhead: CUDA graphs or fewer, larger kernels"
    graphs = bool(_host_cause(f).get("graphs_launched"))
    compiled = _compiled(c)
    if graphs and compiled:
        return "Cut launch overhead: larger batches, graphs over the eager parts"
    if graphs:
        return "Cut launch overhead: fuse kernels with torch.compile, larger batches"
    if compiled:
        return "Cut launch and host overhead: CUDA graphs (reduce-overhead), larger batches"
    return "Cut launch and host overhead: CUDA graphs, torch.compile, larger batches"


def _compiled(c: Context) -> bool:
    """torch.compile is already in use (its compiled graphs or Triton kernels run)."""
    return "compiled" in c.workload()


def _launch_detail(f: Finding, c: Context) -> str:
    cause = _host_cause(f)
    why = cause.get("text") or "short launch gaps"
    head = f"The GPU waits for the host to issue work ({why}). "
    if _native(c):
        return head + ("Capture the iteration in a CUDA graph (cudaStreamBeginCapture / "
                       "cudaGraphLaunch) and replay it, fuse small kernels, or give each "
                       "kernel more work.")  # fmt: skip
    inf = workload.inference(c.workload())
    graphs = ("CUDA graphs are already launched (cudaGraphLaunch/hipGraphLaunch): capture the "
              "parts still run eagerly, " if cause.get("graphs_launched") else
              "capture the step in a CUDA graph (torch.cuda.graphs / "
              "torch.compile(mode='reduce-overhead')" + (
                  "; in an inference engine, keep its CUDA-graph mode on — vLLM without "
                  "enforce_eager — for decode steps" if inf else "") + "), ")  # fmt: skip
    fuse = ("extend torch.compile to the parts still run eagerly (it is in use), "
            if _compiled(c) else "fuse small kernels with torch.compile, ")  # fmt: skip
    rest = graphs + fuse + "and raise the batch size so each kernel does more work."
    return head + rest[:1].upper() + rest[1:]


HOST = (
    COPY_OVERLAP,
    Remedy(
        id=_const("host-sync"),
        title=lambda f, c: ("Take the synchronisation out of the step "
                            f"({_host_cause(f).get('api')})"),
        detail=_sync_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=_is("sync"),
    ),
    Remedy(
        id=_const("caching-allocator"),
        title=lambda f, c: (
            "Allocate once, outside the loop (cudaMalloc/cudaFree in the steps)" if _native(c)
            else f"Keep the caching allocator on: {_host_cause(f).get('api')} inside the steps"),
        detail=_alloc_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=_is("allocator"),
    ),
    Remedy(
        id=_const("blocking-copies"),
        title=_copy_title,
        detail=_copy_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=_is("copy"),
    ),
    Remedy(
        id=_const("jit-compilation"),
        title=_const("Compile kernels once, outside the measured steps"),
        detail=_jit_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=_is("jit"),
    ),
    Remedy(
        id=_const("launch-bound"),
        title=_launch_title,
        detail=_launch_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=_is("launch"),
    ),
    dataclasses.replace(EAGER, gain=_cause_gain, evidence=_host_evidence),
    Remedy(
        id=_const("host-stalls"),
        title=lambda f, c: ("Cut Python overhead between operators"
                            if _host_cause(f).get("kind") == "python"
                            else "Find the host work that stalls the GPU inside the step"),
        detail=_stall_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=lambda f, c: (c.run.mode == Mode.GPU
                              and _host_cause(f).get("kind", "unknown") in ("python", "unknown")),
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
    COPY_LESS,
)  # fmt: skip


# ---- compute ----


def _cm(f: Finding) -> ComputeMetrics:
    return f.metrics_as(ComputeMetrics)


def _compute_evidence(f: Finding, _c: Context) -> dict[str, Any]:
    m = _cm(f)
    return {"compute_share": m.compute_share, "unit": m.unit, "fusable_share": m.fusable_share,
            "gemm_share": m.gemm_share, "fp32_gemm_share": m.fp32_gemm_share,
            "matrix_share": m.matrix_share, "fp32_matrix_share": m.fp32_matrix_share,
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


def _matrix_text(f: Finding) -> str:
    """Which matrix families hold compute: "GEMMs 40%, convolutions 25%"."""
    fams = _cm(f).families
    parts = [
        (label, float(fams.get(fam, 0.0)))
        for fam, label in (
            ("GEMM", "GEMMs"),
            ("convolution", "convolutions"),
            ("attention", "attention"),
        )
    ]
    shown = [f"{label} {v:.0%}" for label, v in parts if v >= 0.05]
    return ", ".join(shown) or f"matrix kernels {_cm(f).matrix_share:.0%}"


def _precision_title(f: Finding, c: Context) -> str:
    if _cm(f).unit == "operator":
        return "Run the matrix operators in bf16 on the CPU (autocast)"
    dev = c.device()
    if workload.inference(c.workload()):
        half = "bf16" if dev.bf16 else "fp16"
        return f"Serve the model in {half}" + (" or FP8" if dev.fp8 else "")
    if dev.known and not dev.bf16 and dev.fp16:
        return "Train in fp16 mixed precision (autocast with a GradScaler)"
    if dev.known and dev.bf16:
        extra = " or TF32" if dev.tf32 else ""
        return f"Run matmuls, convolutions and attention in bf16 (autocast){extra}"
    return "Use mixed precision (autocast) for the fp32 matrix work"


def _precision_detail(f: Finding, c: Context) -> str:
    cpu = _cm(f).unit == "operator"
    fp32 = max(_cm(f).fp32_matrix_share, _cm(f).fp32_gemm_share)
    text = (f"Matrix kernels take {_cm(f).matrix_share:.0%} of compute ({_matrix_text(f)}) "
            f"and {fp32:.0%} of their time runs in full fp32: ")  # fmt: skip
    if not cpu and workload.inference(c.workload()):
        dev = c.device()
        half = "torch.bfloat16" if dev.bf16 or not dev.known else "torch.float16"
        fp8 = (
            " On this GPU FP8 weights and activations halve the bytes again (the "
            "engine's fp8 quantisation, e.g. vLLM --quantization fp8 or TensorRT-LLM)."
        )
        return text + (
            f"an inference engine needs no loss scaling: load the weights in {half} "
            "(model.to(dtype)) or let the engine pick its half-precision dtype; weight-only "
            "INT8/INT4 quantisation cuts memory traffic further for small batches."
            + (fp8 if dev.fp8 else "")
        )
    if cpu:
        return text + (
            "run the forward pass under torch.autocast('cpu', dtype=torch.bfloat16) on CPUs "
            "with bf16 support (AMX, AVX-512 BF16)."
        )
    dev = c.device()
    on = f"{dev.generation} ({dev.basis})" if dev.known else ""
    if dev.known and not dev.bf16 and dev.fp16:
        return text + (
            f"{on} has fp16 tensor cores but no bf16 or TF32: train under "
            "torch.autocast('cuda', dtype=torch.float16) with a torch.amp.GradScaler to keep "
            "small gradients from underflowing; channels_last memory format helps cuDNN "
            "convolutions use the tensor cores."
        )
    if dev.known and dev.bf16:
        tf32 = (" or at least let fp32 matmuls and convolutions use TF32 with "
                "torch.backends.cuda.matmul.allow_tf32 = True and "
                "torch.backends.cudnn.allow_tf32 = True") if dev.tf32 else ""  # fmt: skip
        fp8 = (f"; on {dev.generation}, FP8 (Transformer Engine's fp8_autocast, "
               "torchao float8) speeds up large GEMMs further") if dev.fp8 else ""  # fmt: skip
        return text + (
            f"{on} runs bf16 on its matrix units: train under "
            f"torch.autocast('cuda', dtype=torch.bfloat16) (no loss scaling needed){tf32}"
            f"{fp8}; scaled_dot_product_attention then picks the flash kernels."
        )
    return text + (
        "train under torch.autocast (bf16 where the GPU supports it, else fp16 with a "
        "GradScaler), or let fp32 matmuls use TF32 tensor cores where available "
        "(torch.set_float32_matmul_precision('high'))."
    )


def _amp_on(c: Context) -> bool:
    """Half-precision kernels already hold ``advice.amp_on_share`` of compute."""
    return c.low_precision_share() >= c.rules.amp_on_share


COMPUTE = (
    Remedy(
        id=_const("fuse-kernels"),
        title=_const("Fuse elementwise and normalisation work with torch.compile"),
        detail=_fusion_detail,
        gain=lambda f, c: None,
        evidence=_compute_evidence,
        applies=lambda f, c: (_cm(f).fusable_share >= c.rules.fusion_share
                              and not _native(c) and not _compiled(c)),
    ),
    Remedy(
        id=_const("reduced-precision"),
        title=_precision_title,
        detail=_precision_detail,
        gain=lambda f, c: None,
        evidence=lambda f, c: {**_compute_evidence(f, c), "device": c.device().as_dict(),
                               "low_precision_share": c.low_precision_share()},
        applies=lambda f, c: (
            _cm(f).matrix_share >= c.rules.gemm_share
            and max(_cm(f).fp32_matrix_share, _cm(f).fp32_gemm_share) >= c.rules.fp32_gemm_share
            and not _amp_on(c) and not _native(c)
            and (not c.device().known or c.device().fp16)),
    ),
)  # fmt: skip


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
    # a hang or a collective mismatch: fix it first (no step time estimated)
    FindingKind.HANG: (HANG_REMEDY,),
    FindingKind.COLLECTIVE_MISMATCH: (MISMATCH_REMEDY,),
    FindingKind.JOB_FAILED: (MISMATCH_REMEDY,),
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
    out, groups = _unique(out, groups)
    out = _with_overlaps(out, groups)
    # a run that hung or disagreed on a collective must be fixed before any speed-up
    out.sort(key=lambda r: (r.finding not in _ENDED, -(r.estimated_gain_ns or 0)))
    return out


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
    return [dataclasses.replace(r, overlaps_with=sorted(links.get(i, set())))
            for i, r in enumerate(out)]  # fmt: skip
