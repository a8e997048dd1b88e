"""The pipeline: the per-rank results of a RunTimeline + Thresholds → Diagnosis.

:func:`diagnose` is the one path from per-rank results to a Diagnosis, for the CLI, the
Python API and the tests alike. It is pure: it reads no files (the API reads the sources and
maps the per-rank work, :class:`gpudiag.fanout.work.RankWork`, over them) and writes nothing
into the timeline. :func:`build_diagnosis` then does the cross-rank work: the facts
(:class:`RunFacts`: summaries, collectives, pipeline, evidence limits), then every finding
through the named passes of :data:`PASSES`, in order, each saying what it may change (the
reconciliation of findings, :mod:`gpudiag.analysis.run.reconcile`, among them), then the
what-if, remedies and verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gpudiag import __version__
from gpudiag._support.records import dataclass
from gpudiag.analysis.efficiency.measure import run_efficiency
from gpudiag.analysis.findings.causes import exposed_copies
from gpudiag.analysis.findings.compute import below_peak, compute_bound
from gpudiag.analysis.findings.idle import idle_findings
from gpudiag.analysis.findings.variability import variability
from gpudiag.analysis.hangs.runend import LEADS as ENDED_KINDS
from gpudiag.analysis.hangs.runend import evidence_only, run_end_findings, without_unfinished
from gpudiag.analysis.model.diagnosis import (
    Cause,
    CollectivesSummary,
    Diagnosis,
    Finding,
    FindingKind,
    KernelBreakdown,
    LiveAlert,
    Mode,
    RankSummary,
    RunSummary,
    Severity,
    StepBreakdown,
    WholeRun,
    by_rank,
)
from gpudiag.analysis.model.metrics import PipelineSummary, ShareMetrics
from gpudiag.analysis.rank.analyse import (
    TELEMETRY_NOTE,
    RankResult,
    nvml_idle,
    telemetry_results,
)
from gpudiag.analysis.rank.evidence import (
    Limit,
    apply_limits,
    evidence_limits,
    gains_supported,
    no_unseen_gains,
)
from gpudiag.analysis.rank.kernels import combine as combine_kernels
from gpudiag.analysis.rank.timeline import Timeline
from gpudiag.analysis.reading.summary import run_reading, with_reading
from gpudiag.analysis.remedies.advice import recommend
from gpudiag.analysis.run.collectives import (
    Collectives,
    SyncByStep,
    bandwidth_findings,
    match,
    summarize_collectives,
    with_exposed_waits,
)
from gpudiag.analysis.run.pipeline import find_pipeline
from gpudiag.analysis.run.reconcile import (
    comm_wait_for_stragglers,
    drop_host_bound,
    drop_ranks,
    explained_by_pipeline,
    source_findings,
    step_range_notes,
    with_host_cause,
    without_warmup,
)
from gpudiag.analysis.run.spread import rank_spread
from gpudiag.analysis.run.summary import run_summary, summarize_rank
from gpudiag.analysis.run.whatif import what_if
from gpudiag.analysis.run.wholerun import gpu_telemetry_note, whole_run
from gpudiag.analysis.stragglers.busy_host import on_busy_host
from gpudiag.analysis.stragglers.detect import find_stragglers
from gpudiag.analysis.stragglers.late_arrival import late_arrival
from gpudiag.analysis.verdict import verdict, with_efficiency
from gpudiag.config import GateConfig, Thresholds
from gpudiag.errors import InputError
from gpudiag.rundir.conditions import (
    ContentionLimits,
    ContentionSample,
    RunConditions,
    contention,
    host_contention,
    rank_samples,
)
from gpudiag.traces.schema import (
    RunTimeline,
    check_ranks,
)


def diagnose(
    run: RunTimeline,
    results: Sequence[RankResult],
    thresholds: Thresholds | None = None,
    limits: ContentionLimits | None = None,
) -> Diagnosis:
    """Diagnose a run from the per-rank results of its sources (the API reads and maps them).

    ``limits``: the gate's contention limits (``[tool.gpudiag.gate]``, typed by the API);
    the gate's defaults when not given.
    """
    return _diagnose(run, results, thresholds or Thresholds(), limits or GateConfig())


def diagnose_with_timeline(
    run: RunTimeline,
    results: Sequence[RankResult],
    thresholds: Thresholds | None = None,
    limits: ContentionLimits | None = None,
) -> tuple[Diagnosis, Timeline]:
    """:func:`diagnose`, and the classified timeline of every rank (the Perfetto view).

    The results carry their ranks' lanes (the per-rank work was asked for a timeline).
    """
    d = _diagnose(run, results, thresholds or Thresholds(), limits or GateConfig())
    colls = {r.rank: r.collectives for r in results if r.collectives is not None}
    _, matched = match([c for c in colls.values() if len(c.type)])
    lanes = [r.lanes for r in sorted(results, key=lambda r: r.rank) if r.lanes is not None]
    return d, Timeline(lanes, colls, matched)


def _diagnose(
    run: RunTimeline, results: Sequence[RankResult], th: Thresholds, limits: ContentionLimits
) -> Diagnosis:
    results = list(results)
    check_ranks(results, [r.source for r in results])
    results = without_unfinished(results, run.run_end, run.notes)
    whole, extra = whole_run(run.telemetry, run.samples, run.manifest, th.steady)
    cond = run.manifest.conditions if run.manifest is not None else None
    notes = list(run.notes) + _busy_host(cond, limits)
    gpu_note = gpu_telemetry_note(run.manifest)  # a CPU-only run: one note, no finding
    notes += [gpu_note] if gpu_note else []
    busy = host_contention(cond, limits)
    hang_notes: list[str] = []
    ended = run_end_findings(run.run_end, hang_notes)
    if ended:
        # the run's end, with the first failure, replaces the bare exit-code finding
        if any(f.kind == FindingKind.JOB_FAILED for f in ended):
            extra = [f for f in extra if f.kind != FindingKind.JOB_FAILED]
        extra = ended + list(extra)
        notes += list(run.run_end.notes) if run.run_end is not None else []
        notes += hang_notes
    if not results and whole is not None and whole.steps:
        results = telemetry_results(whole, th)
        extra = extra + nvml_idle(whole, th)
        ran = max(len(v) for v in by_rank(whole.steps).values())
        notes.append(TELEMETRY_NOTE.format(steps=ran))
    alerts, alert_notes = live_alerts(run.alerts)
    if not results and ended:
        e = evidence_only(run, ended, th, notes + alert_notes)
        return dataclasses.replace(e, alerts=alerts) if alerts else e
    d = build_diagnosis(
        results,
        th,
        run.inputs,
        notes + alert_notes,
        whole_run=whole,
        extra_findings=extra,
        host_contention=busy,
        contention=rank_samples(run.contention, run.manifest),
    )
    return dataclasses.replace(d, alerts=alerts) if alerts else d


def live_alerts(records: Sequence[Mapping[str, Any]]) -> tuple[list[LiveAlert], list[str]]:
    """The run's live alerts (``alerts.jsonl``, checked by the loader), and their notes.

    One note per alert raised: when, at which step, what, and when it cleared.
    """
    alerts = [
        LiveAlert(
            r["time_ns"],
            r["step"],
            r["kind"],
            list(r["ranks"]),
            r["message"],
            dict(r.get("metrics") or {}),
            r["state"],
        )
        for r in records
    ]
    notes = []
    for i, a in enumerate(alerts):
        if a.state != "raised":
            continue
        end = next(
            (
                b
                for b in alerts[i + 1 :]
                if b.state == "cleared" and b.kind == a.kind and b.ranks == a.ranks
            ),
            None,
        )
        when = time.strftime("%H:%M:%S", time.gmtime(a.time_ns // 1_000_000_000))
        until = f"cleared at step {end.step}" if end else "still raised when the job ended"
        notes.append(f"live alert at {when} UTC, step {a.step}: {a.message}; {until}")
    return alerts, notes


def _busy_host(cond: RunConditions | None, limits: ContentionLimits) -> list[str]:
    """A note when the run's recorded conditions were contended (the configured gate limits)."""
    why = contention(cond, limits)
    if not why:
        return []
    return [
        "host busy during the run: " + "; ".join(why) + " — step times are slower and "
        "noisier than on a quiet machine (conditions/ in the run directory)"
    ]


