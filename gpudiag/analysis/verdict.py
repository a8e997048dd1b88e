"""The verdict: one line that names the dominant bottleneck, computed once from the findings.

Every renderer shows it first. It judges nothing anew. A run that hung, disagreed on a
collective, failed or was interrupted leads with that finding (docs/definitions.md,
"Verdict"); otherwise it picks, among the findings that
name a bottleneck (data, communication, straggler, pipeline, host), the most severe, and
among equally severe ones the one holding the largest share of step time. Without such a
finding the run has no bottleneck and the line says how its step time splits.

Evidence first (:mod:`gpudiag.analysis.rank.evidence`): when limits withhold the split for
every rank, the verdict is withheld (bottleneck ``unknown``) and says why; other limits
qualify the line. Either way ``limits`` lists their sentences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from gpudiag.analysis.efficiency.peaks import peak_of
from gpudiag.analysis.findings.causes import CAPTURE_HINT, LABEL, cause_kind, cause_of
from gpudiag.analysis.model import words
from gpudiag.analysis.model.causes import HostCause
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    Mode,
    PipelineSummary,
    RunSummary,
    Severity,
    Verdict,
)
from gpudiag.analysis.model.efficiency import ComputeEfficiency
from gpudiag.analysis.model.kinds import Bottleneck, VerdictBasis
from gpudiag.analysis.model.metrics import (
    CommBoundMetrics,
    JobFailedMetrics,
    LateArrivalMetrics,
    StragglerMetrics,
    VariabilityMetrics,
)
from gpudiag.analysis.rank.evidence import WITHHOLD, Limit
from gpudiag.analysis.stragglers.busy_host import BUSY_HOST, busy_host_words
from gpudiag.config import VerdictRules

PROFILED: Final = "profiled window"
WHOLE_RUN: Final = "whole run"

_KIND: dict[FindingKind, Bottleneck] = {
    FindingKind.DATA_BOUND: "data",
    FindingKind.COMM_BOUND: "communication",
    FindingKind.STRAGGLER: "straggler",
    FindingKind.PIPELINE_BUBBLE: "pipeline",
    FindingKind.HOST_BOUND: "host",
    FindingKind.EXPOSED_COPIES: "copy",
}


def _ended(findings: Sequence[Finding]) -> Verdict | None:
    """A hang root, a collective mismatch, a failed or an interrupted run leads the verdict."""
    for f in findings:
        if f.kind == FindingKind.HANG and f.severity == Severity.ERROR:
            return Verdict(f"hang: {f.message}", "hang", 0.0, list(f.ranks), WHOLE_RUN)
    for f in findings:
        if f.kind == FindingKind.COLLECTIVE_MISMATCH and f.severity == Severity.ERROR:
            return Verdict(
                f"collective mismatch: {f.message}", "mismatch", 0.0, list(f.ranks), WHOLE_RUN
            )
    for f in findings:
        if f.kind != FindingKind.JOB_FAILED or not isinstance(f.metrics, JobFailedMetrics):
            continue
        if f.metrics.mismatch and f.severity == Severity.ERROR:
            return Verdict(
                f"collective mismatch: {f.message}", "mismatch", 0.0, list(f.ranks), WHOLE_RUN
            )
        if f.metrics.interrupted:
            return Verdict(
                f"interrupted: {f.message}", "interrupted", 0.0, list(f.ranks), WHOLE_RUN
            )
        if f.severity == Severity.ERROR:
            return Verdict(f"failed: {f.message}", "failure", 0.0, list(f.ranks), WHOLE_RUN)
    return None


def verdict(
    run: RunSummary,
    findings: Sequence[Finding],
    lims: Sequence[Limit] = (),
    rules: VerdictRules = VerdictRules(),  # noqa: B008 (frozen)
) -> Verdict:
    """The headline, bottleneck, share, ranks and basis (docs/definitions.md, "Verdict")."""
    ended = _ended(findings)
    if ended is not None and (ended.bottleneck != "interrupted" or not run.steps):
        return ended
    v = _bottleneck(run, findings, lims, rules)
    return v if ended is None else _until_interrupted(ended, v, findings)


def _until_interrupted(ended: Verdict, v: Verdict, findings: Sequence[Finding]) -> Verdict:
    """An interrupted run: where it stopped, then the bottleneck of the steps it finished.

    Ctrl-C is the user's, not a failure: the finished steps are whole and their bottleneck
    is the verdict's (``bottleneck``, ``share``, ``ranks``, ``basis`` are that verdict's);
    ``interrupted`` marks it (docs/definitions.md, "Verdict").
    """
    step = next(
        (
            f.metrics.step
            for f in findings
            if isinstance(f.metrics, JobFailedMetrics) and f.metrics.interrupted
        ),
        None,
    )
    where = f" in step {step}" if step is not None else ""
    return dataclasses.replace(
        v, headline=f"interrupted{where} (Ctrl-C); until then: {v.headline}", interrupted=True
    )


def _bottleneck(
    run: RunSummary, findings: Sequence[Finding], lims: Sequence[Limit], rules: VerdictRules
) -> Verdict:
    """The verdict of a run that did not end badly (or of the steps an interrupted one ran)."""
    # a pipeline whose bubble is within the threshold is no bottleneck; the line says it
    within = [f for f in findings if _within_schedule(f)]
    named = [f for f in findings if f.kind in _KIND and not _within_schedule(f)]
    index = {id(f): i for i, f in enumerate(findings)}
    if run.mode == Mode.TELEMETRY:  # no trace: every number is the step telemetry's
        return _telemetry_basis(_verdict(run, named, index, rules))
    uneven = [
        f
        for f in findings
        if f.kind == FindingKind.STEP_VARIABILITY
        and isinstance(f.metrics, VariabilityMetrics)
        and f.severity != Severity.INFO
        and f.metrics.pattern != "jitter"
        and float(f.metrics.excess_share) >= rules.uneven_excess_share
    ]
    return _limited(_verdict(run, named, index, rules, uneven, within[:1]), run, lims)


def _within_schedule(f: Finding) -> bool:
    """An info pipeline finding: a pipeline recognised, its bubble within the threshold."""
    return f.kind == FindingKind.PIPELINE_BUBBLE and f.severity == Severity.INFO


def _no_bottleneck(run: RunSummary, pipe: Sequence[Finding], index: dict[int, int]) -> Verdict:
    """No bottleneck: how the step splits, and a pipeline's bubble when there is one."""
    c, idle = run.shares.compute, run.idle_ratio
    head = f"no bottleneck: compute {words.percent(c)}, non-compute idle {words.percent(idle)}"
    if pipe:
        pm = pipe[0].metrics_as(PipelineSummary)
        name = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(pm.schedule, "unknown schedule")
        head = (
            f"no bottleneck beyond the pipeline's bubble: compute {words.percent(c)}; "
            f"{pm.stages} stages ({name}, m = {pm.micro_batches}) idle "
            f"{words.percent(pm.share())} of each step by their schedule "
            f"({words.percent(pm.bubble_ratio)} measured waiting for a neighbour), within "
            "the idle threshold"
        )
    return Verdict(
        headline=head,
        bottleneck="none",
        share=c,
        ranks=[],
        basis=PROFILED,
        finding=index[id(pipe[0])] if pipe else None,
    )


