"""The verdict: one line that names the dominant bottleneck, computed once from the findings.

Every renderer shows it first. It judges nothing anew. A run that hung, disagreed on a
collective, failed or was interrupted leads with that finding (docs/definitions.md,
"Verdict"); otherwise it picks, among the findings that
name a bottleneck (data, communication, straggler, pipeline, host), the most severe, and
among equally severe ones the one holding the largest share of step time. Without such a
finding the run has no bottleneck and the line says how its step time splits.

Evidence first (:mod:`gpudiag.analysis.evidence`): when limits withhold the split for
every rank, the verdict is withheld (bottleneck ``unknown``) and says why; other limits
qualify the line. Either way ``limits`` lists their sentences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpudiag.analysis import words
from gpudiag.analysis.evidence import WITHHOLD, Limit
from gpudiag.analysis.metrics import JobFailedMetrics, StragglerMetrics
from gpudiag.analysis.model import Finding, FindingKind, Mode, RunSummary, Severity, Verdict

BOTTLENECKS = ("data", "communication", "straggler", "pipeline", "host", "none", "unknown", "hang",
               "mismatch", "failure", "interrupted")  # fmt: skip
PROFILED = "profiled window"
WHOLE_RUN = "whole run"

_KIND = {
    FindingKind.DATA_BOUND: "data",
    FindingKind.COMM_BOUND: "communication",
    FindingKind.STRAGGLER: "straggler",
    FindingKind.PIPELINE_BUBBLE: "pipeline",
    FindingKind.HOST_BOUND: "host",
}


def _ended(findings: Sequence[Finding]) -> Verdict | None:
    """A hang root, a collective mismatch, a failed or an interrupted run leads the verdict."""
    for f in findings:
        if f.kind == FindingKind.HANG and f.severity == Severity.ERROR:
            return Verdict(f"hang: {f.message}", "hang", 0.0, list(f.ranks), WHOLE_RUN)
    for f in findings:
        if f.kind == FindingKind.COLLECTIVE_MISMATCH and f.severity == Severity.ERROR:
            return Verdict(f"collective mismatch: {f.message}", "mismatch", 0.0, list(f.ranks),
                           WHOLE_RUN)  # fmt: skip
    for f in findings:
        if f.kind != FindingKind.JOB_FAILED or not isinstance(f.metrics, JobFailedMetrics):
            continue
        if f.metrics.interrupted:
            return Verdict(f"interrupted: {f.message}", "interrupted", 0.0, list(f.ranks),
                           WHOLE_RUN)  # fmt: skip
        if f.severity == Severity.ERROR:
            return Verdict(f"failed: {f.message}", "failure", 0.0, list(f.ranks), WHOLE_RUN)
    return None


def verdict(run: RunSummary, findings: Sequence[Finding], lims: Sequence[Limit] = ()) -> Verdict:
    """The headline, bottleneck, share, ranks and basis (docs/definitions.md, "Verdict")."""
    ended = _ended(findings)
    if ended is not None:
        return ended
    named = [f for f in findings if f.kind in _KIND]
    if run.mode == Mode.TELEMETRY:  # no trace: every number is the step telemetry's
        return _telemetry_basis(_verdict(run, named))
    return _limited(_verdict(run, named), run, lims)


def _limited(v: Verdict, run: RunSummary, lims: Sequence[Limit]) -> Verdict:
    """The verdict withheld or qualified by what the trace cannot support."""
    if not lims:
        return v
    withheld = [lim for lim in lims if lim.effect == WITHHOLD]
    if len({r for lim in withheld for r in lim.ranks}) >= run.ranks:
        lim = withheld[0]
        v = Verdict(headline=f"withheld: {lim.message}", bottleneck="unknown", share=0.0,
                    ranks=list(lim.ranks), basis=v.basis)  # fmt: skip
    else:
        v = dataclasses.replace(v, headline=f"{v.headline} — qualified: {lims[0].message}")
    return dataclasses.replace(v, limits=[lim.message for lim in lims])


def _telemetry_basis(v: Verdict) -> Verdict:
    v = dataclasses.replace(v, basis=WHOLE_RUN)
    if v.bottleneck == "none":
        v = dataclasses.replace(v, headline=(
            f"no bottleneck in the step telemetry: busy {words.percent(v.share)}"
            " of each step (no trace to split compute from host work)"
        ))  # fmt: skip
    return v


def _verdict(run: RunSummary, named: Sequence[Finding]) -> Verdict:
    if not named:
        c, idle = run.shares.compute, run.idle_ratio
        return Verdict(
            headline=f"no bottleneck: compute {words.percent(c)}, non-compute idle "
            f"{words.percent(idle)}",
            bottleneck="none",
            share=c,
            ranks=[],
            basis=PROFILED,
        )
    f = min(named, key=lambda f: (Severity(f.severity).order, -f.metrics.share()))
    kind = _KIND[f.kind]
    share = f.metrics.mean_share()
    who = words.ranks(f.ranks) if f.ranks else "the run"
    basis = PROFILED
    if kind == "straggler":
        m = f.metrics
        basis = (
            WHOLE_RUN if isinstance(m, StragglerMetrics) and m.source == "telemetry" else PROFILED
        )
        cause = {"data": " (waiting for input)", "compute": " (slower compute)",
                 "host": " (host overhead)", "hardware": " (a slower GPU)"}.get(
            str(f.cause), "")  # fmt: skip
        text = (f"straggler: {who} runs {words.percent(share)} slower than the median rank"
                f"{cause}; the others wait for it")  # fmt: skip
    elif kind == "pipeline":
        text = f"pipeline bubble: stages idle {words.percent(share)} of each step"
    else:
        verb = "waits" if len(f.ranks) == 1 else "wait"
        lose = "loses" if len(f.ranks) == 1 else "lose"
        text = {
            "data": f"data-bound: {who} {verb} for input {words.percent(share)} of each step",
            "communication": f"communication-bound: {who} {verb} for collectives "
            f"{words.percent(share)} of each step",
            "host": f"host-bound: {who} {lose} {words.percent(share)} of each step to host "
            "overhead, launch gaps or synchronisation",
        }[kind]
    return Verdict(headline=text, bottleneck=kind, share=share, ranks=list(f.ranks), basis=basis)
