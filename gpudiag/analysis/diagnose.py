"""The pipeline: RunTimeline + Thresholds → Diagnosis.

:func:`analyze_rank` is the per-rank unit of work (steps, classification, evidence); it is
pure and runs in worker processes when several ranks are read. :func:`build_diagnosis`
turns per-rank results into the run summary and findings.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpudiag import __version__
from gpudiag.analysis.advice import rank_spread, recommend, what_if
from gpudiag.analysis.classify import classify_steps, dominant_names
from gpudiag.analysis.collectives import Collectives, analyse, bandwidth_findings, extract
from gpudiag.analysis.idle import idle_findings
from gpudiag.analysis.model import (
    Diagnosis,
    Finding,
    RankSummary,
    RunSummary,
    Shares,
    StepBreakdown,
    WholeRun,
)
from gpudiag.analysis.pipeline import analyse_pipeline
from gpudiag.analysis.steps import find_steps
from gpudiag.analysis.stragglers import find_stragglers
from gpudiag.analysis.wholerun import whole_run
from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline, RunTimeline


@dataclass
class RankResult:
    """What one rank contributes to a Diagnosis; small enough to cross processes."""

    rank: int
    meta: RankMeta
    mode: str
    step_source: str
    steps: list[StepBreakdown]
    notes: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    truncated_step: int | None = None
    collectives: Collectives | None = None


def analyze_rank(tl: RankTimeline, th: Thresholds) -> RankResult:
    """Steps and their classification for one rank."""
    win = find_steps(tl, th.step_re)
    parts = classify_steps(tl, win)
    n = len(win)
    keep = np.ones(n, bool)
    truncated = None
    if (
        parts.mode == "gpu"
        and n > 1
        and win.gpu_ops[-1] < th.truncated_step_ratio * win.gpu_ops[-2]
    ):
        # The profiler stopped while this step's GPU work was still being launched or run.
        keep[-1] = False
        truncated = int(win.step[-1])
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
            gpu_ops=int(win.gpu_ops[i]) if parts.mode == "gpu" else None,
        )
        for i in np.flatnonzero(keep).tolist()
    ]
    evidence: dict[str, Any] = {}
    data = dominant_names(tl, Kind.DATALOADER, top=1)
    if data:
        evidence["data_range"] = data[0][0]
    comm = dominant_names(tl, Kind.COMM, gpu=parts.mode == "gpu", top=3)
    if comm:
        evidence["comm_top"] = comm[0][0]
        evidence["comm_names"] = [c[0] for c in comm]
    if parts.mode == "gpu":
        evidence["gpu_ops"] = int(win.gpu_ops.sum())
    if tl.meta.backend:
        evidence["backend"] = tl.meta.backend
    if tl.meta.extra.get("gpu_metrics"):
        evidence.update(_gpu_metrics_by_step(tl.meta.extra["gpu_metrics"], win, keep))
    colls = extract(tl, parts.mode)
    return RankResult(
        rank=tl.rank,
        collectives=colls,
        meta=tl.meta,
        mode=parts.mode,
        step_source=win.source,
        steps=steps,
        notes=list(tl.meta.notes) + win.notes,
        evidence=evidence,
        truncated_step=truncated,
    )


def _gpu_metrics_by_step(metrics: dict[str, Any], win: Any, keep: Any) -> dict[str, Any]:
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


def _pct(values: np.ndarray[Any, Any], q: float) -> int:
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
        step_time_ns_median=_pct(durs, 50),
        step_time_ns_p90=_pct(durs, 90),
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
    ranks = [summarize_rank(r) for r in results]
    steps = [s for r in results for s in r.steps]
    if not steps:
        raise InputError(
            ", ".join(inputs) or "input", "no step could be analysed", "is the trace empty?"
        )
    durs = np.array([s.duration_ns for s in steps], dtype=np.int64)
    shares, ov, idle, _ = _shares(steps)
    modes = {r.mode for r in ranks}
    world = [r.meta.world_size for r in results if r.meta.world_size]
    run = RunSummary(
        ranks=len(ranks),
        world_size=max(world) if world else None,
        steps=len({s.step for s in steps}),
        step_time_ns_median=_pct(durs, 50),
        step_time_ns_p90=_pct(durs, 90),
        shares=shares,
        comm_overlapped_ratio=ov,
        idle_ratio=idle,
        mode=modes.pop() if len(modes) == 1 else "mixed",
    )
    findings = idle_findings(ranks, steps, th) + _source_findings(results, run)
    findings += list(extra_findings)
    coll = analyse([r.collectives for r in results if r.collectives is not None], run.world_size)
    sync_by_step = coll.pop("_sync_by_step", {})
    findings += bandwidth_findings(coll)
    pipe, pipe_findings = analyse_pipeline(
        [r.collectives for r in results if r.collectives is not None], ranks, th.idle_ratio_max
    )
    if pipe:
        coll["pipeline"] = pipe
        findings = _explained_by_pipeline(findings, pipe, ranks)
    findings += pipe_findings
    findings += find_stragglers(
        steps, whole_run, whole_run.gpus if whole_run else (), sync_by_step=sync_by_step
    )
    findings = _comm_wait_for_stragglers(findings, steps, sync_by_step)
    host_stragglers = {
        f.ranks[0] for f in findings if f.kind == "straggler" and f.cause == "host" and f.ranks
    }
    findings = _drop_host_bound(findings, host_stragglers)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(
        key=lambda f: (
            order.get(f.severity, 3),
            -max(f.metrics.get("per_rank", {0: 0}).values(), default=0),
        )
    )
    return Diagnosis(
        run=run,
        ranks=ranks,
        steps=steps,
        findings=findings,
        recommendations=recommend(run, ranks, steps, findings, sync_by_step),
        spread=rank_spread(ranks),
        collectives=coll,
        what_if=what_if(steps, findings),
        inputs=list(inputs),
        thresholds=th.as_dict(),
        notes=list(notes),
        gpudiag_version=__version__,
        whole_run=whole_run,
    )


def _comm_wait_for_stragglers(
    findings: list[Finding], steps: Sequence[StepBreakdown], sync: dict[tuple[int, int], int]
) -> list[Finding]:
    """Say so when a comm-bound rank mostly waits for other ranks rather than the network.

    With a straggler named, the straggler finding carries the lost time and this one drops
    to ``info``; without one (the ranks take turns being late), the waiting is load
    imbalance between ranks, still lost time, and the finding keeps its severity.
    """
    if not sync:
        return findings
    slow = [f.ranks[0] for f in findings if f.kind == "straggler" and f.ranks]
    out = []
    for f in findings:
        if f.kind == "comm_bound":
            wait = sum(s.comm_wait_ns for s in steps if s.rank in f.ranks)
            # sync waits span whole collectives (hidden parts too): cap at the exposed wait
            waited = min(sum(v for (r, _), v in sync.items() if r in f.ranks), wait)
            share = waited / wait if wait else 0.0
            metrics = {**f.metrics, "sync_wait_share": share}
            if share > 0.5 and slow:
                who = ", ".join(map(str, slow))
                f = dataclasses.replace(
                    f,
                    severity="info",
                    message=f"{f.message}; {share:.0%} of it is waiting for the "
                    f"straggler (rank {who}), not transfer",
                    metrics=metrics,
                )
            elif share > 0.5:
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
    findings: list[Finding], pipe: dict[str, Any], ranks: Sequence[RankSummary]
) -> list[Finding]:
    """Drop "host-bound" for stages whose idle time the pipeline schedule explains."""
    limit = float(pipe["ideal_bubble_ratio"]) + 0.10
    explained = {r.rank for r in ranks if r.rank in pipe["stage_ranks"] and r.shares.other <= limit}
    return _drop_host_bound(findings, explained)


def _drop_host_bound(findings: list[Finding], explained: set[int]) -> list[Finding]:
    """Remove ranks whose "other" time a more specific finding explains from host_bound.

    A host-side straggler (a rank that sleeps, collects garbage or checkpoints) and a
    pipeline stage's bubble both show as "other": the generic launch-overhead remedy
    would send the user the wrong way.
    """
    if not explained:
        return findings
    out = []
    for f in findings:
        if f.kind == "host_bound":
            left = [r for r in f.ranks if r not in explained]
            if not left:
                continue
            if len(left) != len(f.ranks):
                per = {k: v for k, v in f.metrics.get("per_rank", {}).items() if int(k) in left}
                f = dataclasses.replace(f, ranks=left, metrics={**f.metrics, "per_rank": per})
        out.append(f)
    return out


def _source_findings(results: Sequence[RankResult], run: RunSummary) -> list[Finding]:
    """What the inputs lacked: step markers, GPU activity, ranks, a complete last step."""
    out: list[Finding] = []
    by_source: dict[str, list[int]] = {}
    for r in results:
        if r.step_source != "ProfilerStep":
            by_source.setdefault(r.step_source, []).append(r.rank)
    for source, ranks in by_source.items():
        msg = {
            "optimizer": "no ProfilerStep markers: steps inferred from Optimizer.step ranges",
            "whole": "no step markers: the whole trace was analysed as one window",
        }.get(source, f"steps from {source}")
        out.append(
            Finding("source_missing", "info", msg, ranks=ranks, metrics={"missing": "steps"})
        )
    cpu_with_gpus = [r.rank for r in results if r.mode == "cpu" and r.meta.devices]
    if cpu_with_gpus:
        out.append(Finding(
            "source_missing", "warning",
            "the trace lists GPUs but holds no GPU activity: classified from CPU threads "
            "(profile with ProfilerActivity.CUDA to see the GPU)",
            ranks=cpu_with_gpus, metrics={"missing": "gpu_events"},
        ))  # fmt: skip
    truncated = [(r.rank, r.truncated_step) for r in results if r.truncated_step is not None]
    if truncated:
        out.append(Finding(
            "truncated_step", "info",
            "the last profiled step was cut off (far fewer GPU ops than the step before) "
            "and is left out of the statistics",
            ranks=[r for r, _ in truncated],
            steps=sorted({s for _, s in truncated if s is not None}),
        ))  # fmt: skip
    if run.world_size and run.world_size > run.ranks:
        present = sorted(r.rank for r in results)
        out.append(Finding(
            "source_missing", "info",
            f"{run.ranks} of {run.world_size} ranks have traces ({_span(present)}); "
            "cross-rank findings cover only those",
            ranks=present, metrics={"missing": "ranks", "world_size": run.world_size},
        ))  # fmt: skip
    return out


def _span(ranks: list[int]) -> str:
    if len(ranks) <= 6:
        return (
            "rank " + ", ".join(map(str, ranks))
            if len(ranks) == 1
            else "ranks " + ", ".join(map(str, ranks))
        )
    return f"ranks {ranks[0]}…{ranks[-1]}"


def diagnose(run: RunTimeline, thresholds: Thresholds | None = None) -> Diagnosis:
    """Diagnose an already loaded RunTimeline (pure)."""
    th = thresholds or Thresholds()
    results = [analyze_rank(tl, th) for tl in run.ranks]
    return build_diagnosis(results, th, [tl.meta.source for tl in run.ranks], run.notes)


def _analyze_input(inp: Any, th: Thresholds) -> list[RankResult]:
    from gpudiag.traces.load import load_ranks

    # One input may hold several ranks (an Nsight report of a node); a loader may name its
    # own step pattern in meta.extra["step_re"] (nsys: gpudiag's NVTX step ranges too).
    return [
        analyze_rank(tl, th.replace(step_re=tl.meta.extra.get("step_re")))
        for tl in load_ranks(inp, th)
    ]


def analyze_paths(
    *paths: str | os.PathLike[str],
    thresholds: Thresholds | None = None,
    jobs: int | None = None,
) -> Diagnosis:
    """Discover, load and analyse inputs; ranks are loaded and analysed in parallel processes."""
    from gpudiag.traces.load import check_ranks, discover, parallel_map

    th = thresholds or Thresholds()
    inputs = discover(paths)
    per_input = parallel_map(_analyze_input, inputs.traces, jobs, th)
    results = [r for rs in per_input for r in rs]
    check_ranks(
        results, [t.path for t, rs in zip(inputs.traces, per_input, strict=True) for _ in rs]
    )
    whole, extra = _whole_run_of(inputs.run_dirs, inputs.manifests)
    return build_diagnosis(
        results, th, [str(t.path) for t in inputs.traces], inputs.notes,
        whole_run=whole, extra_findings=extra,
    )  # fmt: skip


def _whole_run_of(run_dirs: Sequence[Any], manifests: Sequence[Any]) -> tuple[Any, list[Finding]]:
    """Telemetry and NVML samples of the run directories among the inputs."""
    if not run_dirs:
        return None, []
    import pandas as pd

    from gpudiag.traces.samples import load_samples
    from gpudiag.traces.telemetry import load_steps, steps_files

    tele = [load_steps(d) for d in run_dirs if steps_files(d)]
    samples = [load_samples(d) for d in run_dirs]
    manifest = _merge_manifests(manifests)
    return whole_run(
        pd.concat(tele, ignore_index=True) if tele else None,
        pd.concat(samples, ignore_index=True) if samples else None,
        manifest,
    )


def _merge_manifests(manifests: Sequence[Any]) -> Any:
    """One manifest for a multi-node run: ranks and sources of every node together."""
    if len(manifests) <= 1:
        return manifests[0] if manifests else None
    import copy

    m = copy.deepcopy(manifests[0])
    for other in manifests[1:]:
        m.ranks = m.ranks + list(other.ranks)
        for name, src in other.sources.items():
            mine = m.sources.get(name)
            if mine is None or (not mine.captured and src.captured):
                m.sources[name] = src
        m.diagnosis_incomplete = m.diagnosis_incomplete + list(other.diagnosis_incomplete)
        if other.exit_code not in (None, 0):
            m.exit_code = other.exit_code
    return m
