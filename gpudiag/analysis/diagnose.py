"""The pipeline: RunTimeline + Thresholds → Diagnosis.

:func:`diagnose` is the one path from inputs to a Diagnosis, for the CLI, the Python API
and the tests alike. It is pure: it reads no files and writes nothing into the timeline.
Each rank source is loaded and analysed by :func:`analyze_source` through the injected
``map`` (worker processes by default, a Dask cluster when asked), so only compact
per-rank results (:class:`RankResult`) come back; :func:`build_diagnosis` then does the
cross-rank work (stragglers, collectives, pipeline, findings, remedies).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudiag import __version__
from gpudiag.analysis import intervals as iv
from gpudiag.analysis import words
from gpudiag.analysis.advice import recommend
from gpudiag.analysis.classify import (
    RankSets,
    classify_steps,
    copies_alone,
    dominant_names,
    idle_in_steps,
    input_gaps,
    rank_sets,
    time_by_name,
)
from gpudiag.analysis.collectives import (
    Collectives,
    SyncByStep,
    analyse,
    bandwidth_findings,
    collective_type,
    comm_type_shares,
    extract,
    host_comm_types,
    match,
)
from gpudiag.analysis.compute import compute_bound
from gpudiag.analysis.idle import idle_findings
from gpudiag.analysis.kernels import breakdown as kernel_breakdown
from gpudiag.analysis.kernels import combine as combine_kernels
from gpudiag.analysis.metrics import (
    CommBoundMetrics,
    IdleMetrics,
    ShareMetrics,
    SourceMissingMetrics,
    WarmupMetrics,
)
from gpudiag.analysis.model import (
    Cause,
    Diagnosis,
    Finding,
    FindingKind,
    Mode,
    PipelineSummary,
    RankEvidence,
    RankSummary,
    RunSummary,
    Severity,
    Shares,
    StepBreakdown,
    StepSource,
    WholeRun,
    by_rank,
)
from gpudiag.analysis.pipeline import analyse_pipeline
from gpudiag.analysis.spread import rank_spread
from gpudiag.analysis.steady import steady_steps, warmup_steps
from gpudiag.analysis.steps import StepWindows, find_steps
from gpudiag.analysis.stragglers import find_stragglers, late_arrival
from gpudiag.analysis.timeline import RankLanes, Timeline, rank_lanes
from gpudiag.analysis.verdict import verdict
from gpudiag.analysis.whatif import what_if
from gpudiag.analysis.wholerun import whole_run
from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.fanout import Mapper, local_map
from gpudiag.traces.schema import (
    Kind,
    RankMeta,
    RankSource,
    RankTimeline,
    RunTimeline,
    check_ranks,
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


def diagnose(
    run: RunTimeline, thresholds: Thresholds | None = None, map: Mapper | None = None
) -> Diagnosis:
    """Diagnose a run: every source analysed through ``map``, then the run as a whole."""
    return _diagnose(run, thresholds, map, None)[0]


def diagnose_with_timeline(
    run: RunTimeline,
    thresholds: Thresholds | None = None,
    map: Mapper | None = None,
    full: bool = False,
) -> tuple[Diagnosis, Timeline]:
    """:func:`diagnose`, and the classified timeline of every rank (the Perfetto view).

    ``full`` keeps the raw kernels (operators on CPU traces) as well.
    """
    d, results = _diagnose(run, thresholds, map, "full" if full else "parts")
    colls = {r.rank: r.collectives for r in results if r.collectives is not None}
    _, matched = match([c for c in colls.values() if len(c.type)])
    lanes = [r.lanes for r in sorted(results, key=lambda r: r.rank) if r.lanes is not None]
    return d, Timeline(lanes, colls, matched)


def _diagnose(
    run: RunTimeline, thresholds: Thresholds | None, map: Mapper | None, timeline: str | None
) -> tuple[Diagnosis, list[RankResult]]:
    th = thresholds or Thresholds()
    mapper = map or local_map()
    work = functools.partial(analyze_source, thresholds=th, timeline=timeline)
    per_source = mapper(work, run.sources)
    results = [r for rs in per_source for r in rs]
    check_ranks(results, [r.source for r in results])
    whole, extra = whole_run(run.telemetry, run.samples, run.manifest, th.steady)
    notes = list(run.notes) + _busy_host(run, th)
    if not results and whole is not None and whole.steps:
        results = telemetry_results(whole, th)
        extra = extra + nvml_idle(whole, th)
        ran = max(len(v) for v in by_rank(whole.steps).values())
        notes.append(TELEMETRY_NOTE.format(steps=ran))
    d = build_diagnosis(results, th, run.inputs, notes, whole_run=whole, extra_findings=extra)
    return d, results


def _busy_host(run: RunTimeline, th: Thresholds) -> list[str]:
    """A note when the run's recorded conditions were contended (the configured gate limits)."""
    from gpudiag.config import gate_config
    from gpudiag.runconditions import contention

    cond = run.manifest.conditions if run.manifest is not None else None
    why = contention(cond, gate_config(th.extra.get("gate")))
    if not why:
        return []
    return [
        "host busy during the run: " + "; ".join(why) + " — step times are slower and "
        "noisier than on a quiet machine (conditions/ in the run directory)"
    ]


