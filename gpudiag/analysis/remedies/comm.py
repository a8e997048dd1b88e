"""The remedies for exposed communication (the ``comm_bound`` row of the advice table).

Only the transfer part of the wait counts: comm-wait minus the synchronisation wait of
matched collectives (waiting for a slower rank is the straggler's cost, not the
network's); the remedies are left out when under ``advice.min_transfer_share`` of the wait
is transfer. What the exposed communication is made of decides the remedy: gradient
synchronisation, parameter gathering (FSDP/ZeRO-3), token exchange (mixture of experts) or
point-to-point traffic outside a pipeline; AMD GPUs get RCCL's tools and settings.
"""

import re
from collections.abc import Callable
from typing import TypedDict

from gpudiag.analysis.model.diagnosis import Finding, Mode
from gpudiag.analysis.model.metrics import CommBoundMetrics
from gpudiag.analysis.rank import workload
from gpudiag.analysis.remedies.remedy import Context, Remedy
from gpudiag.analysis.remedies.remedy import const as _const
from gpudiag.analysis.run.collectives import NARROW_FLOAT


def _comm_wait(f: Finding, c: Context) -> int:
    return c.median_part(f.ranks, "comm_wait_ns", "mean")


def _transfer(f: Finding, c: Context) -> int:
    """The exposed transfer per step: comm-wait less the wait for slower ranks.

    The matched collectives' synchronisation wait where there are some, else the
    persistent stragglers' cost (``Context.straggler_wait_ns``): waiting for a straggler is
    recovered by fixing it, not by hiding or shrinking communication. Never more than the
    step's least wait of any rank (``Context.least_wait_ns``): the last rank to arrive
    waits for the transfer alone (the what-if's step model).
    """
    t = c.exposed_transfer(f.ranks) if c.sync else max(0, _comm_wait(f, c) - c.straggler_wait_ns)
    least = c.least_wait_ns
    return t if least is None else min(t, least)


def _overlap_gain(f: Finding, c: Context) -> int | None:
    """What hiding the exposed transfer saves a step.

    The what-if's "comm fully overlapped" (one step model for the what-if and every
    communication remedy: its saving is the step's least wait, the transfer), else the
    transfer (:func:`_transfer`, the part of the wait the remedy can act on).
    """
    gain = c.what_if_gain("if_comm_overlapped_ns")
    return (gain or None) if gain is not None else _transfer(f, c) or None


def _is_transfer(f: Finding, c: Context) -> bool:
    """Enough of the wait is transfer for a communication remedy to help."""
    return _transfer(f, c) >= c.rules.min_transfer_share * _comm_wait(f, c)


class CommEvidence(TypedDict):
    """A communication remedy's evidence: the wait, how much is transfer, what was hidden."""

    comm_wait_ns_per_step: int
    ranks: list[int]
    comm_hidden_ratio: dict[str, float | None]
    transfer_wait_ns_per_step: int


class PatternEvidence(CommEvidence):
    """… and the flagged ranks' dominant communication pattern (:func:`_pattern`)."""

    pattern: str


def _comm_evidence(f: Finding, c: Context) -> CommEvidence:
    return CommEvidence(
        comm_wait_ns_per_step=_comm_wait(f, c),
        ranks=f.ranks,
        comm_hidden_ratio=f.metrics_as(CommBoundMetrics).comm_hidden_ratio,
        transfer_wait_ns_per_step=_transfer(f, c),
    )


def _k(c: Context) -> int:
    return c.rules.accumulation_micro_batches


def _backends(f: Finding, c: Context) -> set[str]:
    return {e.backend or "" for e in c.evidence(f.ranks)}


# What the exposed communication is made of decides the remedy: gradient synchronisation
# (DDP's all-reduce, ZeRO/FSDP's reduce-scatter), parameter gathering (FSDP's all-gather),
# token exchange (MoE's all-to-all), or point-to-point traffic outside a pipeline.
PATTERNS = {
    "allreduce": "gradients",
    "reducescatter": "gradients",
    "allgather": "parameters",
    "alltoall": "tokens",
    "send": "p2p",
    "recv": "p2p",
    "sendrecv": "p2p",
}


