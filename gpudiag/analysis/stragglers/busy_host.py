"""Stragglers on a busy host: who is to blame, the job or the host's other processes.

The words the verdict and the remedies use for a busy host, the rule that keeps a
straggler the job's own (:func:`own_straggler`), and the qualification of the straggler
findings the contention could explain (:func:`on_busy_host`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gpudiag.analysis.model.diagnosis import Cause, Finding, FindingKind, Severity
from gpudiag.analysis.model.metrics import LateArrivalMetrics, StragglerMetrics
from gpudiag.config import StragglerRules

BUSY_HOST = "likely the host, not the job; re-run on a quiet host"


def busy_host_words(busy: Mapping[str, float]) -> str:
    """``other processes used 65% of the CPUs during the run`` (and the steal time)."""
    parts = []
    if busy.get("other_cpu_ratio") is not None:
        parts.append(f"other processes used {busy['other_cpu_ratio']:.0%} of the CPUs")
    if busy.get("steal_ratio") is not None:
        parts.append(f"the hypervisor took {busy['steal_ratio']:.0%} of the CPUs' time")
    return " and ".join(parts) + " during the run"


def own_straggler(f: Finding, rules: StragglerRules) -> bool:
    """A persistent, one-sided excess of stable size: the job's straggler, however busy the host.

    Other processes take CPU from whichever rank runs when they do: their cost moves
    between ranks and grows and shrinks with their load. An excess that stays on one rank
    (slow in ≥ ``own_steps_ratio`` of the compared steps, another rank slow in ≤
    ``own_moved_ratio`` of them) with a stable size (robust spread ≤ ``own_spread_ratio``
    of its median) is the rank's own work.
    """
    m = f.metrics
    if not f.persistent or not isinstance(m, StragglerMetrics) or m.moved_steps_ratio is None:
        return False
    spread = m.excess_spread_ratio
    return bool(
        m.steps_compared
        and m.slow_steps >= rules.own_steps_ratio * m.steps_compared
        and m.moved_steps_ratio <= rules.own_moved_ratio
        and spread is not None
        and spread <= rules.own_spread_ratio
    )


def own_words(f: Finding) -> str:
    """Why a straggler is the job's own: where its excess stays and how steady it is."""
    m = f.metrics_as(StragglerMetrics)
    return (
        f"its excess stays on rank {f.ranks[0]} ({m.slow_steps} of {m.steps_compared} steps; "
        f"another rank slow in {m.moved_steps_ratio or 0:.0%}) at a steady size (spread "
        f"{m.excess_spread_ratio or 0:.0%} of it), which contention shared by every rank "
        "does not do: the job's own"
    )


def on_busy_host(
    findings: Sequence[Finding],
    busy: Mapping[str, float],
    gpu: bool,
    rules: StragglerRules | None = None,
) -> list[Finding]:
    """Stragglers that the run's recorded host contention likely explains, qualified.

    ``busy``: the host's CPU figures over the gate's limits
    (:func:`gpudiag.rundir.conditions.host_contention`). CPU time the other processes take is
    lost where the rank spends its CPU time: a CPU job's compute (its operators are most of
    its step). So on a CPU job a straggler whose excess is compute (or that the telemetry
    cannot split) may be the host's doing: the rank that falls behind is the one they
    happened to take CPU from — unless the excess is the job's own (:func:`own_straggler`:
    persistent, one-sided, of stable size), when the message says the host was busy too
    and why the straggler is still the job's. Otherwise the finding keeps its numbers, says
    the host is the
    likely cause (``metrics.host_contention``) and is a warning, not an error. A straggler
    that loses its time *outside* compute (sleeps, Python, logging: cause ``host``; its
    loader: ``data``) is not what contention stretches on a CPU job: its message only says
    the host was busy too. On a GPU job a host-side straggler could be a starved launch
    thread or the job's own (the trace cannot tell: the message says both); a slower GPU
    compute or loader is not the host's doing: left as it is.
    """
    if not busy:
        return list(findings)
    rules = rules or StragglerRules()
    out = []
    for f in findings:
        m = f.metrics
        if f.kind != FindingKind.STRAGGLER or not isinstance(
            m, (StragglerMetrics, LateArrivalMetrics)
        ):
            out.append(f)
        elif f.cause in (Cause.HOST, Cause.DATA) and (not gpu or f.cause == Cause.HOST):
            why = (
                "a starved launch thread could explain it"
                if gpu
                else "contention stretches a job's CPU compute, not its time outside it"
            )
            out.append(
                dataclasses.replace(
                    f,
                    message=f"{f.message} (the host was busy too: {busy_host_words(busy)}; {why})",
                )
            )
        elif gpu:
            out.append(f)
        elif own_straggler(f, rules):
            why = f"{busy_host_words(busy)}; {own_words(f)}"
            out.append(
                dataclasses.replace(f, message=f"{f.message} (the host was busy too: {why})")
            )
        else:
            out.append(
                dataclasses.replace(
                    f,
                    severity=Severity.WARNING,
                    message=f"{f.message} — {busy_host_words(busy)}: {BUSY_HOST}",
                    metrics=dataclasses.replace(m, host_contention=dict(busy)),
                )
            )
    return out
