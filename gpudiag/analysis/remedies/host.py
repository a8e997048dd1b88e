"""The remedies for host-bound steps (the ``host_bound`` row of the advice table).

The ``exposed_copies`` and ``step_variability`` rows are built from the same remedies.

Host-bound → up to the named cause's own time per step (``cause.ns_per_step``,
analysis/causes.py), never more than the "other" time; the whole "other" time only when no
cause is named. CUDA graphs and fusion are proposed only with evidence of launch overhead;
copies alone get the pinned-memory / side-stream remedy; otherwise the remedy is to find the
host work (syncs, Python, logging) behind the long gaps.
"""

from collections.abc import Callable
from typing import TypedDict

from gpudiag.analysis.findings.causes import (
    UNSEEN_HOST_WORK,
    cause_json,
    cause_kind,
    gpu_busy_share,
)
from gpudiag.analysis.findings.causes import figures_of as _figures
from gpudiag.analysis.model.diagnosis import Finding, FindingKind, Mode
from gpudiag.analysis.rank import workload
from gpudiag.analysis.remedies import eager as eager_remedy
from gpudiag.analysis.remedies.copies import MOVE_LESS as COPY_LESS
from gpudiag.analysis.remedies.copies import OVERLAP as COPY_OVERLAP
from gpudiag.analysis.remedies.remedy import Context, Remedy
from gpudiag.analysis.remedies.remedy import compiled as _compiled
from gpudiag.analysis.remedies.remedy import const as _const
from gpudiag.analysis.remedies.remedy import native as _native


def _other(f: Finding, c: Context) -> int:
    return c.median_part(f.ranks, "other_ns", "mean")


class IdleGaps(TypedDict):
    """The flagged ranks' GPU-idle gaps inside their steps, summed."""

    total_ns: int
    short_gaps: int
    short_gaps_ns: int
    long_gaps: int


class HostEvidence(TypedDict):
    """A host remedy's evidence: the "other" time, what fills it, and the host cause."""

    other_ns_per_step: int
    ranks: list[int]
    launch_gap_share: float
    copies_alone_share: float
    gpu_idle_in_steps: IdleGaps
    cause: dict[str, object]  # the host cause's JSON (HostCause.to_json), {} when none


def _idle_in_steps(f: Finding, c: Context) -> IdleGaps:
    """The flagged ranks' GPU-idle gaps inside their steps, summed (analysis evidence)."""
    gaps = [g for e in c.evidence(f.ranks) if (g := e.gpu_idle_in_steps) is not None]
    return IdleGaps(
        total_ns=sum(g.total_ns for g in gaps),
        short_gaps=sum(g.short_gaps for g in gaps),
        short_gaps_ns=sum(g.short_gaps_ns for g in gaps),
        long_gaps=sum(g.long_gaps for g in gaps),
    )


def _launch_share(f: Finding, c: Context) -> float:
    """The share of the flagged ranks' "other" time spent in short GPU-idle gaps."""
    other = sum(s.other_ns for s in c.steps if s.rank in f.ranks)
    return _idle_in_steps(f, c)["short_gaps_ns"] / other if other else 0.0


def _copy_share(f: Finding, c: Context) -> float:
    """The share of the flagged ranks' "other" time in copies with nothing beside them."""
    other = sum(s.other_ns for s in c.steps if s.rank in f.ranks)
    copies = sum(e.copies_alone_ns or 0 for e in c.evidence(f.ranks))
    return copies / other if other else 0.0


def _is(*kinds: str) -> Callable[[Finding, Context], bool]:
    return lambda f, c: c.run.mode == Mode.GPU and cause_kind(f) in kinds


def _host_evidence(f: Finding, c: Context) -> HostEvidence:
    return HostEvidence(
        other_ns_per_step=_other(f, c),
        ranks=f.ranks,
        launch_gap_share=_launch_share(f, c),
        copies_alone_share=_copy_share(f, c),
        gpu_idle_in_steps=_idle_in_steps(f, c),
        cause=cause_json(f),
    )