def _pattern(f: Finding, c: Context) -> str:
    """The flagged ranks' dominant communication pattern (``gradients`` by default).

    A ``SendRecv`` kernel's share is split by the host-side operations of the rank
    (``nccl:all_to_all`` or ``nccl:send``): NCCL runs both with the same kernel.
    """
    share: dict[str, float] = {}
    for ev in c.evidence(f.ranks):
        host = {t: v for t, v in (ev.host_comm_types or {}).items() if t != "sendrecv"}
        for t, v in (ev.comm_types or {}).items():
            split = host if t == "sendrecv" and host else {t: 1.0}
            norm = sum(split.values())
            for ht, hv in split.items():
                p = PATTERNS.get(ht, "other")
                share[p] = share.get(p, 0.0) + float(v) * hv / norm
    return max(share, key=lambda k: share[k]) if share else "gradients"


def _amd(f: Finding, c: Context) -> bool:
    """The GPUs are AMD's (ROCm/RCCL): different tools and settings apply."""
    names = " ".join(d for r in f.ranks if r in c.ranks for d in c.ranks[r].devices)
    return (
        bool(re.search(r"\bAMD\b|Instinct|\bMI\d{3}|Radeon", names))
        or "rccl" in " ".join(n for e in c.evidence(f.ranks) for n in e.comm_names or []).lower()
    )


def _native(c: Context) -> bool:
    """A C/C++/CUDA/MPI program: GPU work without any PyTorch name in the ranks read."""
    read = [r.evidence.workload for r in c.ranks.values() if r.evidence.workload is not None]
    return bool(read) and workload.native_program(c.workload())


def _for(*patterns: str) -> Callable[[Finding, Context], bool]:
    # an inference engine has no gradients: its collectives get their own remedy
    def applies(f: Finding, c: Context) -> bool:
        if _native(c):  # a C/C++/MPI program has no DDP, FSDP or optimizer to tune
            return False
        training = {"gradients", "parameters"} & set(patterns)
        if training and (workload.inference(c.workload()) or not _trains(c)):
            return False
        return _is_transfer(f, c) and _pattern(f, c) in patterns

    return applies


def _trains(c: Context) -> bool:
    """Evidence of gradients to synchronise, from the names of the ranks read.

    A backward pass or optimizer step, DDP's reducer or FSDP/ZeRO (workload tags
    ``training``, ``ddp``, ``fsdp``).

    Collectives alone (a few ``gloo:all_reduce`` ranges on side threads beside four
    ``aten::empty``) are no evidence of gradients. Without any rank's names read, nothing
    says otherwise, and the gradient remedies stay.
    """
    read = [r.evidence.workload for r in c.ranks.values() if r.evidence.workload is not None]
    return not read or bool({"training", "ddp", "fsdp"} & set(c.workload()))


def _names(c: Context, f: Finding, tag: str) -> str:
    """Up to two names behind a workload tag, for the text."""
    hit = c.workload(f.ranks).get(tag) or c.workload().get(tag)
    names = hit["names"] if hit else []
    return ", ".join(names[:2]) or tag


def _quantised(c: Context, f: Finding) -> bool:
    """The embedding exchange is already quantised (FBGEMM FP8/8-bit row-wise codecs)."""
    return "quantised_comms" in c.workload(f.ranks)


def _deepep(c: Context, f: Finding) -> bool:
    hit = c.workload(f.ranks).get("moe")
    names = hit["names"] if hit else []
    return any(re.search(r"(?i)deep_?ep", n) for n in names)


def _allreduce_calls(f: Finding, c: Context) -> tuple[float, float]:
    """The flagged ranks' all-reduces a step and their median size (largest rank's)."""
    per, size = 0.0, -1.0
    for e in c.evidence(f.ranks):
        row = (e.collective_calls or {}).get("allreduce") or {}
        if float(row.get("per_step", 0.0)) > per:
            per, size = float(row.get("per_step", 0.0)), float(row.get("bytes_median", -1.0))
    return per, size


