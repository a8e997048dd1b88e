"""One rank's analysis: RankTimeline → RankResult (steps, their classification, evidence).

:func:`rank_result` is the analysis the fan-out's unit of work
(:class:`gpudiag.fanout.work.RankWork`) runs on each rank the API's loading reads, in
worker processes or on a Dask cluster, so only compact per-rank results cross processes.
Without a trace, :func:`telemetry_results` makes the same results from ``gpudiag run``'s
step telemetry.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

import numpy as np

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.analysis.efficiency.measure import efficiency_gap, rank_efficiency
from gpudiag.analysis.model.diagnosis import (
    BetweenSteps,
    EvidenceParts,
    Finding,
    FindingKind,
    GpuIdleInSteps,
    Mode,
    RankEvidence,
    RunStep,
    Severity,
    StepBreakdown,
    StepSource,
    WholeRun,
    by_rank,
)
from gpudiag.analysis.model.metrics import (
    IdleMetrics,
)
from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.rank.classify import (
    RankSets,
    classify_steps,
    copies_alone,
    dominant_names,
    idle_in_steps,
    input_gaps,
    rank_sets,
    time_by_name,
)
from gpudiag.analysis.rank.devices import capability, common_capability
from gpudiag.analysis.rank.evidence import rank_facts
from gpudiag.analysis.rank.hostcause import host_evidence
from gpudiag.analysis.rank.kernels import breakdown as kernel_breakdown
from gpudiag.analysis.rank.timeline import RankLanes, rank_lanes
from gpudiag.analysis.rank.workload import name_counts, recognise
from gpudiag.analysis.reading.excise import excise
from gpudiag.analysis.reading.phases import read_rank
from gpudiag.analysis.reading.steady import steady_steps
from gpudiag.analysis.reading.steps import StepWindows, find_steps
from gpudiag.analysis.run.collectives import (
    Collectives,
    collective_type,
    comm_dtype_shares,
    comm_type_shares,
    extract,
    host_comm_types,
)
from gpudiag.config import Thresholds
from gpudiag.traces.schema import (
    Kind,
    RankMeta,
    RankTimeline,
)


@dataclass
class RankResult:
    """What one rank contributes to a Diagnosis; small enough to cross processes."""

    rank: int
    meta: RankMeta
    mode: Mode
    step_source: StepSource
    steps: list[StepBreakdown]
    notes: list[str] = field(default_factory=list)
    evidence: RankEvidence = field(default_factory=RankEvidence)
    truncated_step: int | None = None
    collectives: Collectives | None = None
    source: str = ""
    step_note: str = ""  # how the steps were found, when not from step markers
    events: int = 0  # how many intervals were loaded (a count, for progress rates)
    lanes: RankLanes | None = None  # the classified timeline, when asked for


TELEMETRY_NOTE = (
    "no profiler trace: diagnosed from the step telemetry alone. Its 'compute' is each "
    "step's busy time — compute and host work together, which only a trace tells apart — "
    "and its data-wait and comm-wait are the job's measured blocking in the DataLoader and "
    "in collectives; a trace adds kernels, launch gaps, overlap and matched collectives: "
    "rerun with --profile-steps A:B within the job's {steps} steps"
)


def telemetry_results(whole: WholeRun, th: Thresholds) -> list[RankResult]:
    """Per-rank results from ``gpudiag run``'s step telemetry when there is no trace.

    Each steady step (:mod:`gpudiag.analysis.reading.steady`) splits into data-wait and comm-wait
    as the job measured them and *busy* = the rest, reported as compute (mode
    ``telemetry``: compute and host work are not told apart, so neither the idle ratio nor
    host-bound is judged from it; NVML's utilisation stands in for the idle ratio).
    """
    keep = steady_steps(whole.steps, th.steady)
    return telemetry_rank_results([s for s in whole.steps if (s.rank, s.step) in keep])


def telemetry_rank_results(steps: Sequence[RunStep]) -> list[RankResult]:
    """Per-rank results of these telemetry steps (data-wait, comm-wait, busy as compute)."""
    out = []
    for rank, mine in sorted(by_rank(steps).items()):
        rows = []
        for s in mine:
            data = min(max(s.data_wait_ns or 0, 0), s.duration_ns)
            comm = min(max(s.comm_wait_ns or 0, 0), s.duration_ns - data)
            rows.append(
                StepBreakdown(
                    rank,
                    s.step,
                    s.start_ns,
                    s.duration_ns,
                    s.duration_ns - data - comm,
                    comm,
                    data,
                    0,
                    0,
                )
            )
        if rows:
            meta = RankMeta(source="step telemetry", fmt="telemetry", rank_from="telemetry")
            out.append(
                RankResult(
                    rank=rank,
                    meta=meta,
                    mode=Mode.TELEMETRY,
                    step_source=StepSource.TELEMETRY,
                    steps=rows,
                    source="step telemetry",
                )
            )
    return out


def nvml_idle(whole: WholeRun, th: Thresholds) -> list[Finding]:
    """Without a trace, the idle ratio comes from NVML: 1 − mean GPU utilisation."""
    idle = {
        g.rank: 1.0 - g.util_ratio
        for g in whole.gpus
        if g.rank is not None and g.util_ratio is not None
    }
    return nvml_idle_findings(idle, th)


def nvml_idle_findings(
    idle: Mapping[int, float], th: Thresholds, over: str = "of the run"
) -> list[Finding]:
    """The NVML idle rule on each rank's 1 − mean GPU utilisation (whole run, or live window)."""
    flagged = {r: v for r, v in idle.items() if v > th.idle_ratio_max}
    if not flagged:
        return []
    lo, hi = min(flagged.values()), max(flagged.values())
    span = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}–{hi:.0%}"
    who = (
        f"rank {next(iter(flagged))}"
        if len(flagged) == 1
        else "ranks " + ", ".join(map(str, sorted(flagged)))
    )
    return [
        Finding(
            kind=FindingKind.IDLE_RATIO,
            severity=Severity.WARNING,
            message=(
                f"{who}: GPU idle {span} {over} by NVML's utilisation (idle ratio above "
                f"the {th.idle_ratio_max:.0%} threshold; no trace to split the steps)"
            ),
            ranks=sorted(flagged),
            metrics=IdleMetrics(
                {str(r): v for r, v in sorted(flagged.items())}, th.idle_ratio_max, source="nvml"
            ),
        )
    ]