def _cause_gain(f: Finding, c: Context) -> int | None:
    """Up to the cause's own time per step, never more than the "other" time.

    For slow steps (a step-variability finding) the cause's time in them, spread over
    every analysed step: the mean a step would gain. A blocking call's own time is only
    its GPU-idle part (analysis/rank/hostcause.py): while it waits for the GPU's work the
    time is the GPU's, which no host remedy gives back.
    """
    own = int(_figures(f).ns_per_step or 0)
    if f.kind == FindingKind.STEP_VARIABILITY:
        n = max(len({s.step for s in c.steps}), 1)
        return round(own * len(_figures(f).steps or [1]) / n)
    if own or (cause_kind(f) or "unknown") != "unknown":
        return min(own, _other(f, c))  # a named cause: never more than its own time
    return None  # no cause the trace shows: no gain from time it did not see


def _stall_title(f: Finding, c: Context) -> str:
    if cause_kind(f) != "python":
        return "Find the host work that stalls the GPU inside the step"
    if _figures(f).before_graph_ns_per_step:
        return "Cut the per-step Python before the graph replay"
    return "Cut Python overhead between operators"


def _stall_gain(f: Finding, c: Context) -> int | None:
    """The cause's own time; before a graph replay, the Python time before it (at most that)."""
    own = _cause_gain(f, c)
    before = _figures(f).before_graph_ns_per_step
    return min(before, own) if before and own is not None else own


def _stall_detail(f: Finding, c: Context) -> str:
    gaps = _idle_in_steps(f, c)
    many = (
        (
            f" ({gaps['long_gaps']} gaps of {c.rules.launch_gap_ns / 1e3:.0f} µs or more in the "
            "profiled steps)"
        )
        if gaps["long_gaps"]
        else ""
    )
    if cause_kind(f) == "python" and _figures(f).before_graph_ns_per_step:
        return (
            "The GPU waits for the host's Python before each step's graph replay — "
            + str(_figures(f).text)
            + ". CUDA graphs are already in use: what is left is the per-step Python work "
            "before the replay. Move dictionary lookups, input preparation and bookkeeping "
            "out of the step (build the inputs once, keep static buffers and copy into them, "
            "cache per-request state instead of looking it up each step), torch.compile the "
            "pre-processing, and prepare the next step's inputs while the graph runs."
        )
    if cause_kind(f) == "python":
        return (
            "The host spends its time between operators — "
            + str(_figures(f).text)
            + ": Python-side work in the loop — logging, metrics, data reshaping, "
            "small tensor ops issued one by one. torch.compile the model and loss, move "
            "logging and metrics out of the step (every N steps), and look at "
            "py-spy or torch.profiler(with_stack=True) for the Python frames."
        )
    return (
        "The GPU sits idle for long stretches while the host is inside the step"
        + many
        + ": look for synchronising calls (.item(), .cpu(), torch.cuda.synchronize, "
        "printing tensors), Python-side preprocessing, logging or checkpointing in the "
        "loop; py-spy or torch.profiler(with_stack=True) shows where the host spends "
        "them. " + UNSEEN_HOST_WORK
    )


def _sync_detail(f: Finding, c: Context) -> str:
    cause = _figures(f)
    waits = cause.waits_for or {}
    who = max(waits, key=lambda k: waits[k]) if waits else ""
    api = cause.api or "a synchronising call"
    head = f"The training thread blocks in {api} ({cause.text}). "
    if _native(c):
        return head + (
            "Synchronise only where the host needs the result: replace "
            "cudaDeviceSynchronize/cudaStreamSynchronize in the loop with events "
            "(cudaEventRecord + cudaStreamWaitEvent) between streams, and check "
            "convergence every N iterations instead of every one."
        )
    if who == "communication":
        return head + (
            "It waits for a collective: the time is set by the slowest rank's "
            "arrival or by the transfer itself. Find the late rank (the straggler "
            "findings), and drop host-side waits on collectives (.item() on a "
            "reduced loss, work.wait() right after launch): let the GPU stream "
            "order the work."
        )
    if who == "copy":
        return head + (
            "It waits for a copy to or from the host: .item(), .cpu(), .tolist() "
            "or a pageable copy. Copy into pinned buffers with non_blocking=True "
            "and read them one step later, or keep the value on the GPU."
        )
    return head + (
        "It waits for the GPU to drain its queue (.item(), .cpu(), print of a "
        "tensor, torch.cuda.synchronize, _local_scalar_dense): the host cannot "
        "queue the next kernels meanwhile. Log scalars every N steps, accumulate "
        "metrics on the GPU, and use non_blocking copies to pinned memory."
    )


