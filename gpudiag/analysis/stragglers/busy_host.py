"""Stragglers on a busy host: who is to blame, the job or the host's other processes.

The words the verdict and the remedies use for a busy host, the rule that keeps a
straggler the job's own (:func:`own_straggler`), whether its excess follows the measured
contention over time (:func:`follows_contention`), and the qualification of the straggler
findings the contention could explain (:func:`on_busy_host`).

The rule (docs/definitions.md, "who is to blame"): the host is named as a likely cause
only when the excess **moves** between ranks (the rank is slow in fewer than
``own_steps_ratio`` of the compared steps, or another rank in more than
``own_moved_ratio`` of them) or **follows the contention**: over the run's telemetry steps
(``time.time_ns``, the clock of the conditions samples), at least ``follow_min_steps``
steps overlap a sample, the CPU share other processes and the hypervisor took in each step
(the samples' overlap-weighted mean) spans at least ``follow_min_range`` of the CPUs
(p90 − p10), and the Spearman rank correlation of the rank's excess in each step (its busy
time over the others' median) with it is at least ``follow_rho``. Where no such series
exists (no telemetry, too few sampled steps), the excess's stable size stands in for
"does not follow" (:func:`own_straggler`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from gpudiag.analysis.model.diagnosis import Cause, Finding, FindingKind, RunStep, Severity
from gpudiag.analysis.model.metrics import LateArrivalMetrics, StragglerMetrics
from gpudiag.config import StragglerRules
from gpudiag.rundir.conditions import ContentionSample

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


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks of ``a`` (0-based), ties given their mean rank (for Spearman's ρ)."""
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(len(a))
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    return np.bincount(inv, weights=r)[inv] / counts[inv]


def step_contention(
    start_ns: int, end_ns: int, samples: Sequence[ContentionSample]
) -> float | None:
    """The samples' contention over ``[start_ns, end_ns)``, weighted by overlap (None: none)."""
    total = weight = 0.0
    for s in samples:
        o = min(end_ns, s.end_ns) - max(start_ns, s.start_ns)
        if o > 0:
            total += o * s.ratio
            weight += o
    return total / weight if weight else None


def follows_contention(
    steps: Sequence[RunStep],
    rank: int,
    samples: Sequence[ContentionSample],
    rules: StragglerRules,
) -> tuple[float, float, int] | None:
    """(ρ, contention range, steps): does ``rank``'s excess follow the host's contention?

    Over the telemetry steps every rank has, with backward (else comm-wait) measured: the
    rank's busy time (step − backward) over the others' median in that step, against the
    contention in the step (:func:`step_contention`). ρ is Spearman's rank correlation
    (0 where either series is constant), the range the contention's p90 − p10 over those
    steps. None when fewer than ``follow_min_steps`` steps overlap a sample.
    """
    busy: dict[int, dict[int, float]] = {}
    span: dict[int, tuple[int, int]] = {}
    for s in steps:
        wait = s.backward_ns if s.backward_ns is not None else s.comm_wait_ns
        if wait is None or s.profiled:
            continue
        busy.setdefault(s.step, {})[s.rank] = float(s.duration_ns - wait)
        if s.rank == rank:
            span[s.step] = (s.start_ns, s.start_ns + s.duration_ns)
    ex: list[float] = []
    cont: list[float] = []
    for st, (a, b) in sorted(span.items()):
        others = [v for r, v in busy[st].items() if r != rank]
        here = step_contention(a, b, samples) if others else None
        if here is not None:
            ex.append(busy[st][rank] - float(np.median(others)))
            cont.append(here)
    if len(ex) < rules.follow_min_steps:
        return None
    e, c = np.array(ex), np.array(cont)
    spread = float(np.percentile(c, 90) - np.percentile(c, 10))
    re_, rc = _ranks(e), _ranks(c)
    rho = 0.0 if re_.std() == 0 or rc.std() == 0 else float(np.corrcoef(re_, rc)[0, 1])
    return round(rho, 4), round(spread, 4), len(ex)


def _moves(f: Finding, rules: StragglerRules) -> bool:
    """The excess moves between ranks: the rank is not the slow one nearly every time."""
    m = f.metrics
    if isinstance(m, StragglerMetrics):
        if m.moved_steps_ratio is None or not m.steps_compared:
            return True
        return bool(
            m.slow_steps < rules.own_steps_ratio * m.steps_compared
            or m.moved_steps_ratio > rules.own_moved_ratio
        )
    if isinstance(m, LateArrivalMetrics):
        n = m.collectives_matched
        return bool(
            not n
            or m.last_at < rules.own_steps_ratio * n
            or m.next_rank_last_at > rules.own_moved_ratio * n
        )
    return True