def rank_result(tl: RankTimeline, th: Thresholds, timeline: str | None = None) -> RankResult:
    """Steps and their classification for one rank."""
    win = find_steps(tl, th.loader.launch_linked_min_ratio)
    win, keep, reading = read_rank(tl, win, th.reading, th.loader.launch_linked_min_ratio)
    tl, win = excise(tl, win)
    sets = rank_sets(tl, th.comm_op_re)
    parts = classify_steps(tl, win, sets)
    mode = Mode(parts.mode)
    truncated = _truncated(win, mode, th)
    if truncated is not None and keep[-1]:
        keep[-1] = False
    steps = [
        StepBreakdown(
            rank=tl.rank,
            step=int(win.step[i]),
            start_ns=int(win.start[i]),
            duration_ns=int(win.end[i] - win.start[i]),
            compute_ns=int(parts.compute[i]),
            comm_wait_ns=int(parts.comm_wait[i]),
            data_wait_ns=int(parts.data_wait[i]),
            other_ns=int(parts.other[i]),
            comm_overlapped_ns=int(parts.overlapped[i]),
            gpu_ops=int(win.gpu_ops[i]) if mode == Mode.GPU else None,
            gpu_idle_ns=int(parts.gpu_idle[i]) if parts.gpu_idle is not None else None,
        )
        for i in np.flatnonzero(keep).tolist()
    ]
    colls = extract(tl, parts.mode, win.owner, th.comm_op_re)
    evidence = _evidence(tl, win, keep, mode) | _launch_gaps(sets, win, mode, th)
    evidence |= _comm_calls(tl, win, keep)
    on_thread = _host_ops_in_steps(tl, win, keep, step_thread=True)
    evidence["coverage"] = rank_facts(
        tl,
        len(steps),
        sum(s.gpu_ops or 0 for s in steps),
        sum(s.duration_ns for s in steps),
        _host_ops_in_steps(tl, win, keep),
        on_thread,
    )
    evidence |= _workload_and_device(tl)
    evidence["reading"] = reading
    if mode == Mode.GPU:
        evidence |= host_evidence(tl, win, keep, sets)
    top = kernel_breakdown(tl, (win.start[keep], win.end[keep]), gpu=mode == Mode.GPU)
    if mode == Mode.GPU:
        eff = rank_efficiency(tl, (win.start[keep], win.end[keep]))
        if eff is not None:
            evidence["efficiency"] = eff
        else:
            evidence["efficiency_gap"] = efficiency_gap(tl)
    if top is not None:
        evidence["kernels"] = top
    if colls.type:
        evidence["comm_types"] = comm_type_shares(colls)
        evidence["collective_calls"] = _calls_per_step(colls, int(keep.sum()))
        dtypes = comm_dtype_shares(colls)
        if dtypes:
            evidence["comm_dtypes"] = dtypes
        evidence.update(_recv_wait(tl, colls, sets, win, keep))
        if mode == Mode.GPU:
            host = host_comm_types(tl, th.comm_op_re)
            if host:
                evidence["host_comm_types"] = host
    return RankResult(
        rank=tl.rank,
        collectives=colls,
        meta=_compact(tl.meta),
        mode=mode,
        step_source=win.source,
        steps=steps,
        notes=list(tl.meta.notes) + win.notes,
        evidence=RankEvidence.of(evidence),
        truncated_step=truncated,
        source=tl.meta.source,
        step_note=win.notes[0] if win.notes else "",
        events=len(tl),
        lanes=rank_lanes(tl, win, sets, keep, full=timeline == "full") if timeline else None,
    )