def _gpu_job(run: RunSummary, whole: WholeRun | None) -> bool:
    """A job on GPUs: a GPU trace, or NVML samples of GPUs its ranks used."""
    gpus = whole.gpus if whole is not None else []
    return run.mode in (Mode.GPU, Mode.MIXED) or any(g.rank is not None for g in gpus)


def build_diagnosis(
    results: Sequence[RankResult],
    th: Thresholds,
    inputs: Sequence[str] = (),
    notes: Sequence[str] = (),
    whole_run: WholeRun | None = None,
    extra_findings: Sequence[Finding] = (),
    host_contention: Mapping[str, float] | None = None,
    contention: Mapping[int, Sequence[ContentionSample]] | None = None,
) -> Diagnosis:
    """Assemble run summary, findings and the Diagnosis from per-rank results.

    ``host_contention``: the run's recorded host CPU contention
    (:func:`gpudiag.rundir.conditions.host_contention`), which qualifies the stragglers it can
    explain (:func:`gpudiag.analysis.stragglers.busy_host.on_busy_host`); ``contention``:
    each rank's host's contention samples over time, which say whether a straggler's
    excess follows it.
    """
    with _collector_skips_inputs():
        return _build(
            results,
            th,
            inputs,
            notes,
            whole_run,
            extra_findings,
            host_contention or {},
            contention or {},
        )


