"""Rules mapping Findings to Recommendations; each cites its evidence and the time it could recover.

No remedy is proposed without a finding behind it, and each carries the numbers that
triggered it. Estimated gains are first-order, per step, and stated as upper bounds:

* data-wait → the worst flagged rank's median data-wait per step (a synchronous step
  waits for the slowest rank's batch);
* exposed communication → only its transfer part counts: comm-wait minus the
  synchronisation wait of matched collectives (waiting for a slower rank is the
  straggler's cost, not the network's); remedies are omitted when under a tenth of the
  wait is transfer. Overlap: up to that exposed transfer per step; gradient
  accumulation over k micro-batches with ``no_sync``: communication per optimizer step ÷ k,
  i.e. a gain of comm-wait × (1 − 1/k) per micro-batch (k = 4 shown); compression to
  fp16/bf16: half the bytes, so up to half the comm-wait when bandwidth-bound;
* straggler → the step time recovered if it ran at the other ranks' speed;
* host-bound → up to the "other" time per step (launch gaps and host overhead);
* pipeline bubble → the schedule bubble saved by 4 micro-batches per stage:
  ((p−1)/(m+p−1) − (p−1)/(4p+p−1)) × step time.

The what-if figures (``Diagnosis.what_if``) model each profiled step as synchronous:
``step ≈ max_r busy_r + min_r wait_r`` — the last rank's own work (busy = step − comm
wait), then the transfer, taken as the least wait of any rank (the last arrival waits only
for the transfer). "Communication fully overlapped" drops the transfer:
``median_s max_r busy``; "no data wait" subtracts each rank's data wait from its busy
time; "straggler at median speed" gives each persistent straggler the median busy time of
the other ranks. The current step time is the median of the longest rank's step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gpudiag.analysis.model import (
    Finding,
    RankSummary,
    Recommendation,
    RunSummary,
    StepBreakdown,
    by_rank,
)

ACCUMULATION_K = 4
MICRO_PER_STAGE = 4


def _median_part(steps: Sequence[StepBreakdown], ranks: Sequence[int], attr: str) -> int:
    """The largest per-rank median of one part over the given ranks' steps."""
    best = 0.0
    grouped = by_rank(steps)
    for r in ranks:
        vals = [getattr(s, attr) for s in grouped.get(r, [])]
        if vals:
            best = max(best, float(np.median(vals)))
    return round(best)


def _exposed_transfer(
    steps: Sequence[StepBreakdown], ranks: Sequence[int], sync: Mapping[tuple[int, int], int]
) -> int:
    """The largest per-rank median of comm-wait minus synchronisation wait per step."""
    best = 0.0
    grouped = by_rank(steps)
    for r in ranks:
        vals = [max(0, s.comm_wait_ns - sync.get((r, s.step), 0)) for s in grouped.get(r, [])]
        if vals:
            best = max(best, float(np.median(vals)))
    return round(best)


def _ranks_of(f: Finding) -> list[int]:
    return f.ranks or []