def _workload_and_device(tl: RankTimeline) -> EvidenceParts:
    """What the rank runs (analysis/workload.py) and what its GPUs support (devices.py)."""
    out: EvidenceParts = {"workload": recognise(name_counts(tl.names, tl.name))}
    m = tl.meta
    cc, sms = m.compute_capability, m.multiprocessors
    caps = [
        capability(name, cc[i] if i < len(cc) else None, sms[i] if i < len(sms) else None)
        for i, name in enumerate(m.devices)
    ]
    cap = common_capability(caps)
    if cap.known:
        out["device"] = cap.as_dict()
    return out


def _calls_per_step(colls: Collectives, steps: int) -> dict[str, dict[str, float]]:
    """Per collective type: calls per analysed step and the median message size (bytes)."""
    out: dict[str, dict[str, float]] = {}
    types = np.asarray(colls.type, dtype=object)
    for t in sorted(set(colls.type)):
        sel = (types == t) & (colls.step >= 0)
        sizes = colls.nbytes[sel & (colls.nbytes >= 0)]
        out[t] = {
            "per_step": round(int(sel.sum()) / max(steps, 1), 1),
            "bytes_median": float(nputil.median(sizes)) if sizes.size else -1.0,
        }
    return out


def _truncated(win: StepWindows, mode: Mode, th: Thresholds) -> int | None:
    """The last step's number when the profiler stopped while its GPU work was launched."""
    n = len(win)
    if mode == Mode.GPU and n > 1 and win.gpu_ops[-1] < th.truncated_step_ratio * win.gpu_ops[-2]:
        return int(win.step[-1])
    return None


# A blocking communication call (MPI_Sendrecv, gloo:all_reduce), not a user's range around
# several of them (an NVTX range named "MPI"): what the comm-wait of a rank is spent in.
_COMM_CALL = re.compile(r"^P?MPI_[A-Z]|^(gloo|mpi|ucc):")