TELEMETRY_NOTE = (
    "no profiler trace: diagnosed from the step telemetry alone. Its 'compute' is each "
    "step's busy time — compute and host work together, which only a trace tells apart — "
    "and its data-wait and comm-wait are the job's measured blocking in the DataLoader and "
    "in collectives; a trace adds kernels, launch gaps, overlap and matched collectives: "
    "rerun with --profile-steps A:B within the job's {steps} steps"
)


def telemetry_results(whole: WholeRun, th: Thresholds) -> list[RankResult]:
    """Per-rank results from ``gpudiag run``'s step telemetry when there is no trace.

    Each steady step (:mod:`gpudiag.analysis.steady`) splits into data-wait and comm-wait
    as the job measured them and *busy* = the rest, reported as compute (mode
    ``telemetry``: compute and host work are not told apart, so neither the idle ratio nor
    host-bound is judged from it; NVML's utilisation stands in for the idle ratio).
    """
    keep = steady_steps(whole.steps, th.steady)
    out = []
    for rank, steps in sorted(by_rank(whole.steps).items()):
        rows = []
        for s in steps:
            if (rank, s.step) not in keep:
                continue
            data = min(max(s.data_wait_ns or 0, 0), s.duration_ns)
            comm = min(max(s.comm_wait_ns or 0, 0), s.duration_ns - data)
            rows.append(StepBreakdown(rank, s.step, s.start_ns, s.duration_ns,
                                      s.duration_ns - data - comm, comm, data, 0, 0))  # fmt: skip
        if rows:
            meta = RankMeta(source="step telemetry", fmt="telemetry", rank_from="telemetry")
            out.append(RankResult(rank=rank, meta=meta, mode=Mode.TELEMETRY,
                                  step_source=StepSource.TELEMETRY, steps=rows,
                                  source="step telemetry"))  # fmt: skip
    return out


def nvml_idle(whole: WholeRun, th: Thresholds) -> list[Finding]:
    """Without a trace, the idle ratio comes from NVML: 1 − mean GPU utilisation."""
    idle = {g.rank: 1.0 - g.util_ratio for g in whole.gpus
            if g.rank is not None and g.util_ratio is not None}  # fmt: skip
    flagged = {r: v for r, v in idle.items() if v > th.idle_ratio_max}
    if not flagged:
        return []
    lo, hi = min(flagged.values()), max(flagged.values())
    span = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}–{hi:.0%}"
    who = (f"rank {next(iter(flagged))}" if len(flagged) == 1
           else "ranks " + ", ".join(map(str, sorted(flagged))))  # fmt: skip
    return [Finding(
        kind=FindingKind.IDLE_RATIO,
        severity=Severity.WARNING,
        message=(f"{who}: GPU idle {span} of the run by NVML's utilisation (idle ratio above "
                 f"the {th.idle_ratio_max:.0%} threshold; no trace to split the steps)"),
        ranks=sorted(flagged),
        metrics=IdleMetrics({str(r): v for r, v in sorted(flagged.items())},
                            th.idle_ratio_max, source="nvml"),
    )]  # fmt: skip