def recommend(
    run: RunSummary,
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    findings: Sequence[Finding],
    sync_by_step: Mapping[tuple[int, int], int] | None = None,
) -> list[Recommendation]:
    """Recommendations for every actionable finding, most time recovered first.

    ``sync_by_step`` (rank, step) → synchronisation wait from matched collectives: the part
    of a rank's communication wait spent waiting for a slower rank, which no communication
    remedy can recover (see :mod:`gpudiag.analysis.collectives`).
    """
    sync = sync_by_step or {}
    step = max(run.step_time_ns_median, 1)
    by_rank = {r.rank: r for r in ranks}
    out: list[Recommendation] = []

    def add(rid: str, title: str, detail: str, f: Finding, gain: int | None,
            evidence: dict[str, Any]) -> None:  # fmt: skip
        out.append(Recommendation(
            id=rid, title=title, detail=detail, finding=f.kind, evidence=evidence,
            estimated_gain_ns=gain, estimated_gain_ratio=(gain / step) if gain else None,
        ))  # fmt: skip

    for f in findings:
        fr = _ranks_of(f)
        if f.kind == "data_bound":
            gain = _median_part(steps, fr, "data_wait_ns")
            loaders = {str(by_rank[r].evidence.get("data_range", "")) for r in fr if r in by_rank}
            single = any("_SingleProcessDataLoaderIter" in n for n in loaders)
            gpu = run.mode == "gpu"
            detail = (
                ("The loader runs inside the training process (num_workers=0): set "
                 "DataLoader(num_workers=4..8 per GPU, persistent_workers=True"
                 + (", pin_memory=True" if gpu else "") + ") so batches are prepared in "
                 "parallel with the step.") if single else
                ("The loader's workers do not keep up: raise num_workers and "
                 "prefetch_factor, keep persistent_workers=True"
                 + (", use pin_memory=True with non_blocking copies" if gpu else "")
                 + "; if the workers are already busy, the storage or decoding is the limit "
                 "(cache the dataset, use a faster format, or decode on the GPU).")
            )  # fmt: skip
            add("dataloader", "Feed the step faster: DataLoader workers, pinning and prefetch",
                detail, f, gain, {"data_wait_ns_per_step": gain, "ranks": fr,
                                  "per_rank_share": f.metrics.get("per_rank", {}),
                                  "single_process_loader": single})  # fmt: skip
        elif f.kind == "comm_bound":
            wait = _median_part(steps, fr, "comm_wait_ns")
            exposed = _exposed_transfer(steps, fr, sync) if sync else wait
            hidden = f.metrics.get("comm_hidden_ratio", {})
            ev = {"comm_wait_ns_per_step": wait, "ranks": fr, "comm_hidden_ratio": hidden,
                  "transfer_wait_ns_per_step": exposed}  # fmt: skip
            if sync and exposed < 0.1 * wait:
                continue  # the wait is for a slower rank: the straggler remedy covers it
            wait = exposed
            add("comm-overlap", "Hide gradient communication behind backward",
                "Only part of the communication overlaps compute. With DDP keep "
                "find_unused_parameters=False, set gradient_as_bucket_view=True and "
                "static_graph=True where the graph is static, and tune bucket_cap_mb "
                "(smaller buckets start earlier); make sure no synchronising call "
                "(.item(), .cpu(), a barrier) sits between backward and the optimizer step.",
                f, wait, ev)  # fmt: skip
            k = ACCUMULATION_K
            add("grad-accumulation", f"Accumulate gradients over {k} micro-batches with no_sync()",
                f"Communicating once per {k} micro-batches divides the communication per "
                f"sample by {k}: wrap the first {k - 1} backward passes in "
                "`with model.no_sync():` and scale the learning rate or loss accordingly.",
                f, round(wait * (1 - 1 / k)), {**ev, "k": k})  # fmt: skip
            add("grad-compression", "Compress gradients: bf16/fp16 hooks or PowerSGD",
                "model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook) "
                "(or fp16_compress_hook) halves the bytes of every all-reduce; PowerSGD "
                "(powerSGD_hook) cuts them far more for large layers at some accuracy cost.",
                f, wait // 2, ev)  # fmt: skip
            backends = {str(by_rank[r].evidence.get("backend")) for r in fr if r in by_rank}
            if run.mode == "gpu" and "gloo" in backends:
                add("nccl-backend", "Use the NCCL backend for GPU tensors",
                    "init_process_group('nccl'): gloo stages GPU tensors through the host.",
                    f, None, {**ev, "backend": "gloo"})  # fmt: skip
            elif run.mode == "gpu":
                add("nccl-tuning", "Check NCCL's algorithm, protocol and transport",
                    "Compare NCCL_ALGO=Ring and Tree for your message sizes, confirm NCCL "
                    "uses NVLink within a node and InfiniBand/RDMA across nodes "
                    "(NCCL_DEBUG=INFO shows the transport), and use hierarchical or "
                    "topology-aware collectives (HSDP, 2-D process groups) across nodes.",
                    f, None, ev)  # fmt: skip
        elif f.kind == "straggler" and fr:
            r = fr[0]
            excess = int(f.metrics.get("median_excess_ns", 0))
            straggler_gain: int | None = excess if f.persistent else None
            hints = {
                "data": "its input pipeline is slower: check its data shard, storage and "
                        "loader workers; if the slow rank changes between epochs, balance "
                        "sample sizes or sequence lengths across ranks.",
                "compute": "it takes longer for the same work: check uneven sharding, its "
                           "GPU's clocks and temperature (nvidia-smi -q -d CLOCK,TEMPERATURE) "
                           "and other processes on that GPU.",
                "hardware": "its GPU is being slowed by the driver (thermal, power or "
                            "hardware slowdown) or clocks low: move the job off that GPU or "
                            "node and check its cooling and power.",
                "host": "it spends more time on the host outside compute and data: garbage "
                        "collection (gc.freeze() after setup), logging or checkpointing on "
                        "that rank only, or CPU contention (bind ranks to cores/NUMA nodes).",
                "unknown": "profile a window that contains its slow steps to see which part "
                           "grows (gpudiag attach --run RUN_DIR --profile-next N).",
            }  # fmt: skip
            cause = f.cause or "unknown"
            add(f"investigate-rank-{r}", f"Investigate rank {r} ({cause})",
                f"Rank {r} holds every other rank back: {hints.get(cause, hints['unknown'])}",
                f, straggler_gain, {"rank": r, "cause": cause, "wait_caused_ns": f.wait_caused_ns,
                          "persistent": f.persistent, "steps": f.steps,
                          "median_excess_ns": excess})  # fmt: skip
        elif f.kind == "pipeline_bubble":
            pm = f.metrics
            now, at = float(pm["bubble_ratio"]), float(pm["bubble_ratio_at_target"])
            ideal = float(pm["ideal_bubble_ratio"])
            gain = round(max(0.0, ideal - at) * step)
            add("pipeline-microbatches",
                f"Use at least {pm['target_micro_batches']} micro-batches per step "
                f"({MICRO_PER_STAGE}× the {pm['stages']} stages) and a 1F1B schedule",
                f"With m = {pm['micro_batches']} the schedule alone idles {ideal:.0%} of each "
                f"stage; with m = {pm['target_micro_batches']} it would idle {at:.0%}. "
                "Interleaved 1F1B (virtual stages) cuts the bubble further; if the measured "
                f"bubble ({now:.0%}) stays above the schedule's, balance layers across stages.",
                f, gain or None, dict(pm))  # fmt: skip
        elif f.kind == "host_bound":
            other = _median_part(steps, fr, "other_ns")
            if run.mode == "gpu":
                add("launch-bound", "Cut launch and host overhead: CUDA graphs, torch.compile, "
                    "larger batches",
                    "The GPU idles between kernels while the host works: capture the step in "
                    "a CUDA graph (torch.cuda.graphs / torch.compile(mode='reduce-overhead')), "
                    "fuse small kernels with torch.compile, raise the batch size, and remove "
                    "synchronisations (.item(), .cpu(), torch.cuda.synchronize) from the step.",
                    f, other, {"other_ns_per_step": other, "ranks": fr})  # fmt: skip
            else:
                add("host-overhead", "Cut Python overhead in the step",
                    "Time passes outside operators: compile the model (torch.compile), use "
                    "larger batches, and move logging and metric computation out of the step.",
                    f, other, {"other_ns_per_step": other, "ranks": fr})  # fmt: skip
    out.sort(key=lambda r: -(r.estimated_gain_ns or 0))
    return out


def what_if(steps: Sequence[StepBreakdown], findings: Sequence[Finding]) -> dict[str, Any]:
    """First-order step times under three changes (see the module docstring)."""
    if not steps:
        return {}
    by_step: dict[int, list[StepBreakdown]] = {}
    for s in steps:
        by_step.setdefault(s.step, []).append(s)
    stragglers = {
        f.ranks[0] for f in findings if f.kind == "straggler" and f.persistent and f.ranks
    }

    def model(busy: dict[int, float], wait: dict[int, float]) -> float:
        # a synchronous step: the last rank's own work, then the transfer (the least wait)
        return max(busy.values()) + min(wait.values())

    cur, no_comm, no_data, no_strag = [], [], [], []
    for v in by_step.values():
        busy = {x.rank: float(x.duration_ns - x.comm_wait_ns) for x in v}
        wait = {x.rank: float(x.comm_wait_ns) for x in v}
        cur.append(max(x.duration_ns for x in v))
        no_comm.append(max(busy.values()))
        no_data.append(model({x.rank: busy[x.rank] - x.data_wait_ns for x in v}, wait))
        others = [b for r, b in busy.items() if r not in stragglers]
        if stragglers and others:
            med = float(np.median(others))
            no_strag.append(
                model({r: (med if r in stragglers else b) for r, b in busy.items()}, wait)
            )
    out: dict[str, Any] = {
        "step_time_ns": round(float(np.median(cur))),
        "if_comm_overlapped_ns": round(float(np.median(no_comm))),
        "if_no_data_wait_ns": round(float(np.median(no_data))),
        "if_straggler_at_median_speed_ns": round(float(np.median(no_strag))) if no_strag else None,
    }
    return out


def rank_spread(ranks: Sequence[RankSummary]) -> dict[str, Any]:
    """Megatron-style min and max across ranks, with the rank that holds each."""
    if len(ranks) < 2:
        return {}
    metrics: dict[str, Callable[[RankSummary], float]] = {
        "step_time_ns_median": lambda r: r.step_time_ns_median,
        "compute_ratio": lambda r: r.shares.compute,
        "comm_wait_ratio": lambda r: r.shares.comm_wait,
        "data_wait_ratio": lambda r: r.shares.data_wait,
        "idle_ratio": lambda r: r.idle_ratio,
    }
    out: dict[str, Any] = {}
    for name, get in metrics.items():
        lo = min(ranks, key=get)
        hi = max(ranks, key=get)
        out[name] = {"min": get(lo), "min_rank": lo.rank, "max": get(hi), "max_rank": hi.rank}
    return out
