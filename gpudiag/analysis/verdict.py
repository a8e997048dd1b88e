"""The verdict: one line that names the dominant bottleneck, computed once from the findings.

Every renderer shows it first. It judges nothing anew: it picks, among the findings that
name a bottleneck (data, communication, straggler, pipeline, host), the most severe, and
among equally severe ones the one holding the largest share of step time. Without such a
finding the run has no bottleneck and the line says how its step time splits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpudiag.analysis import words
from gpudiag.analysis.metrics import LateArrivalMetrics, StragglerMetrics
from gpudiag.analysis.model import Finding, FindingKind, Mode, RunSummary, Severity, Verdict

BOTTLENECKS = ("data", "communication", "straggler", "pipeline", "host", "none")
PROFILED = "profiled window"
WHOLE_RUN = "whole run"

_KIND = {
    FindingKind.DATA_BOUND: "data",
    FindingKind.COMM_BOUND: "communication",
    FindingKind.STRAGGLER: "straggler",
    FindingKind.PIPELINE_BUBBLE: "pipeline",
    FindingKind.HOST_BOUND: "host",
}


def verdict(run: RunSummary, findings: Sequence[Finding]) -> Verdict:
    """The headline, bottleneck, share, ranks and basis (docs/definitions.md, "Verdict")."""
    named = [f for f in findings if f.kind in _KIND]
    index = {id(f): i for i, f in enumerate(findings)}
    if run.mode == Mode.TELEMETRY:  # no trace: every number is the step telemetry's
        return _telemetry_basis(_verdict(run, named, index))
    return _verdict(run, named, index)


def _telemetry_basis(v: Verdict) -> Verdict:
    v = dataclasses.replace(v, basis=WHOLE_RUN)
    if v.bottleneck == "none":
        v = dataclasses.replace(v, headline=(
            f"no bottleneck in the step telemetry: busy {words.percent(v.share)}"
            " of each step (no trace to split compute from host work)"
        ))  # fmt: skip
    return v


def _verdict(run: RunSummary, named: Sequence[Finding], index: dict[int, int]) -> Verdict:
    if not named:
        c, idle = run.shares.compute, run.idle_ratio
        return Verdict(
            headline=f"no bottleneck: compute {words.percent(c)}, idle {words.percent(idle)}",
            bottleneck="none",
            share=c,
            ranks=[],
            basis=PROFILED,
        )
    f = min(named, key=lambda f: (Severity(f.severity).order, -_share(f)))
    kind = _KIND[f.kind]
    share = _share(f)
    who = words.ranks(f.ranks) if f.ranks else "the run"
    basis = PROFILED
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
            "communication": f"communication-bound: {who} {verb} for collectives "
            f"{words.percent(share)} of each step",
            "host": f"host-bound: {who} {lose} {words.percent(share)} of each step to host "
            "overhead, launch gaps or synchronisation",
        }[kind]
    return Verdict(headline=text, bottleneck=kind, share=share, ranks=list(f.ranks),
                   basis=basis, finding=index[id(f)])  # fmt: skip


def _share(f: Finding) -> float:
    """The share of step time a finding stands for, in its own terms.

    A persistent straggler: its typical excess over the others (``median_excess_ratio``);
    intermittent stalls: what they cost a step on average (the excess of a stall × the
    stalls / the steps compared); a late rank: the others' waiting for it per step over the
    step; any other finding: its mean share over its ranks.
    """
    m = f.metrics
    if isinstance(m, StragglerMetrics):
        if f.persistent:
            return m.median_excess_ratio
        return m.median_excess_ratio * m.slow_steps / max(m.steps_compared, 1)
    if isinstance(m, LateArrivalMetrics):
        return m.waited_ns_per_step / m.step_time_ns_median if m.step_time_ns_median else 0.0
    return m.mean_share()


_CAUSE = {"data": " (waiting for input)", "compute": " (slower compute)",
          "host": " (host overhead)", "hardware": " (a slower GPU)"}  # fmt: skip


def _straggler(f: Finding, who: str, share: float) -> str:
    """A straggler's headline in its finding's own terms: excess, stall count or waiting."""
    m = f.metrics
    cause = _CAUSE.get(str(f.cause), "")
    if isinstance(m, LateArrivalMetrics):
        wait = words.duration(m.waited_ns_per_step, "brief")
        return (f"straggler: {who} arrives last at {m.last_at} of {m.collectives_matched} "
                f"collectives{cause}; the others wait {wait} a step for it "
                f"({words.percent(share)} of each step)")  # fmt: skip
    if isinstance(m, StragglerMetrics) and not f.persistent:
        return (f"straggler: {who} stalled in {m.slow_steps} of {m.steps_compared} steps, "
                f"~{words.duration(m.median_excess_ns, 'brief')} behind the others each time"
                f"{cause}; the others wait for it")  # fmt: skip
    return (f"straggler: {who} runs {words.percent(share)} slower than the median rank"
            f"{cause}; the others wait for it")  # fmt: skip
