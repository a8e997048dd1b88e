"""Stragglers on a busy host: findings that the run's recorded CPU contention likely explains.

The words the verdict and the remedies use for a busy host, and the qualification of the
straggler findings it could explain (:func:`on_busy_host`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gpudiag.analysis.model.diagnosis import Cause, Finding, FindingKind, Severity
from gpudiag.analysis.model.metrics import LateArrivalMetrics, StragglerMetrics

BUSY_HOST = "likely the host, not the job; re-run on a quiet host"


def busy_host_words(busy: Mapping[str, float]) -> str:
    """``other processes used 65% of the CPUs during the run`` (and the steal time)."""
    parts = []
    if busy.get("other_cpu_ratio") is not None:
        parts.append(f"other processes used {busy['other_cpu_ratio']:.0%} of the CPUs")
    if busy.get("steal_ratio") is not None:
        parts.append(f"the hypervisor took {busy['steal_ratio']:.0%} of the CPUs' time")
    return " and ".join(parts) + " during the run"


def on_busy_host(
    findings: Sequence[Finding], busy: Mapping[str, float], gpu: bool
) -> list[Finding]:
    """Stragglers that the run's recorded host contention likely explains, qualified.

    ``busy``: the host's CPU figures over the gate's limits
    (:func:`gpudiag.rundir.conditions.host_contention`). CPU time the other processes take is
    lost where the rank spends its CPU time: a CPU job's compute (its operators are most of
    its step). So on a CPU job a straggler whose excess is compute (or that the telemetry
    cannot split) is likely the host's doing: the rank that falls behind is the one they
    happened to take CPU from. Such a finding keeps its numbers, says the host is the
    likely cause (``metrics.host_contention``) and is a warning, not an error. A straggler
    that loses its time *outside* compute (sleeps, Python, logging: cause ``host``; its
    loader: ``data``) is not what contention stretches on a CPU job: its message only says
    the host was busy too. On a GPU job a host-side straggler could be a starved launch
    thread or the job's own (the trace cannot tell: the message says both); a slower GPU
    compute or loader is not the host's doing: left as it is.
    """
    if not busy:
        return list(findings)
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