def _alloc_detail(f: Finding, c: Context) -> str:
    cause = _figures(f)
    head = f"Memory is allocated and freed through the driver inside the steps ({cause.text}). "
    if _native(c):
        return head + (
            "Allocate device and pinned buffers once, before the loop, and reuse "
            "them; where sizes vary, use stream-ordered pools (cudaMallocAsync / "
            "cudaMemPool) instead of cudaMalloc/cudaFree."
        )
    env = "PYTORCH_HIP_ALLOC_CONF" if c.device().vendor == "amd" else "PYTORCH_CUDA_ALLOC_CONF"
    return head + (
        "PyTorch's caching allocator should make these rare: make sure "
        "PYTORCH_NO_CUDA_MEMORY_CACHING is not set and torch.cuda.empty_cache() is "
        f"not called in the loop; set {env}=expandable_segments:True so a "
        "fragmented cache grows instead of freeing and retrying, and keep tensor "
        "shapes stable (pad variable-length batches to a few sizes)."
    )


def _per_element(f: Finding, c: Context) -> str:
    """``"4,096 copies of 4 B a step"`` when the blocking copies are a per-element loop."""
    cause = _figures(f)
    calls = int(cause.calls_per_step or 0)
    size = cause.bytes_median if cause.bytes_median is not None else -1
    if calls >= c.rules.per_element_calls and 0 <= size <= c.rules.per_element_bytes:
        return f"{calls:,} copies of {size} B a step"
    return ""


def _copy_detail(f: Finding, c: Context) -> str:
    cause = _figures(f)
    head = f"Host-device copies block the training thread ({cause.text}). "
    loop = _per_element(f, c)
    if loop:  # the shape decides: thousands of tiny copies are a loop over elements
        if _native(c):
            return head + (
                f"They are a per-element loop ({loop}): copy the whole array with "
                "one cudaMemcpy (or compute the values on the GPU and copy the "
                "result once) instead of one call per element."
            )
        return head + (
            f"They are a per-element loop ({loop}): vectorise it — gather the "
            "values into one tensor on the GPU and copy it once (.tolist() or "
            ".cpu() of the whole tensor instead of .item() per element); pinning "
            "memory would not help copies this small."
        )
    if _native(c):
        return head + (
            "Allocate the host buffers pinned (cudaMallocHost / cudaHostRegister) "
            "and copy with cudaMemcpyAsync on a stream of its own, so copies "
            "overlap the kernels; copy only what the host needs (a residual, not "
            "the grid) and only every N iterations."
        )
    busy = gpu_busy_share(cause.waits_for or {})
    if busy >= c.rules.gpu_busy_share:
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
    return gpu_busy_share(_figures(f).waits_for or {})


def _copy_title(f: Finding, c: Context) -> str:
    api = _figures(f).api
    if _per_element(f, c):
        return f"Vectorise the per-element copy loop ({api} once per element)"
    if _gpu_busy_share(f) >= c.rules.gpu_busy_share:
        return f"Move device-to-host reads out of the step ({api} waits for the GPU)"
    return f"Make host-device copies asynchronous ({api} blocks)"


def _jit_detail(f: Finding, c: Context) -> str:
    cause = _figures(f)
    head = f"Kernels are compiled inside the measured steps ({cause.text}). "
    if _native(c):
        return head + (
            "Compile once and cache the module: load it before the timed loop "
            "(cuModuleLoad once), keep the PTX/cubin cache (CUDA_CACHE_PATH, "
            "CUDA_CACHE_MAXSIZE), or compile ahead of time for the target "
            "architecture (-gencode): nothing is JIT-compiled at run time."
        )
    return head + (
        "Run warm-up iterations before measuring, keep shapes and dtypes stable so "
        "nothing recompiles (TORCH_LOGS=recompiles shows why; mark_dynamic for "
        "varying dimensions), and keep compiled artefacts across runs "
        "(TORCHINDUCTOR_FX_GRAPH_CACHE / the Inductor cache; nvFuser and NVRTC "
        "reuse their kernels once the same fusion is seen)."
    )


