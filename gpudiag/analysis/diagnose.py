"""The pipeline: RunTimeline + Thresholds → Diagnosis.

:func:`diagnose` is the one path from inputs to a Diagnosis, for the CLI, the Python API
and the tests alike. It is pure: it reads no files and writes nothing into the timeline.
Each rank source is loaded and analysed by :func:`gpudiag.analysis.rank.analyse.source_results`
through the injected ``map`` (worker processes by default, a Dask cluster when asked), so
only compact per-rank results (:class:`~gpudiag.analysis.rank.analyse.RankResult`) come back;
:func:`build_diagnosis` then does the cross-rank work (stragglers, collectives, pipeline,
findings, remedies), summaries (:mod:`gpudiag.analysis.run.summary`) and the reconciliation
of findings (:mod:`gpudiag.analysis.run.reconcile`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gpudiag import __version__
from gpudiag.analysis.efficiency.measure import run_efficiency
from gpudiag.analysis.findings.causes import exposed_copies
from gpudiag.analysis.findings.compute import compute_bound
from gpudiag.analysis.findings.idle import idle_findings
from gpudiag.analysis.findings.variability import variability
from gpudiag.analysis.hangs.runend import LEADS as ENDED_KINDS
from gpudiag.analysis.hangs.runend import evidence_only, run_end_findings, without_unfinished
from gpudiag.analysis.model.diagnosis import (
    Cause,
    Diagnosis,
    Finding,
    FindingKind,
    LiveAlert,
    Mode,
    RunSummary,
    Severity,
    WholeRun,
    by_rank,
)
from gpudiag.analysis.model.metrics import (
    ShareMetrics,
)
from gpudiag.analysis.rank.analyse import (
    TELEMETRY_NOTE,
    RankResult,
    nvml_idle,
    source_results,
    telemetry_results,
)
from gpudiag.analysis.rank.evidence import gains_supported, judge_evidence, no_unseen_gains
from gpudiag.analysis.rank.kernels import combine as combine_kernels
from gpudiag.analysis.rank.timeline import Timeline
from gpudiag.analysis.reading.summary import run_reading, with_reading
from gpudiag.analysis.remedies.advice import recommend
from gpudiag.analysis.run.collectives import (
    bandwidth_findings,
    match,
    summarize_collectives,
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
from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.traces.schema import (
    RunTimeline,
    check_ranks,
)

# A mapper runs ``fn`` over ``items`` in order: ``mapper(fn, items) -> [fn(x) for x in items]``.
# The API passes the fan-out's (local processes or Dask, with the cache); a bare call here
# runs in this process.
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


def _serial_map(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    return [fn(x) for x in items]


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
    mapper = map or _serial_map
    work = functools.partial(source_results, thresholds=th, timeline=timeline)
    per_source = mapper(work, run.sources)
    results = [r for rs in per_source for r in rs]
    check_ranks(results, [r.source for r in results])
    results = without_unfinished(results, run.run_end, run.notes)
    whole, extra = whole_run(run.telemetry, run.samples, run.manifest, th.steady)
    notes = list(run.notes) + _busy_host(run, th)
    gpu_note = gpu_telemetry_note(run.manifest)  # a CPU-only run: one note, no finding
    notes += [gpu_note] if gpu_note else []
    busy = _host_contention(run, th)
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
        return (dataclasses.replace(e, alerts=alerts) if alerts else e), results
    d = build_diagnosis(
        results,
        th,
        run.inputs,
        notes + alert_notes,
        whole_run=whole,
        extra_findings=extra,
        host_contention=busy,
    )
    return (dataclasses.replace(d, alerts=alerts) if alerts else d), results


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


def _busy_host(run: RunTimeline, th: Thresholds) -> list[str]:
    """A note when the run's recorded conditions were contended (the configured gate limits)."""
    from gpudiag.config import gate_config
    from gpudiag.rundir.conditions import contention

    cond = run.manifest.conditions if run.manifest is not None else None
    why = contention(cond, gate_config(th.extra.get("gate")))
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


def _host_contention(run: RunTimeline, th: Thresholds) -> dict[str, float]:
    """The run's recorded host CPU contention over the gate's limits (empty: quiet/unknown)."""
    from gpudiag.config import gate_config
    from gpudiag.rundir.conditions import host_contention

    cond = run.manifest.conditions if run.manifest is not None else None
    return host_contention(cond, gate_config(th.extra.get("gate")))


def build_diagnosis(
    results: Sequence[RankResult],
    th: Thresholds,
    inputs: Sequence[str] = (),
    notes: Sequence[str] = (),
    whole_run: WholeRun | None = None,
    extra_findings: Sequence[Finding] = (),
    host_contention: Mapping[str, float] | None = None,
) -> Diagnosis:
    """Assemble run summary, findings and the Diagnosis from per-rank results.

    ``host_contention``: the run's recorded host CPU contention
    (:func:`gpudiag.rundir.conditions.host_contention`), which qualifies the stragglers it can
    explain (:func:`gpudiag.analysis.stragglers.busy_host.on_busy_host`).
    """
    with _collector_skips_inputs():
        return _build(results, th, inputs, notes, whole_run, extra_findings, host_contention or {})


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


def _without_stage_waits(findings: list[Finding], stage: set[int]) -> list[Finding]:
    """Drop a pipeline's stages' comm-bound and straggler findings (its finding holds both).

    A stage's receive waits are the bubble, and stages are not stragglers of each other.
    """
    findings = drop_ranks(findings, stage, FindingKind.COMM_BOUND)
    return [f for f in findings if not (f.kind == FindingKind.STRAGGLER and set(f.ranks) <= stage)]


# hand-laid (over 80 lines once formatted; to be split)
# fmt: off
def _build(
    results: Sequence[RankResult], th: Thresholds, inputs: Sequence[str], notes: Sequence[str],
    whole_run: WholeRun | None, extra_findings: Sequence[Finding], busy: Mapping[str, float],
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
    notes = list(notes) + step_range_notes(results)
    findings = idle_findings(ranks, steps, th) + source_findings(results, run) + warm
    findings += list(extra_findings)
    findings += variability(steps, th.variability, ranks, th.steady)
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
        findings = _without_stage_waits(findings, set(pipe.stage_ranks))
    findings = on_busy_host(findings, busy, _gpu_job(run, whole_run))
    findings = comm_wait_for_stragglers(findings, steps, sync_by_step, th)
    host_stragglers = {
        f.ranks[0] for f in findings
        if f.kind == FindingKind.STRAGGLER and f.cause == Cause.HOST and f.ranks
    }
    findings = drop_host_bound(findings, host_stragglers)
    findings = with_host_cause(findings, ranks, steps, th)
    findings += exposed_copies(ranks, steps, findings, th)
    findings, lims, limit_notes = judge_evidence(
        # only ranks with a trace have facts to judge (telemetry-only ranks have none)
        {r.rank: r.evidence.coverage for r in ranks if r.evidence.coverage},
        {r.rank: r.meta.dropped for r in results}, findings, th.evidence,
        th.loader.launch_linked_min_ratio,
    )
    notes += limit_notes
    findings.sort(key=_finding_order)
    # one step model for the what-if and the gains; none from a split the trace cannot
    # support, nor from one short step (too little to forecast from)
    wi = what_if(steps, findings, run.shares.comm_measured) if gains_supported(lims) else None
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
# fmt: on