def _overlap_detail(f: Finding, c: Context) -> str:
    per, size = _allreduce_calls(f, c)
    # many small all-reduces a step: each pays the latency; larger buckets, not smaller
    if per >= c.rules.many_allreduce_calls and 0 <= size < c.rules.small_allreduce_bytes:
        buckets = (
            f"It issues {per:.0f} all-reduces a step of {size / 1024:.0f} KiB (median): "
            "each pays the collective's latency, so raise bucket_cap_mb (fewer, larger "
            "buckets) — or, outside DDP, flatten the gradients into a few buffers "
            "(torch._utils._flatten_dense_tensors, a fused optimizer's "
            "buckets)"
        )
    else:
        buckets = "tune bucket_cap_mb (smaller buckets start earlier)"
    return (
        "Only part of the gradient synchronisation overlaps compute. With DDP keep "
        "find_unused_parameters=False, set gradient_as_bucket_view=True and "
        f"static_graph=True where the graph is static; {buckets}; make sure no "
        "synchronising call (.item(), .cpu(), a barrier) sits between backward and the "
        "optimizer step."
    )


def _comm_evidence_with_pattern(f: Finding, c: Context) -> PatternEvidence:
    return PatternEvidence(**_comm_evidence(f, c), pattern=_pattern(f, c))


def _narrow_grads(f: Finding, c: Context) -> tuple[float, str]:
    """The share of gradient collectives' time in a float type of at most 16 bits.

    Over the flagged ranks (``evidence.comm_dtypes``), with the largest such type.
    """
    narrow = whole = 0.0
    by_type: dict[str, float] = {}
    for ev in c.evidence(f.ranks):
        for t in ("allreduce", "reducescatter"):
            w = (ev.comm_types or {}).get(t, 0.0)
            whole += w
            for d, v in (ev.comm_dtypes or {}).get(t, {}).items():
                if d in NARROW_FLOAT:
                    narrow += w * v
                    by_type[d] = by_type.get(d, 0.0) + w * v
    top = max(by_type, key=lambda k: by_type[k]) if by_type else ""
    return (narrow / whole if whole else 0.0), top


def _already_16bit(f: Finding, c: Context) -> bool:
    """The gradients already travel in 16 bits: a bf16/fp16 hook would not shrink them."""
    return _narrow_grads(f, c)[0] >= c.rules.narrow_grad_comm_share


def _compression_detail(f: Finding, c: Context) -> str:
    if not _already_16bit(f, c):
        return (
            "model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook) "
            "(or fp16_compress_hook) halves the bytes of every all-reduce; PowerSGD "
            "(powerSGD_hook) cuts them far more for large layers at some accuracy cost."
        )
    share, dt = _narrow_grads(f, c)
    return (
        f"The gradient collectives already carry {dt} ({share:.0%} of their time), so "
        "bf16/fp16 compression hooks would not shrink them. PowerSGD "
        "(powerSGD_hook, low-rank) cuts the bytes of large layers further, at some "
        "accuracy cost; how much it saves depends on the rank chosen, so no gain is "
        "given."
    )


def _tuning_detail(f: Finding, c: Context) -> str:
    if _amd(f, c):
        return (
            "Compare RCCL's algorithms and protocols for your message sizes (RCCL honours "
            "NCCL_ALGO / NCCL_PROTO; see also RCCL_* settings), confirm traffic uses xGMI "
            "within a node (rocm-smi --showtopo, rccl-tests) and RDMA across nodes "
            "(NCCL_DEBUG=INFO shows the transport), and trace the transfers with "
            "rocprofv3 or omnitrace."
        )
    return (
        "Compare NCCL_ALGO=Ring and Tree for your message sizes, confirm NCCL uses NVLink "
        "within a node and InfiniBand/RDMA across nodes (NCCL_DEBUG=INFO shows the "
        "transport; nvidia-smi topo -m the links), and use hierarchical or topology-aware "
        "collectives (HSDP, 2-D process groups) across nodes."
    )


