"""The pipeline: RunTimeline + Thresholds → Diagnosis.

:func:`diagnose` is the one path from inputs to a Diagnosis, for the CLI, the Python API
and the tests alike. It is pure: it reads no files and writes nothing into the timeline.
Each rank source is loaded and analysed by :func:`gpudiag.analysis.rank.source_results`
through the injected ``map`` (worker processes by default, a Dask cluster when asked), so
only compact per-rank results (:class:`~gpudiag.analysis.rank.RankResult`) come back;
:func:`build_diagnosis` then does the cross-rank work (stragglers, collectives, pipeline,
findings, remedies), summaries (:mod:`gpudiag.analysis.summary`) and the reconciliation
of findings (:mod:`gpudiag.analysis.reconcile`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from gpudiag import __version__
from gpudiag.analysis.advice import recommend
from gpudiag.analysis.collectives import (
    bandwidth_findings,
    match,
    summarize_collectives,
)
from gpudiag.analysis.compute import compute_bound
from gpudiag.analysis.idle import idle_findings
from gpudiag.analysis.kernels import combine as combine_kernels
from gpudiag.analysis.metrics import (
    ShareMetrics,
)
from gpudiag.analysis.model import (
    Cause,
    Diagnosis,
    Finding,
    FindingKind,
    Mode,
    Severity,
    WholeRun,
    by_rank,
)
from gpudiag.analysis.pipeline import find_pipeline
from gpudiag.analysis.rank import (
    TELEMETRY_NOTE,
    RankResult,
    nvml_idle,
    source_results,
    telemetry_results,
)
from gpudiag.analysis.reconcile import (
    comm_wait_for_stragglers,
    drop_host_bound,
    drop_ranks,
    explained_by_pipeline,
    source_findings,
    step_range_notes,
    without_warmup,
)
from gpudiag.analysis.spread import rank_spread
from gpudiag.analysis.stragglers import find_stragglers, late_arrival
from gpudiag.analysis.summary import run_summary, summarize_rank
from gpudiag.analysis.timeline import Timeline
from gpudiag.analysis.verdict import verdict
from gpudiag.analysis.whatif import what_if
from gpudiag.analysis.wholerun import whole_run
from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.fanout import Mapper, local_map
from gpudiag.traces.schema import (
    RunTimeline,
    check_ranks,
)


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
    work = functools.partial(source_results, thresholds=th, timeline=timeline)
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
    results, warm = without_warmup(results, th)
    ranks = [summarize_rank(r) for r in results]
    steps = [s for r in results for s in r.steps]
    if not steps:
        raise InputError(
            ", ".join(inputs) or "input", "no step could be analysed", "is the trace empty?"
        )
    run = run_summary(results, steps)
    notes = list(notes) + step_range_notes(results)
    findings = idle_findings(ranks, steps, th) + source_findings(results, run) + warm
    findings += list(extra_findings)
    kernels = combine_kernels([r.evidence.kernels for r in ranks])
    findings += compute_bound(run, kernels, th.advice)
    colls = [r.collectives for r in results if r.collectives is not None]
    coll, sync_by_step = summarize_collectives(colls, run.world_size, th.collectives)
    findings += bandwidth_findings(coll, th.collectives)
    pipe, pipe_findings = find_pipeline(colls, ranks, steps, th.idle_ratio_max, th.pipeline)
    if pipe is not None and coll is not None:
        coll = dataclasses.replace(coll, pipeline=pipe)
        findings = explained_by_pipeline(findings, pipe, ranks, th)
    findings += pipe_findings
    # telemetry-only steps are the whole-run telemetry itself, not a profiled window
    window = [] if all(r.mode == Mode.TELEMETRY for r in results) else steps
    findings += find_stragglers(window, whole_run, th.stragglers, th.steady, sync_by_step)
    findings += late_arrival(coll, steps, findings, th.stragglers, th.collectives)
    if pipe is not None:
        # a stage's receive waits are the bubble, and stages are not stragglers of each
        # other: the pipeline finding carries both
        stage = set(pipe.stage_ranks)
        findings = drop_ranks(findings, stage, FindingKind.COMM_BOUND)
        findings = [f for f in findings
                    if not (f.kind == FindingKind.STRAGGLER and set(f.ranks) <= stage)]  # fmt: skip
    findings = comm_wait_for_stragglers(findings, steps, sync_by_step, th)
    host_stragglers = {
        f.ranks[0] for f in findings
        if f.kind == FindingKind.STRAGGLER and f.cause == Cause.HOST and f.ranks
    }  # fmt: skip
    findings = drop_host_bound(findings, host_stragglers)
    findings.sort(
        key=lambda f: (
            Severity(f.severity).order,
            -(f.metrics.share() if isinstance(f.metrics, ShareMetrics) else 0),
        )
    )
    wi = what_if(steps, findings)  # one step model: the what-if and the remedies' gains
    return Diagnosis(
        run=run,
        ranks=ranks,
        steps=steps,
        findings=findings,
        recommendations=recommend(run, ranks, steps, findings, sync_by_step, th.advice, wi),
        spread=rank_spread(ranks),
        collectives=coll,
        what_if=wi,
        inputs=list(inputs),
        thresholds=th.as_dict(),
        notes=list(notes),
        gpudiag_version=__version__,
        whole_run=whole_run,
        verdict=verdict(run, findings),
        kernels=kernels,
    )