def analyze_source(
    source: RankSource, thresholds: Thresholds, timeline: str | None = None
) -> list[RankResult]:
    """Load one source and analyse each of its ranks (the per-rank unit of work).

    ``timeline`` (``parts`` or ``full``) also keeps each rank's classified timeline.
    """
    return [
        dataclasses.replace(analyze_rank(tl, thresholds, timeline), source=source.label)
        for tl in source.load()
    ]


def analyze_rank(tl: RankTimeline, th: Thresholds, timeline: str | None = None) -> RankResult:
    """Steps and their classification for one rank."""
    win = find_steps(tl)
    sets = rank_sets(tl, th.comm_op_re)
    parts = classify_steps(tl, win, sets)
    mode = Mode(parts.mode)
    keep = np.ones(len(win), bool)
    truncated = _truncated(win, mode, th)
    if truncated is not None:
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
        )
        for i in np.flatnonzero(keep).tolist()
    ]
    colls = extract(tl, parts.mode, win.owner, th.comm_op_re)
    evidence = _evidence(tl, win, keep, mode) | _launch_gaps(sets, win, mode, th)
    top = kernel_breakdown(tl, (win.start[keep], win.end[keep]), gpu=mode == Mode.GPU)
    if top is not None:
        evidence["kernels"] = top
    if colls.type:
        evidence["comm_types"] = comm_type_shares(colls)
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


def _truncated(win: StepWindows, mode: Mode, th: Thresholds) -> int | None:
    """The last step's number when the profiler stopped while its GPU work was launched."""
    n = len(win)
    if mode == Mode.GPU and n > 1 and win.gpu_ops[-1] < th.truncated_step_ratio * win.gpu_ops[-2]:
        return int(win.step[-1])
    return None


def _compact(meta: RankMeta) -> RankMeta:
    """The rank's metadata without the bulky per-sample series (they become evidence)."""
    return dataclasses.replace(meta, gpu_metrics={}, thread_names={})


def _evidence(tl: RankTimeline, win: StepWindows, keep: Any, mode: Mode) -> dict[str, Any]:
    """Names and counts that messages quote: the data range, top collectives, GPU metrics."""
    evidence: dict[str, Any] = {}
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
        if between:
            evidence["between_steps"] = between
    return evidence


def _recv_wait(
    tl: RankTimeline, colls: Collectives, sets: RankSets, win: StepWindows, keep: Any
) -> dict[str, Any]:
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
    return {"p2p_recv_wait_ns": int(waiting.sum()),
            "p2p_recv_wait_ns_per_step": [int(x) for x in waiting]}  # fmt: skip


def _launch_gaps(sets: RankSets, win: StepWindows, mode: Mode, th: Thresholds) -> dict[str, Any]:
    """GPU-idle gaps while the host is inside its steps: short ones are launch overhead."""
    if mode != Mode.GPU:
        return {}
    s, e = idle_in_steps(sets, win)
    length = e - s
    short = length < th.advice.launch_gap_ns
    return {"copies_alone_ns": copies_alone(sets, win), "gpu_idle_in_steps": {
        "total_ns": int(length.sum()),
        "short_gaps": int(np.count_nonzero(short)),
        "short_gaps_ns": int(length[short].sum()),
        "long_gaps": int(np.count_nonzero(~short)),
        "long_gap_ns_median": int(np.median(length[~short])) if (~short).any() else None,
    }}  # fmt: skip