COMM = (
    Remedy(
        id=_const("native-comm-overlap"),
        title=_const("Overlap the program's communication with its computation"),
        detail=_const(
            "The program waits in its own communication calls (MPI or a library of its own), "
            "not in PyTorch collectives. Post halo or boundary exchanges early with "
            "non-blocking calls (MPI_Isend/MPI_Irecv, then MPI_Waitall) and compute the "
            "interior while they are in flight; with GPU buffers use a CUDA-aware MPI or "
            "NCCL/NVSHMEM so that no host staging copy sits between the two, and check the "
            "ranks-to-GPUs binding against the topology (nvidia-smi topo -m)."
        ),
        gain=_overlap_gain,
        evidence=_comm_evidence_with_pattern,
        applies=lambda f, c: _native(c) and _is_transfer(f, c),
    ),
    Remedy(
        id=_const("comm-overlap"),
        title=_const("Hide gradient communication behind backward"),
        detail=_overlap_detail,
        gain=_overlap_gain,
        evidence=_comm_evidence_with_pattern,
        applies=_for("gradients"),
    ),
    Remedy(
        id=_const("grad-accumulation"),
        title=lambda f, c: f"Accumulate gradients over {_k(c)} micro-batches with no_sync()",
        detail=lambda f, c: (
            f"Communicating once per {_k(c)} micro-batches divides the communication per "
            f"sample by {_k(c)}: wrap the first {_k(c) - 1} backward passes in "
            "`with model.no_sync():` and scale the learning rate or loss accordingly."
        ),
        gain=lambda f, c: round((_overlap_gain(f, c) or 0) * (1 - 1 / _k(c))) or None,
        evidence=lambda f, c: {**_comm_evidence_with_pattern(f, c), "k": _k(c)},
        applies=_for("gradients"),
    ),
    Remedy(
        id=_const("grad-compression"),
        title=lambda f, c: (
            "Compress gradients further: PowerSGD"
            if _already_16bit(f, c)
            else "Compress gradients: bf16/fp16 hooks or PowerSGD"
        ),
        detail=_compression_detail,
        # half the bytes (a 16-bit hook); none when the gradients are 16-bit already
        gain=lambda f, c: None if _already_16bit(f, c) else (_overlap_gain(f, c) or 0) // 2 or None,
        evidence=lambda f, c: {
            **_comm_evidence_with_pattern(f, c),
            "narrow_grad_comm_share": round(_narrow_grads(f, c)[0], 4),
        },
        applies=_for("gradients"),
    ),
    Remedy(
        id=_const("fsdp-prefetch"),
        title=_const("Prefetch parameter all-gathers (FSDP/ZeRO-3)"),
        detail=_const(
            "The exposed communication is mostly all-gathers of sharded parameters: enable "
            "forward_prefetch=True and backward_prefetch=BACKWARD_PRE (FSDP2: "
            "set_modules_to_forward_prefetch / reshard_after_forward=False for the last "
            "blocks), wrap larger units so fewer, bigger gathers run, and keep "
            "limit_all_gathers so prefetching does not stall on memory."
        ),
        gain=_overlap_gain,
        evidence=_comm_evidence_with_pattern,
        applies=_for("parameters"),
    ),
    Remedy(
        id=_const("embedding-all-to-all"),
        title=_const("Pipeline and shrink the sparse-embedding all-to-alls (TorchRec)"),
        detail=lambda f, c: (
            "The exposed communication is the all-to-all of sharded embeddings (TorchRec/"
            f"FBGEMM: {_names(c, f, 'torchrec')}): its input distribution (KJTAllToAll) and "
            "pooled-embedding exchange. Overlap the next batch's input distribution with the "
            "current step (TrainPipelineSparseDist, or the semi-synchronous pipeline), revisit "
            "the sharding plan (EmbeddingShardingPlanner: table-wise for small tables, "
            "row- or column-wise for large ones, data-parallel for tiny ones, so fewer "
            "lookups cross ranks)"
            + (
                "; the embeddings are already exchanged in FP8, so quantising them further is "
                "not the lever"
                if _quantised(c, f)
                else ", and quantise the exchanged embeddings (QCommsConfig with fp16/bf16 "
                "forward and backward precision)"
            )
            + ". Mixture-of-experts and DDP gradient remedies do not apply to this traffic."
        ),
        gain=_transfer,
        evidence=lambda f, c: {**_comm_evidence_with_pattern(f, c), "workload": "torchrec"},
        applies=lambda f, c: _for("tokens")(f, c) and workload.sparse_embeddings(c.workload()),
    ),
    Remedy(
        id=_const("moe-all-to-all"),
        title=_const("Cut and hide the all-to-all token exchange (expert parallelism)"),
        detail=lambda f, c: (
            "The exposed communication is the mixture-of-experts dispatch and combine "
            f"({_names(c, f, 'moe')}): lower the capacity factor or drop overflow tokens, "
            "use a hierarchical all-to-all (intra-node first, then across nodes), and "
            "overlap dispatch/combine with expert compute"
            + (
                " (DeepEP is already in use: overlap its low-latency kernels with the next "
                "micro-batch, and balance experts across ranks)"
                if _deepep(c, f)
                else " (chunked or pipelined all-to-all, e.g. DeepEP or Tutel)"
            )
            + ". DDP's gradient remedies do not apply to this traffic."
        ),
        gain=_transfer,
        evidence=lambda f, c: {**_comm_evidence_with_pattern(f, c), "workload": "moe"},
        # DeepEP's dispatch/combine kernels are no NCCL collective type: "other" counts
        applies=lambda f, c: (
            _is_transfer(f, c)
            and workload.expert_parallel(c.workload())
            and _pattern(f, c) in ("tokens", "other")
        ),
    ),
    Remedy(
        id=_const("all-to-all"),
        title=_const("Cut and hide the all-to-all exchanges"),
        detail=_const(
            "The exposed communication is mostly all-to-all: exchange fewer, larger messages "
            "(batch the exchanges of a step), use a hierarchical all-to-all (intra-node "
            "first, then across nodes), and start it early enough to overlap compute that "
            "does not depend on it. DDP's gradient remedies do not apply to this traffic."
        ),
        gain=_overlap_gain,
        evidence=_comm_evidence_with_pattern,
        applies=lambda f, c: (
            _for("tokens")(f, c)
            and not workload.sparse_embeddings(c.workload())
            and not workload.expert_parallel(c.workload())
        ),
    ),
    Remedy(
        id=_const("inference-collectives"),
        title=_const("Cut the tensor-parallel collectives of inference"),
        detail=_const(
            "An inference engine's all-reduces and all-gathers carry activations, not "
            "gradients: use the engine's custom or NVLS all-reduce for small messages (vLLM's "
            "custom all-reduce, NCCL_NVLS_ENABLE=1 on NVSwitch systems), fuse the all-reduce "
            "with the following norm where the engine offers it, overlap it with the next "
            "layer's GEMM, or use fewer tensor-parallel ranks (more data or pipeline "
            "parallelism) when batches are small."
        ),
        gain=_transfer,
        evidence=lambda f, c: {**_comm_evidence_with_pattern(f, c), "workload": "inference"},
        applies=lambda f, c: (
            _is_transfer(f, c)
            and workload.inference(c.workload())
            and _pattern(f, c) in ("gradients", "parameters")
        ),
    ),
    Remedy(
        id=_const("p2p-overlap"),
        title=_const("Post point-to-point transfers early and batch them"),
        detail=_const(
            "The exposed communication is point-to-point send/recv outside a pipeline "
            "schedule: post irecv before the compute that precedes its use, batch pairs "
            "with dist.batch_isend_irecv, and wait only where the data is needed."
        ),
        gain=_overlap_gain,
        evidence=_comm_evidence_with_pattern,
        applies=_for("p2p"),
    ),
    Remedy(
        id=_const("nccl-backend"),
        title=_const("Use the NCCL backend for GPU tensors"),
        detail=_const("init_process_group('nccl'): gloo stages GPU tensors through the host."),
        gain=lambda f, c: None,
        evidence=lambda f, c: {**_comm_evidence(f, c), "backend": "gloo"},
        applies=lambda f, c: (
            _is_transfer(f, c) and c.run.mode == Mode.GPU and "gloo" in _backends(f, c)
        ),
    ),
    Remedy(
        id=lambda f, c: "rccl-tuning" if _amd(f, c) else "nccl-tuning",
        title=lambda f, c: (
            "Check RCCL's algorithm, protocol and transport (xGMI, RDMA)"
            if _amd(f, c)
            else "Check NCCL's algorithm, protocol and transport"
        ),
        detail=_tuning_detail,
        gain=lambda f, c: None,
        evidence=_comm_evidence_with_pattern,
        applies=lambda f, c: (
            _is_transfer(f, c)
            and c.run.mode == Mode.GPU
            and "gloo" not in _backends(f, c)
            and not _native(c)
        ),
    ),
)