def _comm_calls(tl: RankTimeline, win: StepWindows, keep: Any) -> EvidenceParts:
    """``comm_calls``: each blocking communication call's time on the host inside the steps.

    Name → ns (its calls' union over the analysed steps), the four longest: the cross-rank
    difference a comm-wait total hides (MPI_Sendrecv on one rank, MPI_Allreduce waiting for
    the others on another).
    """
    host = ~tl.gpu_lane_mask()[tl.lane]
    idx = np.flatnonzero(host & (tl.kind == Kind.COMM))
    if not idx.size or not keep.any():
        return {}
    s, e = win.start[keep], win.end[keep]
    out: dict[str, int] = {}
    for nid in np.unique(tl.name[idx]).tolist():
        name = tl.names[nid]
        if not _COMM_CALL.search(name):
            continue
        mine = idx[tl.name[idx] == nid]
        ns = int(iv.measure(iv.union(tl.start_ns[mine], tl.end_ns[mine]), s, e).sum())
        if ns > 0:
            out[name] = ns
    top = sorted(out.items(), key=lambda kv: -kv[1])[:4]
    return {"comm_calls": dict(top)} if top else {}


def _host_ops_in_steps(
    tl: RankTimeline, win: StepWindows, keep: Any, step_thread: bool = False
) -> int:
    """Host operators and collective ranges (any host thread) starting in the kept steps.

    ``step_thread``: operators alone, on the step's (training) thread only.
    """
    if not len(tl) or not keep.any():
        return 0
    host = ~tl.gpu_lane_mask()[tl.lane] & np.isin(tl.kind, [Kind.CPU_OP, Kind.COMM])
    if step_thread:
        host = (tl.kind == Kind.CPU_OP) & (tl.lane == tl.meta.main_lane)
    s, e = np.sort(win.start[keep]), np.sort(win.end[keep])
    t = tl.start_ns[host]
    k = np.searchsorted(s, t, side="right") - 1
    return int(np.count_nonzero((k >= 0) & (t < e[np.maximum(k, 0)])))


def _compact(meta: RankMeta) -> RankMeta:
    """The rank's metadata without the bulky per-sample series (they become evidence)."""
    return dataclasses.replace(meta, gpu_metrics={}, thread_names={})


def _evidence(tl: RankTimeline, win: StepWindows, keep: Any, mode: Mode) -> EvidenceParts:
    """Names and counts that messages quote: the data range, top collectives, GPU metrics."""
    evidence: EvidenceParts = {}
    data = dominant_names(tl, Kind.DATALOADER, top=1)
    if data:
        evidence["data_range"] = data[0][0]
    comm = dominant_names(tl, Kind.COMM, gpu=mode == Mode.GPU, top=3)
    if comm:
        evidence["comm_top"] = comm[0][0]
        evidence["comm_names"] = [c[0] for c in comm]
    if mode == Mode.GPU:
        evidence["gpu_ops"] = int(win.gpu_ops.sum())
    if tl.meta.backend:
        evidence["backend"] = tl.meta.backend
    if tl.meta.gpu_metrics:
        evidence.update(_gpu_metrics_by_step(tl.meta.gpu_metrics, win, keep))
    if tl.steps.user_ranges:
        between = _between_steps(tl)
        if between is not None:
            evidence["between_steps"] = between
    return evidence