def _between_steps(tl: RankTimeline) -> dict[str, Any]:
    """What the training thread did in the input gaps between its step ranges.

    Blocking OS calls (Nsight's OS-runtime trace) and the ranges inside the gaps, each
    with its share of the gap time: the evidence behind data-wait found between steps.
    """
    gaps = input_gaps(tl)
    total = iv.total(gaps)
    if not total:
        return {}
    main = tl.lane == tl.meta.main_lane
    blocked = time_by_name(tl, main & (tl.kind == Kind.OS_WAIT), gaps)
    ranges = time_by_name(tl, main & np.isin(tl.kind, [Kind.ANNOTATION, Kind.DATALOADER]), gaps)
    return {
        "gap_ns": total,
        "blocked_in": {n: round(t / total, 3) for n, t in blocked},
        "ranges": {n: round(t / total, 3) for n, t in ranges},
    }


def _gpu_metrics_by_step(
    metrics: dict[str, tuple[list[int], list[float]]], win: StepWindows, keep: Any
) -> dict[str, Any]:
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


def _percentile(values: np.ndarray[Any, Any], q: float) -> int:
    return round(float(np.percentile(values, q))) if values.size else 0


def _shares(steps: Sequence[StepBreakdown]) -> tuple[Shares, float, float, float | None]:
    """Time-weighted shares, overlapped ratio, idle ratio and hidden ratio of some steps."""
    total = sum(s.duration_ns for s in steps)
    if total <= 0:
        return Shares(0.0, 0.0, 0.0, 0.0), 0.0, 0.0, None
    c = sum(s.compute_ns for s in steps)
    w = sum(s.comm_wait_ns for s in steps)
    d = sum(s.data_wait_ns for s in steps)
    o = sum(s.other_ns for s in steps)
    ov = sum(s.comm_overlapped_ns for s in steps)
    hidden = ov / (ov + w) if (ov + w) > 0 else None
    return Shares(c / total, w / total, d / total, o / total), ov / total, 1.0 - c / total, hidden


def summarize_rank(res: RankResult) -> RankSummary:
    """A rank's summary over its analysed steps."""
    durs = np.array([s.duration_ns for s in res.steps], dtype=np.int64)
    shares, ov, idle, hidden = _shares(res.steps)
    return RankSummary(
        rank=res.rank,
        steps=len(res.steps),
        step_time_ns_median=_percentile(durs, 50),
        step_time_ns_p90=_percentile(durs, 90),
        shares=shares,
        comm_overlapped_ratio=ov,
        comm_hidden_ratio=hidden,
        idle_ratio=idle,
        mode=res.mode,
        step_source=res.step_source,
        source=res.meta.source,
        devices=sorted(set(res.meta.devices))[:1] if res.meta.devices else [],
        notes=res.notes,
        evidence=res.evidence,
    )


def _run_summary(results: Sequence[RankResult], steps: Sequence[StepBreakdown]) -> RunSummary:
    durs = np.array([s.duration_ns for s in steps], dtype=np.int64)
    shares, ov, idle, _ = _shares(steps)
    modes = {r.mode for r in results}
    world = [r.meta.world_size for r in results if r.meta.world_size]
    return RunSummary(
        ranks=len(results),
        world_size=max(world) if world else None,
        steps=len({s.step for s in steps}),
        step_time_ns_median=_percentile(durs, 50),
        step_time_ns_p90=_percentile(durs, 90),
        shares=shares,
        comm_overlapped_ratio=ov,
        idle_ratio=idle,
        mode=modes.pop() if len(modes) == 1 else Mode.MIXED,
    )