def _host_words(cause: HostCause | None) -> str:
    """What a host-bound rank loses its time to: host-side time, then the named cause.

    The cause comes with its own share of step time (``step_share``); a cause the trace
    does not show says what to capture to see it; without a cause, the generic list.
    """
    if cause is not None and cause.kind == "unknown":
        return f"{LABEL['unknown']}; {cause.capture or CAPTURE_HINT}"
    if cause is None:
        return "host overhead, launch gaps or synchronisation"
    api = f" ({cause.api})" if cause.api else ""
    own = cause.step_share
    # copies with nothing computing are GPU time, not the host's: the whole names both
    whole = "copies and host-side time" if cause.kind == "copies" else "host-side time"
    if own is None:  # a cause recorded before it carried its own share
        return f"{whole}: {cause.label}{api}"
    return f"{whole} (of which {cause.label}{api} {words.percent(float(own))})"


def _root_cause(
    run: RunSummary, f: Finding, named: Sequence[Finding], rules: VerdictRules
) -> Finding:
    """The straggler, when the chosen finding's ranks wait for it rather than work.

    A communication- or host-bound finding on other ranks whose waits are mostly for the
    last rank — ``sync_wait_share`` above ``verdict.straggler_wait_share`` (one half), host
    time spent synchronising on a collective, or the straggler's own ``wait_caused_ns`` at
    least ``verdict.straggler_caused_share`` (half) of their lost time (share × median
    step × steps × ranks) — is the straggler's doing: the verdict names the straggler.
    """
    if f.kind not in (FindingKind.COMM_BOUND, FindingKind.HOST_BOUND):
        return f
    late = [
        s
        for s in named
        if s.kind == FindingKind.STRAGGLER and s.ranks and not set(s.ranks) & set(f.ranks)
    ]
    if not late:
        return f
    cause = cause_of(f)
    waits = (cause.waits_for if cause is not None else None) or {}
    share = rules.straggler_wait_share
    m = f.metrics
    synced = m.sync_wait_share if isinstance(m, CommBoundMetrics) else None
    waiting = float(synced or 0.0) > share or (
        cause_kind(f) == "sync" and float(waits.get("communication", 0.0)) >= share
    )
    top = min(late, key=lambda s: (Severity(s.severity).order, -float(s.wait_caused_ns or 0)))
    # or the straggler's caused waiting is at least half of these ranks' lost time
    lost = f.metrics.mean_share() * run.step_time_ns_median * run.steps * len(f.ranks)
    caused = float(top.wait_caused_ns or 0)
    if not waiting and not (lost > 0 and caused >= rules.straggler_caused_share * lost):
        return f
    return top