def _launch_title(f: Finding, c: Context) -> str:
    if _native(c):
        return "Cut launch overhead: CUDA graphs or fewer, larger kernels"
    graphs = bool(_figures(f).graphs_launched)
    compiled = _compiled(c)
    if graphs and compiled:
        return "Cut launch overhead: larger batches, graphs over the eager parts"
    if graphs:
        return "Cut launch overhead: fuse kernels with torch.compile, larger batches"
    if compiled:
        return "Cut launch and host overhead: CUDA graphs (reduce-overhead), larger batches"
    return "Cut launch and host overhead: CUDA graphs, torch.compile, larger batches"


def _launch_detail(f: Finding, c: Context) -> str:
    cause = _figures(f)
    why = cause.text or "short launch gaps"
    head = f"The GPU waits for the host to issue work ({why}). "
    if _native(c):
        return head + (
            "Capture the iteration in a CUDA graph (cudaStreamBeginCapture / "
            "cudaGraphLaunch) and replay it, fuse small kernels, or give each "
            "kernel more work."
        )
    inf = workload.inference(c.workload())
    graphs = (
        "CUDA graphs are already launched (cudaGraphLaunch/hipGraphLaunch): capture the "
        "parts still run eagerly, "
        if cause.graphs_launched
        else "capture the step in a CUDA graph (torch.cuda.graphs / "
        "torch.compile(mode='reduce-overhead')"
        + (
            "; in an inference engine, keep its CUDA-graph mode on — vLLM without "
            "enforce_eager — for decode steps"
            if inf
            else ""
        )
        + "), "
    )
    fuse = (
        "extend torch.compile to the parts still run eagerly (it is in use), "
        if _compiled(c)
        else "fuse small kernels with torch.compile, "
    )
    rest = graphs + fuse + "and raise the batch size so each kernel does more work."
    return head + rest[:1].upper() + rest[1:]


HOST = (
    COPY_OVERLAP,
    Remedy(
        id=_const("host-sync"),
        title=lambda f, c: f"Take the synchronisation out of the step ({_figures(f).api})",
        detail=_sync_detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=_is("sync"),
    ),
    Remedy(
        id=_const("caching-allocator"),
        title=lambda f, c: (
            "Allocate once, outside the loop (cudaMalloc/cudaFree in the steps)"
            if _native(c)
            else f"Keep the caching allocator on: {_figures(f).api} inside the steps"
        ),
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
    Remedy(
        id=_const("eager-overhead"),
        title=eager_remedy.title,
        detail=eager_remedy.detail,
        gain=_cause_gain,
        evidence=_host_evidence,
        applies=lambda f, c: c.run.mode == Mode.GPU and cause_kind(f) == "eager",
    ),
    Remedy(
        id=_const("host-stalls"),
        title=_stall_title,
        detail=_stall_detail,
        gain=_stall_gain,
        evidence=_host_evidence,
        applies=lambda f, c: (
            c.run.mode == Mode.GPU and (cause_kind(f) or "unknown") in ("python", "unknown")
        ),
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
        applies=lambda f, c: c.run.mode != Mode.GPU and cause_kind(f) != "unknown",
    ),
    Remedy(
        id=_const("host-unseen"),
        title=_const("Capture what the step's thread does"),
        detail=lambda f, c: (
            f"The trace names no cause: {_figures(f).text}, so nothing shows "
            "where the step's time goes. Profile again with CPU activities on, wrap the "
            "step's phases (data loading, forward, backward, optimizer step) in "
            "record_function ranges on the training thread, or sample the process with "
            "py-spy. No gain is given: the trace does not show what the step's thread does."
        ),
        gain=lambda f, c: None,
        evidence=lambda f, c: {
            "other_ns_per_step": _other(f, c),
            "ranks": f.ranks,
            "cause": cause_json(f),
        },
        applies=lambda f, c: c.run.mode != Mode.GPU and cause_kind(f) == "unknown",
    ),
    COPY_LESS,
)