def _recv_wait(
    tl: RankTimeline, colls: Collectives, sets: RankSets, win: StepWindows, keep: Any
) -> EvidenceParts:
    """Time blocked in point-to-point receives with nothing computing, over the kept steps.

    A pipeline stage's bubble: while a ``recv`` is pending and the stage computes nothing,
    it waits for its neighbour. A ``send`` in flight is not waiting. On CPU traces the
    receive calls count as well as the backend's operation ranges: gloo may block in
    either (``c10d::recv_`` or ``gloo:recv``). Waiting at the end of a step for one's own
    sends to be taken is not a receive wait: the next step's first receive holds that
    neighbour's delay (the job's own clock measures the same, see tests/accuracy).
    """
    recv = [i for i, t in enumerate(colls.type) if t == "recv"]
    if not recv:
        return {}
    idx = np.asarray(recv)
    pending = iv.union(colls.start[idx], colls.start[idx] + colls.dur[idx])
    if sets.mode == "cpu":
        is_recv = np.array([collective_type(n) == "recv" for n in tl.names], bool)
        calls = (tl.kind == Kind.COMM) & is_recv[tl.name] & ~tl.gpu_lane_mask()[tl.lane]
        pending = iv.join(pending, iv.union(tl.start_ns[calls], tl.end_ns[calls]))
    s, e = win.start[keep], win.end[keep]
    waiting = iv.measure(iv.subtract(pending, sets.compute), s, e)
    return {
        "p2p_recv_wait_ns": int(waiting.sum()),
        "p2p_recv_wait_ns_per_step": [int(x) for x in waiting],
    }


def _launch_gaps(sets: RankSets, win: StepWindows, mode: Mode, th: Thresholds) -> EvidenceParts:
    """GPU-idle gaps while the host is inside its steps: short ones are launch overhead."""
    if mode != Mode.GPU:
        return {}
    s, e = idle_in_steps(sets, win)
    length = e - s
    short = length < th.advice.launch_gap_ns
    return {
        "copies_alone_ns": copies_alone(sets, win),
        "gpu_idle_in_steps": GpuIdleInSteps(
            total_ns=int(length.sum()),
            short_gaps=int(np.count_nonzero(short)),
            short_gaps_ns=int(length[short].sum()),
            long_gaps=int(np.count_nonzero(~short)),
            long_gap_ns_median=int(nputil.median(length[~short])) if (~short).any() else None,
        ),
    }


def _between_steps(tl: RankTimeline) -> BetweenSteps | None:
    """What the training thread did in the input gaps between its step ranges.

    Blocking OS calls (Nsight's OS-runtime trace) and the ranges inside the gaps, each
    with its share of the gap time: the evidence behind data-wait found between steps.
    """
    gaps = input_gaps(tl)
    total = iv.total(gaps)
    if not total:
        return None
    main = tl.lane == tl.meta.main_lane
    blocked = time_by_name(tl, main & (tl.kind == Kind.OS_WAIT), gaps)
    ranges = time_by_name(tl, main & np.isin(tl.kind, [Kind.ANNOTATION, Kind.DATALOADER]), gaps)
    return BetweenSteps(
        gap_ns=total,
        blocked_in={n: round(t / total, 3) for n, t in blocked},
        ranges={n: round(t / total, 3) for n, t in ranges},
    )


def _gpu_metrics_by_step(
    metrics: dict[str, tuple[list[int], list[float]]], win: StepWindows, keep: Any
) -> EvidenceParts:
    """Mean of each sampled GPU counter (Nsight ``GPU_METRICS``) per step and over all steps.

    Samples are evenly spaced, so the mean of the samples inside a period is its
    time-weighted mean; a step without samples gets ``None``.
    """
    starts, ends = win.start[keep], win.end[keep]
    per_step: dict[str, list[float | None]] = {}
    overall: dict[str, float | None] = {}
    for key, (times, values) in metrics.items():
        t = np.asarray(times, np.int64)
        v = np.asarray(values, np.float64)
        csum = np.concatenate(([0.0], np.cumsum(v)))
        lo, hi = np.searchsorted(t, starts), np.searchsorted(t, ends)
        n = hi - lo
        sums = csum[hi] - csum[lo]
        per_step[key] = [float(x / c) if c else None for x, c in zip(sums, n, strict=True)]
        overall[key] = float(sums.sum() / n.sum()) if n.sum() else None
    return {"gpu_metrics": overall, "gpu_metrics_per_step": per_step}