def _limited(v: Verdict, run: RunSummary, lims: Sequence[Limit]) -> Verdict:
    """The verdict withheld or qualified by what the trace cannot support."""
    if not lims:
        return v
    withheld = [lim for lim in lims if lim.effect == WITHHOLD]
    if len({r for lim in withheld for r in lim.ranks}) >= run.ranks:
        lim = withheld[0]
        v = Verdict(
            headline=f"withheld: {lim.message}",
            bottleneck="unknown",
            share=0.0,
            ranks=list(lim.ranks),
            basis=v.basis,
        )
    else:
        v = dataclasses.replace(v, headline=f"{v.headline} — qualified: {lims[0].message}")
    return dataclasses.replace(v, limits=[lim.message for lim in lims])


def _telemetry_basis(v: Verdict) -> Verdict:
    v = dataclasses.replace(v, basis=WHOLE_RUN)
    if v.bottleneck == "none":
        v = dataclasses.replace(
            v,
            headline=(
                f"no bottleneck in the step telemetry: busy {words.percent(v.share)}"
                " of each step (no trace to split compute from host work)"
            ),
        )
    return v


def _verdict(
    run: RunSummary,
    named: Sequence[Finding],
    index: dict[int, int],
    rules: VerdictRules,
    uneven: Sequence[Finding] = (),
    within: Sequence[Finding] = (),
) -> Verdict:
    if not named and uneven:
        # no steady bottleneck, but a few steps hold the time: name them
        u = uneven[0]
        excess = float(u.metrics_as(VariabilityMetrics).excess_share)
        return Verdict(
            headline=f"uneven steps: {u.message}",
            bottleneck="variability",
            share=excess,
            ranks=list(u.ranks),
            basis=PROFILED,
            finding=index.get(id(u)),
        )
    if not named:
        return _no_bottleneck(run, within, index)
    f = min(named, key=lambda f: (Severity(f.severity).order, -_share(f)))
    f = _root_cause(run, f, named, rules)
    kind: Bottleneck = _KIND[f.kind]
    cause = cause_of(f) if f.kind == FindingKind.HOST_BOUND else None
    if cause is not None and cause.kind == "copies":
        kind = "copy"
    share = _share(f)
    who = words.ranks(f.ranks) if f.ranks else "the run"
    basis: VerdictBasis = PROFILED
    if kind == "straggler":
        m = f.metrics
        basis = (
            WHOLE_RUN if isinstance(m, StragglerMetrics) and m.source == "telemetry" else PROFILED
        )
        text = _straggler(f, who, share)
    elif kind == "pipeline":
        text = f"pipeline bubble: stages idle {words.percent(share)} of each step"
    else:
        verb = "waits" if len(f.ranks) == 1 else "wait"
        lose = "loses" if len(f.ranks) == 1 else "lose"
        text = {
            "data": f"data-bound: {who} {verb} for input {words.percent(share)} of each step",
            "communication": f"communication-bound: {who} {verb} for {_traffic(f, rules)} "
            f"{words.percent(share)} of each step",
            "host": f"host-bound: {who} {lose} {words.percent(share)} of each step to "
            + _host_words(cause),
            "copy": f"copy-bound: {who} {lose} {words.percent(share)} of each step to "
            + _host_words(cause),
        }[kind]
    return Verdict(
        headline=text,
        bottleneck=kind,
        share=share,
        ranks=list(f.ranks),
        basis=basis,
        finding=index[id(f)],
    )