def build_diagnosis(
    results: Sequence[RankResult],
    th: Thresholds,
    inputs: Sequence[str] = (),
    notes: Sequence[str] = (),
    whole_run: WholeRun | None = None,
    extra_findings: Sequence[Finding] = (),
) -> Diagnosis:
    """Assemble run summary, findings and the Diagnosis from per-rank results."""
    results = sorted(results, key=lambda r: r.rank)
    results, warm = _without_warmup(results, th)
    ranks = [summarize_rank(r) for r in results]
    steps = [s for r in results for s in r.steps]
    if not steps:
        raise InputError(
            ", ".join(inputs) or "input", "no step could be analysed", "is the trace empty?"
        )
    run = _run_summary(results, steps)
    notes = list(notes) + _step_range_notes(results)
    findings = idle_findings(ranks, steps, th) + _source_findings(results, run) + warm
    findings += list(extra_findings)
    kernels = combine_kernels([r.evidence.kernels for r in ranks])
    findings += compute_bound(run, kernels, th.advice)
    colls = [r.collectives for r in results if r.collectives is not None]
    coll, sync_by_step = analyse(colls, run.world_size, th.collectives)
    findings += bandwidth_findings(coll, th.collectives)
    pipe, pipe_findings = analyse_pipeline(colls, ranks, steps, th.idle_ratio_max, th.pipeline)
    if pipe is not None and coll is not None:
        coll = dataclasses.replace(coll, pipeline=pipe)
        findings = _explained_by_pipeline(findings, pipe, ranks, th)
    findings += pipe_findings
    # telemetry-only steps are the whole-run telemetry itself, not a profiled window
    window = [] if all(r.mode == Mode.TELEMETRY for r in results) else steps
    findings += find_stragglers(window, whole_run, th.stragglers, th.steady, sync_by_step)
    findings += late_arrival(coll, steps, findings, th.stragglers, th.collectives)
    if pipe is not None:
        # a stage's receive waits are the bubble, and stages are not stragglers of each
        # other: the pipeline finding carries both
        stage = set(pipe.stage_ranks)
        findings = _drop_ranks(findings, stage, FindingKind.COMM_BOUND)
        findings = [f for f in findings
                    if not (f.kind == FindingKind.STRAGGLER and set(f.ranks) <= stage)]  # fmt: skip
    findings = _comm_wait_for_stragglers(findings, steps, sync_by_step, th)
    host_stragglers = {
        f.ranks[0] for f in findings
        if f.kind == FindingKind.STRAGGLER and f.cause == Cause.HOST and f.ranks
    }  # fmt: skip
    findings = _drop_host_bound(findings, host_stragglers)
    findings.sort(
        key=lambda f: (
            Severity(f.severity).order,
            -(f.metrics.share() if isinstance(f.metrics, ShareMetrics) else 0),
        )
    )
    return Diagnosis(
        run=run,
        ranks=ranks,
        steps=steps,
        findings=findings,
        recommendations=recommend(run, ranks, steps, findings, sync_by_step, th.advice),
        spread=rank_spread(ranks),
        collectives=coll,
        what_if=what_if(steps, findings),
        inputs=list(inputs),
        thresholds=th.as_dict(),
        notes=list(notes),
        gpudiag_version=__version__,
        whole_run=whole_run,
        verdict=verdict(run, findings),
        kernels=kernels,
    )


def _without_warmup(
    results: list[RankResult], th: Thresholds
) -> tuple[list[RankResult], list[Finding]]:
    """The results without their warm-up steps (analysis/steady.py), and the finding."""
    warm = warmup_steps([s for r in results for s in r.steps], th.steady)
    if not warm:
        return results, []
    kept = [dataclasses.replace(r, steps=[s for s in r.steps if s.step not in warm])
            for r in results]  # fmt: skip
    rest = [s.duration_ns for r in kept for s in r.steps]
    median = float(np.median(rest)) if rest else 0.0
    nums = sorted(warm)
    took = ", ".join(f"{fmt_duration(warm[n])}" for n in nums[:4]) + ("…" if len(nums) > 4 else "")
    which = f"step {nums[0]}" if len(nums) == 1 else f"steps {nums[0]}–{nums[-1]}"
    ratio = max(warm.values()) / median if median else 0.0
    msg = (f"{which}: {took}, warm-up ({ratio:.0f}× the median of the steps after it), left "
           "out of the statistics (--include-warmup keeps it)")  # fmt: skip
    finding = Finding(FindingKind.WARMUP, Severity.INFO, msg, ranks=sorted(r.rank for r in results),
                      steps=nums, metrics=WarmupMetrics({str(n): round(warm[n]) for n in nums},
                                                          round(median)))  # fmt: skip
    return kept, [finding]


