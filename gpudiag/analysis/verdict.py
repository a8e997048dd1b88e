"""The verdict: one line that names the dominant bottleneck, computed once from the findings.

Every renderer shows it first. It judges nothing anew: it picks, among the findings that
name a bottleneck (data, communication, straggler, pipeline, host), the most severe, and
among equally severe ones the one holding the largest share of step time. Without such a
finding the run has no bottleneck and the line says how its step time splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpudiag.analysis import words
from gpudiag.analysis.model import Finding, FindingKind, RunSummary, Severity

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


def _share(f: Finding) -> float:
    """The share of step time a finding is about (its largest per-rank value)."""
    m = f.metrics
    if f.kind == FindingKind.STRAGGLER:
        return float(m.get("median_excess_ratio", 0.0))
    if f.kind == FindingKind.PIPELINE_BUBBLE:  # the schedule's bubble counts end-of-step drain
        return max(float(m.get("bubble_ratio", 0.0)), float(m.get("ideal_bubble_ratio", 0.0)))
    per = m.get("per_rank") or {}
    return max((float(v) for v in per.values()), default=0.0)


def _mean_share(f: Finding) -> float:
    per = f.metrics.get("per_rank") or {}
    vals = [float(v) for v in per.values()]
    return sum(vals) / len(vals) if vals else _share(f)


def verdict(run: RunSummary, findings: Sequence[Finding]) -> dict[str, Any]:
    """``{headline, bottleneck, share, ranks, basis}`` (docs/definitions.md, "Verdict")."""
    named = [f for f in findings if f.kind in _KIND]
    if run.mode == "telemetry":  # no trace: every number is the step telemetry's
        return _telemetry_basis(_verdict(run, named))
    return _verdict(run, named)


def _telemetry_basis(v: dict[str, Any]) -> dict[str, Any]:
    v = dict(v)
    v["basis"] = WHOLE_RUN
    if v["bottleneck"] == "none":
        v["headline"] = (
            f"no bottleneck in the step telemetry: busy {words.percent(v['share'])}"
            " of each step (no trace to split compute from host work)"
        )
    return v


def _verdict(run: RunSummary, named: Sequence[Finding]) -> dict[str, Any]:
    if not named:
        c, idle = run.shares.compute, run.idle_ratio
        return {
            "headline": f"no bottleneck: compute {words.percent(c)}, idle {words.percent(idle)}",
            "bottleneck": "none",
            "share": c,
            "ranks": [],
            "basis": PROFILED,
        }
    f = min(named, key=lambda f: (Severity(f.severity).order, -_share(f)))
    kind = _KIND[f.kind]
    share = _mean_share(f)
    who = words.ranks(f.ranks) if f.ranks else "the run"
    basis = PROFILED
    if kind == "straggler":
        basis = WHOLE_RUN if f.metrics.get("source") == "telemetry" else PROFILED
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
    return {
        "headline": text,
        "bottleneck": kind,
        "share": share,
        "ranks": list(f.ranks),
        "basis": basis,
    }