def _traffic(f: Finding, rules: VerdictRules) -> str:
    """What a communication-bound rank waits for: mostly point-to-point, some, or none."""
    p2p = f.metrics.p2p_share if isinstance(f.metrics, CommBoundMetrics) else None
    if p2p is None or float(p2p) <= 0:
        return "collectives"
    return "point-to-point communication" if float(p2p) > rules.p2p_share else "communication"


def _share(f: Finding) -> float:
    """The share of step time a finding stands for, in its own terms.

    A persistent straggler: what it costs the mean step (``StragglerMetrics.cost_ratio``,
    the what-if's straggler at median speed);
    intermittent stalls: what they cost a step on average (the excess of a stall × the
    stalls / the steps compared); a late rank: the others' waiting for it per step over the
    step; any other finding: its mean share over its ranks.
    """
    m = f.metrics
    if isinstance(m, StragglerMetrics):
        if f.persistent:
            return m.cost_ratio()
        return m.median_excess_ratio * m.slow_steps / max(m.steps_compared, 1)
    if isinstance(m, LateArrivalMetrics):
        return m.waited_ns_per_step / m.step_time_ns_median if m.step_time_ns_median else 0.0
    return m.mean_share()


_CAUSE = {
    "data": " (waiting for input)",
    "compute": " (slower compute)",
    "host": " (host overhead)",
    "hardware": " (a slower GPU)",
}


def _straggler(f: Finding, who: str, share: float) -> str:
    """A straggler's headline; on a busy host, the host first (``busy host: …``)."""
    m = f.metrics
    busy = getattr(m, "host_contention", None)
    text = _straggler_text(f, who, share)
    if not busy:
        return text
    return f"busy host: {text.removeprefix('straggler: ')} — {busy_host_words(busy)}: {BUSY_HOST}"


def _straggler_text(f: Finding, who: str, share: float) -> str:
    """A straggler's headline in its finding's own terms: excess, stall count or waiting."""
    m = f.metrics
    cause = _CAUSE.get(str(f.cause), "")
    if isinstance(m, LateArrivalMetrics):
        wait = words.duration(m.waited_ns_per_step, "brief")
        return (
            f"straggler: {who} arrives last at {m.last_at} of {m.collectives_matched} "
            f"collectives{cause}; the others wait {wait} a step for it "
            f"({words.percent(share)} of each step)"
        )
    if isinstance(m, StragglerMetrics) and not f.persistent:
        return (
            f"straggler: {who} stalled in {m.slow_steps} of {m.steps_compared} steps, "
            f"~{words.duration(m.median_excess_ns, 'brief')} behind the others each time"
            f"{cause}; the others wait for it"
        )
    wait = ""
    if isinstance(m, StragglerMetrics) and m.step_time_ns_mean:
        gain = m.step_time_ns_mean - m.step_time_ns_if_median_speed
        wait = f" {words.duration(gain, 'brief')} a step"
    return (
        f"straggler: {who}{cause} costs {words.percent(share)} of each step: the others "
        f"wait{wait} for it"
    )


def with_efficiency(v: Verdict, eff: ComputeEfficiency | None) -> Verdict:
    """A compute-held verdict says how close the compute ran to the device's peak.

    "No bottleneck" is where the next question starts: is that compute any good? The
    family with the most kernel time among those with a share of peak is named with its
    format path and share, and the device's fastest 16-bit path when it is more than
    ``1.5×`` that path's peak (:mod:`gpudiag.analysis.efficiency`).
    """
    if v.bottleneck != "none" or eff is None:
        return v
    rated = [f for f in eff.families if f.tflops is not None and f.peak_share is not None]
    if not rated:
        return v
    top = max(rated, key=lambda f: f.kernel_ns)
    text = f"; {top.family} {top.path} at {words.percent(top.peak_share or 0.0)} of its peak"
    peak = peak_of(eff.device)
    if peak is not None and top.peak:
        path, best = peak.best()
        if best > 1.5 * top.peak:
            text += f" ({path} would offer {best / top.peak:.1f}× that peak)"
    return dataclasses.replace(v, headline=v.headline + text)