def fmt_duration(ns: float) -> str:
    """A duration for a message: seconds from 1 s up, else milliseconds."""
    return f"{ns / 1e9:.2f} s" if ns >= 1e9 else f"{ns / 1e6:.1f} ms"


def _comm_wait_for_stragglers(
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


def _explained_by_pipeline(
    findings: list[Finding], pipe: PipelineSummary, ranks: Sequence[RankSummary], th: Thresholds
) -> list[Finding]:
    """Drop "host-bound" for stages whose idle time the pipeline schedule explains."""
    limit = pipe.ideal_bubble_ratio + th.pipeline.imbalance_margin
    explained = {r.rank for r in ranks if r.rank in pipe.stage_ranks and r.shares.other <= limit}
    return _drop_host_bound(findings, explained)


def _drop_host_bound(findings: list[Finding], explained: set[int]) -> list[Finding]:
    """Remove ranks whose "other" time a more specific finding explains from host_bound.

    A host-side straggler (a rank that sleeps, collects garbage or checkpoints) and a
    pipeline stage's bubble both show as "other": the generic launch-overhead remedy
    would send the user the wrong way.
    """
    return _drop_ranks(findings, explained, FindingKind.HOST_BOUND)


def _drop_ranks(findings: list[Finding], explained: set[int], kind: FindingKind) -> list[Finding]:
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


def _source_findings(results: Sequence[RankResult], run: RunSummary) -> list[Finding]:
    """What the inputs lacked: step markers, GPU activity, ranks, a complete last step."""
    out: list[Finding] = []
    by_note: dict[str, list[int]] = {}
    for r in results:
        if not r.step_source.is_marked:
            by_note.setdefault(r.step_note or f"steps from {r.step_source}", []).append(r.rank)
    for note, ranks in by_note.items():
        out.append(Finding(FindingKind.SOURCE_MISSING, Severity.INFO, note, ranks=ranks,
                           metrics=SourceMissingMetrics("steps")))  # fmt: skip
    cpu_with_gpus = [r.rank for r in results if r.mode == Mode.CPU and r.meta.devices]
    if cpu_with_gpus:
        out.append(Finding(
            FindingKind.SOURCE_MISSING, Severity.WARNING,
            "the trace lists GPUs but holds no GPU activity: classified from CPU threads "
            "(profile with ProfilerActivity.CUDA to see the GPU)",
            ranks=cpu_with_gpus, metrics=SourceMissingMetrics("gpu_events"),
        ))  # fmt: skip
    truncated = [(r.rank, r.truncated_step) for r in results if r.truncated_step is not None]
    if truncated:
        out.append(Finding(
            FindingKind.TRUNCATED_STEP, Severity.INFO,
            "the last profiled step was cut off (far fewer GPU ops than the step before) "
            "and is left out of the statistics",
            ranks=[r for r, _ in truncated],
            steps=sorted({s for _, s in truncated if s is not None}),
        ))  # fmt: skip
    if run.world_size and run.world_size > run.ranks:
        present = sorted(r.rank for r in results)
        out.append(Finding(
            FindingKind.SOURCE_MISSING, Severity.INFO,
            f"{run.ranks} of {run.world_size} ranks {'has' if run.ranks == 1 else 'have'} traces "
            f"({_span(present)}); "
            "cross-rank findings cover only those",
            ranks=present, metrics=SourceMissingMetrics("ranks", world_size=run.world_size),
        ))  # fmt: skip
    return out


def _step_range_notes(results: Sequence[RankResult]) -> list[str]:
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