def blames_host(f: Finding, rules: StragglerRules, follow: tuple[float, float, int] | None) -> bool:
    """The rule of the module docstring: the excess moves, or follows the contention."""
    if follow is None:  # no series over time: a stable size stands in for "does not follow"
        return not own_straggler(f, rules)
    rho, spread, _ = follow
    return _moves(f, rules) or (spread >= rules.follow_min_range and rho >= rules.follow_rho)


def own_words(
    f: Finding,
    follow: tuple[float, float, int] | None = None,
    rules: StragglerRules | None = None,
) -> str:
    """Why a straggler is the job's own: where its excess stays and how it varies."""
    m = f.metrics
    if follow is not None:
        rho, spread, n = follow
        where = (
            f"its excess stays on rank {f.ranks[0]} ({m.slow_steps} of {m.steps_compared} steps; "
            f"another rank slow in {m.moved_steps_ratio or 0:.0%})"
            if isinstance(m, StragglerMetrics)
            else f"rank {f.ranks[0]} is last at {m.last_at} of {m.collectives_matched} collectives"
            if isinstance(m, LateArrivalMetrics)
            else f"its excess stays on rank {f.ranks[0]}"
        )
        how = (
            f"the contention hardly varied ({spread:.0%} of the CPUs between its p10 and p90 "
            f"over {n} steps)"
            if spread < (rules or StragglerRules()).follow_min_range
            else (
                "its size does not follow the contention "
                f"(rank correlation {rho:+.2f} over {n} steps)"
            )
        )
        return (
            f"{where} and {how}, which contention shared by every rank would not do: the job's own"
        )
    sm = f.metrics_as(StragglerMetrics)
    return (
        f"its excess stays on rank {f.ranks[0]} ({sm.slow_steps} of {sm.steps_compared} steps; "
        f"another rank slow in {sm.moved_steps_ratio or 0:.0%}) at a steady size (spread "
        f"{sm.excess_spread_ratio or 0:.0%} of it), which contention shared by every rank "
        "does not do: the job's own"
    )


def on_busy_host(
    findings: Sequence[Finding],
    busy: Mapping[str, float],
    gpu: bool,
    rules: StragglerRules | None = None,
    steps: Sequence[RunStep] = (),
    contention: Mapping[int, Sequence[ContentionSample]] | None = None,
) -> list[Finding]:
    """Stragglers that the run's recorded host contention likely explains, qualified.

    ``busy``: the host's CPU figures over the gate's limits
    (:func:`gpudiag.rundir.conditions.host_contention`). CPU time the other processes take is
    lost where the rank spends its CPU time: a CPU job's compute (its operators are most of
    its step). So on a CPU job a straggler whose excess is compute (or that the telemetry
    cannot split) may be the host's doing — only when its excess moves between ranks or
    follows the contention over time (:func:`blames_host`; ``steps``: the run's telemetry
    steps, ``contention``: each rank's host's samples); otherwise it is the job's own, and
    the message says the host was busy too and why the straggler is still the job's. A
    straggler the host likely explains keeps its numbers, says so
    (``metrics.host_contention``) and is a warning, not an error. A straggler
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
            continue
        if f.cause in (Cause.HOST, Cause.DATA) and (not gpu or f.cause == Cause.HOST):
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
            continue
        if gpu:
            out.append(f)
            continue
        samples = (contention or {}).get(f.ranks[0], ()) if f.ranks else ()
        out.append(_cpu_straggler(f, busy, rules, steps, samples))
    return out


def _cpu_straggler(
    f: Finding,
    busy: Mapping[str, float],
    rules: StragglerRules,
    steps: Sequence[RunStep],
    samples: Sequence[ContentionSample],
) -> Finding:
    """A CPU job's compute straggler on a busy host: the job's own, or the host's likely doing."""
    m = f.metrics
    assert isinstance(m, (StragglerMetrics, LateArrivalMetrics))
    follow = follows_contention(steps, f.ranks[0], samples, rules) if samples else None
    if follow is not None and isinstance(m, StragglerMetrics):
        rho, spread, n = follow
        m = dataclasses.replace(m, contention_follow={"rho": rho, "range": spread, "steps": n})
        f = dataclasses.replace(f, metrics=m)
    if not blames_host(f, rules, follow):
        why = f"{busy_host_words(busy)}; {own_words(f, follow, rules)}"
        return dataclasses.replace(f, message=f"{f.message} (the host was busy too: {why})")
    tracks = (
        ""
        if follow is None or _moves(f, rules)
        else (
            f"; its excess follows the host's contention (rank correlation "
            f"{follow[0]:+.2f} over {follow[2]} steps)"
        )
    )
    return dataclasses.replace(
        f,
        severity=Severity.WARNING,
        message=f"{f.message} — {busy_host_words(busy)}{tracks}: {BUSY_HOST}",
        metrics=dataclasses.replace(m, host_contention=dict(busy)),
    )