@contextlib.contextmanager
def _collector_skips_inputs() -> Iterator[None]:
    """Keep Python's cyclic collector off the objects that exist already (the inputs).

    The per-rank results of thousands of ranks are millions of objects that live through
    the whole step; each full collection the cross-rank work's allocations trigger walks
    them all again, which made the step grow faster than the ranks (~15% at 8,192). They
    are frozen (``gc.freeze``) for the step and unfrozen after; new garbage is collected as
    usual. Left alone when the process has frozen objects of its own.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _finding_order(f: Finding) -> tuple[int, bool, float]:
    """Severity first; how the run ended first among equals; then the larger share."""
    share = f.metrics.share() if isinstance(f.metrics, ShareMetrics) else 0
    return (Severity(f.severity).order, f.kind not in ENDED_KINDS, -share)


@dataclass(frozen=True)
class RunFacts:
    """What the passes over the findings read: the run's ranks, steps and cross-rank facts.

    Computed once, before the first pass; no pass changes them.
    """

    th: Thresholds
    results: Sequence[RankResult]  # without their warm-up steps
    warm: list[Finding]  # the warm-up finding (none when no step was left out)
    ranks: list[RankSummary]
    steps: list[StepBreakdown]
    run: RunSummary
    whole_run: WholeRun | None
    extra: Sequence[Finding]  # the run's own findings (its end, NVML idle …)
    kernels: KernelBreakdown | None
    colls: list[Collectives]
    coll: CollectivesSummary | None
    sync_by_step: SyncByStep
    pipe: PipelineSummary | None
    pipe_findings: list[Finding]
    busy: Mapping[str, float]  # the host CPU contention over the gate's limits
    lims: list[Limit]  # what the traces cannot support (rank/evidence.py)
    # each rank's host's contention samples over time (conditions/<host>.jsonl)
    contention: Mapping[int, Sequence[ContentionSample]]


@dataclass(frozen=True)
class Pass:
    """One step over the findings: given the facts and the findings so far, the findings after.

    ``changes`` says what it may change: a pass that only ``adds`` appends findings and
    leaves the others as they are; any other pass names the kinds it drops or rewrites.
    """

    name: str
    changes: str
    run: Callable[[RunFacts, list[Finding]], list[Finding]]


def _stage_ranks(x: RunFacts) -> set[int]:
    return set(x.pipe.stage_ranks) if x.pipe is not None else set()


def _host_stragglers(findings: list[Finding]) -> set[int]:
    return {
        f.ranks[0]
        for f in findings
        if f.kind == FindingKind.STRAGGLER and f.cause == Cause.HOST and f.ranks
    }


def _stragglers(x: RunFacts, fs: list[Finding]) -> list[Finding]:
    # telemetry-only steps are the whole-run telemetry itself, not a profiled window
    window = [] if all(r.mode == Mode.TELEMETRY for r in x.results) else x.steps
    th = x.th
    return fs + find_stragglers(window, x.whole_run, th.stragglers, th.steady, x.sync_by_step)


def _pipeline_explains(x: RunFacts, fs: list[Finding]) -> list[Finding]:
    if x.pipe is None or x.coll is None:
        return fs
    return explained_by_pipeline(fs, x.pipe, x.ranks, x.th)


def _without_stage_waits(x: RunFacts, findings: list[Finding]) -> list[Finding]:
    """Drop a pipeline's stages' comm-bound and straggler findings (its finding holds both).

    A stage's receive waits are the bubble, and stages are not stragglers of each other.
    """
    if x.pipe is None:
        return findings
    stage = _stage_ranks(x)
    findings = drop_ranks(findings, stage, FindingKind.COMM_BOUND)
    return [f for f in findings if not (f.kind == FindingKind.STRAGGLER and set(f.ranks) <= stage)]


# Every finding of a run comes from these passes, in this order; each is given the findings
# of the passes before it. Findings only one pass makes are added by it; the passes that
# rewrite or drop earlier findings (the reconciliation, analysis/run/reconcile.py) say so.
PASSES: tuple[Pass, ...] = (
    Pass(
        "per-rank shares",
        "adds idle_ratio, data_bound, comm_bound, host_bound",
        lambda x, fs: fs + idle_findings(x.ranks, x.steps, x.th),
    ),
    Pass(
        "inputs",
        "adds source_missing and truncated_step (what the inputs lacked)",
        lambda x, fs: fs + source_findings(x.results, x.run),
    ),
    Pass(
        "warm-up", "adds warmup (the steps left out of the statistics)", lambda x, fs: fs + x.warm
    ),
    Pass(
        "run's own",
        "adds the run directory's findings (its end, job_failed, NVML idle)",
        lambda x, fs: fs + list(x.extra),
    ),
    Pass(
        "variability",
        "adds step_variability",
        lambda x, fs: fs + variability(x.steps, x.th.variability, x.ranks, x.th.steady),
    ),
    Pass(
        "compute",
        "adds compute_bound",
        lambda x, fs: fs + compute_bound(x.run, x.kernels, x.th.advice),
    ),
    Pass(
        "below peak",
        "adds below_peak",
        lambda x, fs: fs + below_peak(x.run, x.ranks, x.kernels, x.th.advice),
    ),
    Pass(
        "bandwidth",
        "adds low_bandwidth",
        lambda x, fs: fs + bandwidth_findings(x.coll, x.th.collectives),
    ),
    Pass(
        "pipeline explains idle",
        "drops host_bound for the pipeline stages whose idle time its schedule explains",
        _pipeline_explains,
    ),
    Pass("pipeline", "adds pipeline_bubble", lambda x, fs: fs + x.pipe_findings),
    Pass("stragglers", "adds straggler (step times)", _stragglers),
    Pass(
        "late arrival",
        "adds straggler (matched collectives; reads the stragglers so far)",
        lambda x, fs: fs + late_arrival(x.coll, x.steps, fs, x.th.stragglers, x.th.collectives),
    ),
    Pass(
        "stage waits",
        "drops comm_bound of pipeline stages, and stragglers among them",
        _without_stage_waits,
    ),
    Pass(
        "busy host",
        "rewrites straggler: severity, message and host_contention when the "
        "recorded host contention likely explains it",
        lambda x, fs: on_busy_host(
            fs,
            x.busy,
            _gpu_job(x.run, x.whole_run),
            x.th.stragglers,
            x.whole_run.steps if x.whole_run is not None else (),
            x.contention,
        ),
    ),
    Pass(
        "waiting for stragglers",
        "rewrites comm_bound: sync_wait_share, and message and "
        "severity (info) when its ranks mostly wait for a straggler",
        lambda x, fs: comm_wait_for_stragglers(fs, x.steps, x.sync_by_step, x.th),
    ),
    Pass(
        "host stragglers",
        "drops host_bound of ranks that are host-side stragglers",
        lambda x, fs: drop_host_bound(fs, _host_stragglers(fs)),
    ),
    Pass(
        "host cause",
        "rewrites host_bound: message and metrics (HostMetrics, its cause)",
        lambda x, fs: with_host_cause(fs, x.ranks, x.steps, x.th),
    ),
    Pass(
        "exposed copies",
        "adds exposed_copies (ranks whose host cause is not copies)",
        lambda x, fs: fs + exposed_copies(x.ranks, x.steps, fs, x.th),
    ),
    Pass(
        "evidence limits",
        "adds limited_evidence; rewrites the findings a limit qualifies "
        "or withholds (rank/evidence.py apply_limits)",
        lambda x, fs: apply_limits(fs, x.lims),
    ),
    Pass(
        "order",
        "reorders: severity first, how the run ended first among equals, then the larger share",
        lambda x, fs: sorted(fs, key=_finding_order),
    ),
)


def _build(
    results: Sequence[RankResult],
    th: Thresholds,
    inputs: Sequence[str],
    notes: Sequence[str],
    whole_run: WholeRun | None,
    extra_findings: Sequence[Finding],
    busy: Mapping[str, float],
    contention: Mapping[int, Sequence[ContentionSample]],
) -> Diagnosis:
    results = sorted(results, key=lambda r: r.rank)
    results, warm = without_warmup(results, th)
    ranks = [summarize_rank(r) for r in results]
    steps = [s for r in results for s in r.steps]
    if not steps:
        raise InputError(
            ", ".join(inputs) or "input", "no step could be analysed", "is the trace empty?"
        )
    run = run_summary(results, steps)
    kernels = combine_kernels([r.evidence.kernels for r in ranks])
    colls = [r.collectives for r in results if r.collectives is not None]
    coll, sync_by_step = summarize_collectives(colls, run.world_size, th.collectives)
    coll = with_exposed_waits(coll, sync_by_step, steps)
    pipe, pipe_findings = find_pipeline(colls, ranks, steps, th.idle_ratio_max, th.pipeline)
    if pipe is not None and coll is not None:
        coll = dataclasses.replace(coll, pipeline=pipe)
    lims, limit_notes = evidence_limits(
        # only ranks with a trace have facts to judge (telemetry-only ranks have none)
        {r.rank: r.evidence.coverage for r in ranks if r.evidence.coverage},
        {r.rank: r.meta.dropped for r in results},
        th.evidence,
        th.loader.launch_linked_min_ratio,
    )
    facts = RunFacts(
        *(th, results, warm, ranks, steps, run, whole_run, extra_findings),
        *(kernels, colls, coll, sync_by_step, pipe, pipe_findings, busy, lims),
        contention=contention,
    )
    findings: list[Finding] = []
    for p in PASSES:
        findings = p.run(facts, findings)
    notes = list(notes) + step_range_notes(results) + limit_notes
    # one step model for the what-if and the gains; none from a split the trace cannot
    # support, nor from one short step (too little to forecast from)
    wi = (
        what_if(steps, findings, run.shares.comm_measured, th.advice.what_if_mean_gap_ratio)
        if gains_supported(lims)
        else None
    )
    eff = run_efficiency([e for r in ranks if (e := r.evidence.efficiency)])
    reading = run_reading(ranks, steps, th.reading)
    return Diagnosis(
        run=run,
        ranks=ranks,
        steps=steps,
        findings=findings,
        recommendations=no_unseen_gains(
            recommend(run, ranks, steps, findings, sync_by_step, th.advice, wi), lims
        ),
        spread=rank_spread(ranks),
        collectives=coll,
        what_if=wi,
        inputs=list(inputs),
        thresholds=th.as_dict(),
        notes=list(notes),
        gpudiag_version=__version__,
        whole_run=whole_run,
        verdict=with_reading(
            with_efficiency(verdict(run, findings, lims, th.verdict), eff), reading
        ),
        kernels=kernels,
        efficiency=eff,
        reading=reading,
    )
