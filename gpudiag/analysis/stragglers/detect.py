"""Compares ranks within each step and flags slow ones, metric spelled out → Finding.

A synchronous collective cannot finish before the last rank reaches it, so a slow rank
makes every other rank wait, and raw communication time measures *the others'*
slowness: the straggler is the rank with the **least** waiting. gpudiag therefore compares
the work each rank does before it must synchronise:

    busy[r, s] = step time − communication wait        (profiled window: compute + data + other)
    busy[r, s] = step time − time in backward          (telemetry: backward holds DDP's wait;
                                                         profiled steps left out: see wholerun)

and, per step, the excess of a rank over the median of the *other* ranks
(``excess[r, s] = busy[r, s] − median_{r' ≠ r} busy[r', s]``, a leave-one-out reference
that also works with two ranks).

The rule constants are ``Thresholds.stragglers`` (``[tool.gpudiag.stragglers]``):

* (r, s) is **slow** when ``excess ≥ excess_ratio`` (0.10) × the run's median step time,
  and the rank waited less than the others in that step (the confirmation of reference
  §1: a straggler has the smallest wait).
* A rank is a **persistent** straggler when a sign test across the n compared steps says
  it is ahead of the others more often than chance (P(X ≥ k), X ~ Binomial(n, ½), below
  ``persistent_alpha``, 0.1; n ≥ ``min_persistent_steps``, 4), its *typical* excess (the
  median over all n steps) is at least ``excess_ratio`` of a step, and at least 2 steps
  are slow — so 3 of 6 steps (a coin toss) is never persistent; its relative score
  ``min_r' median_s busy / median_s busy[r]`` is reported (NVRx style; below 0.75 is a
  strong straggler).
* Otherwise slow steps whose excess is at least ``spike_ratio`` (0.25) of the median step
  time, and above the run's own jitter (``jitter_sigmas``, 3.5, robust standard deviations
  of all excesses), are **intermittent** stalls: a GC, a checkpoint, a data hiccup. They
  must happen at least ``min_spikes`` (3) times (two hiccups in a run are noise on a
  shared host), unless one lasts a whole step. When they recur at a fixed period
  (every N-th step) the message says so, and the profiled window's steps of that period
  are checked in the trace (the telemetry leaves the profiled steps out, since profiling
  perturbs them). A stall must also stand out from the rank's own median busy time (with
  two ranks, one rank's dip is the other's excess). In a trace window shorter than
  ``short_window_steps`` (12) every stall is named with its steps, and the message says
  the window is too short to tell persistent from periodic; there, a rank whose stalls hold
  ``short_window_stall_share`` (half) of its excess is not called persistent (the stalls
  lift the median excess of so few steps).
* **Late arrival** (:func:`late_arrival`): when no rule names a rank, the rank the
  others wait for at the matched collectives — last at most of them (at least
  ``collectives.late_share``, twice as often as the next, beyond chance for one of R
  ranks) or the one that half or more of all that waiting is for — while the others lose
  at least ``excess_ratio`` of a step waiting for it: from one profiled step upward.
* The **cause** comes from the straggler's own parts in its slow steps against the others'
  median (the median over those steps, so one host-disturbed step does not decide): the
  largest excess among data-wait (→ ``data``), compute (→ ``compute``, or ``hardware``
  when NVML shows that rank's GPU slowed down by the driver in ≥ ``slowdown_ratio`` of the
  samples or clocked ≥ ``clock_deficit_ratio`` below the others), and the rest (→
  ``host``: Python, launch overhead, sleeps). A second part at least ``also_ratio`` of the
  cause's excess and ``also_step_ratio`` of a step is named too.
* The **cost**: ``wait_caused_ns`` = the other ranks' waiting attributed to it over its
  slow steps: their synchronisation wait in matched collectives (transfer/sync split of
  :mod:`gpudiag.analysis.run.collectives`) when the profiled window is the source, else
  Σ ``min(busy[r] − busy[r'], wait[r'])``; and the median step time if it ran at the
  others' speed.

Nothing is named with one rank, or when every rank is within the thresholds; the
telemetry (every step) is preferred to the few profiled steps when both exist, but its busy
time leaves out all of backward (DDP's all-reduce wait cannot be told from backward
compute there), so persistent stragglers of the profiled steps that it misses are added
when the telemetry shows the same rank ahead in ≥ ``lean_steps_ratio`` (80%) of its
steps by a median ≥ ``lean_excess_ratio`` (3%) of a step. Only steady steps count
(:mod:`gpudiag.analysis.reading.steady`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gpudiag._support import nputil
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Cause,
    Finding,
    FindingKind,
    GpuStats,
    Severity,
    StepBreakdown,
    WholeRun,
)
from gpudiag.analysis.model.metrics import StragglerMetrics
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.stragglers.cause import (
    CAUSE_WORDS,
    PART_WORDS,
    StragglerContext,
    also_parts,
    cause_of,
)
from gpudiag.analysis.stragglers.stepmatrix import (
    F64,
    StepMatrix,
    at_median_speed,
    excess,
    jitter_ns,
    sign_test,
    slow_steps,
    telemetry_matrix,
    trace_matrix,
)
from gpudiag.config import SteadyRules, StragglerRules


def find_stragglers(
    trace_steps: Sequence[StepBreakdown],
    whole: WholeRun | None = None,
    rules: StragglerRules | None = None,
    steady: SteadyRules | None = None,
    sync_by_step: Mapping[tuple[int, int], int] | None = None,
    gpus: Sequence[GpuStats] | None = None,
) -> list[Finding]:
    """Straggler findings of a run (telemetry preferred; the trace window gives causes).

    ``gpus`` default to the whole run's NVML summaries.
    """
    rules = rules or StragglerRules()
    tele = telemetry_matrix(whole, steady or SteadyRules())
    trace = trace_matrix(trace_steps)
    m = tele or trace
    if m is None:
        return []
    sync = sync_by_step or {}
    members = set(trace.ranks) if trace else set()
    totals: dict[int, int] = {}
    for (r, st), v in sync.items():
        if r in members:
            totals[st] = totals.get(st, 0) + v
    if gpus is None:
        gpus = whole.gpus if whole else ()
    ctx = StragglerContext(trace, gpus, rules, sync, totals)
    findings = _detect(m, ctx)
    if m is tele and trace is not None:
        # The telemetry counts all of backward as waiting (DDP's all-reduce wait hides in
        # it), so a rank that computes longer in backward shows there only by its slower
        # forward; the profiled window splits them. Its persistent stragglers the telemetry
        # missed are added when the telemetry leans the same way in nearly every step (the
        # profiler perturbs its few steps, unevenly across ranks on a busy host).
        named = {f.ranks[0] for f in findings}
        for f in _detect(trace, ctx, persistent_only=True):
            if f.ranks[0] not in named and _leans_slow(tele, f.ranks[0], rules):
                findings.append(
                    dataclasses.replace(
                        f,
                        message=f"{f.message} (seen in the profiled steps: the step telemetry "
                        "cannot split compute from waiting inside backward)",
                    )
                )
    return findings


def _leans_slow(m: StepMatrix, rank: int, rules: StragglerRules) -> bool:
    """The rank's telemetry busy time exceeds the others' in nearly every step."""
    if rank not in m.ranks:
        return False
    ex = excess(m.busy)[m.ranks.index(rank)]
    typical = float(nputil.median(m.duration))
    return bool(
        np.mean(ex > 0) >= rules.lean_steps_ratio
        and nputil.median(ex) >= rules.lean_excess_ratio * typical
    )


def _detect(m: StepMatrix, ctx: StragglerContext, persistent_only: bool = False) -> list[Finding]:
    rules = ctx.rules
    ex, slow, step = slow_steps(m, rules)
    n = len(m.steps)
    # a stall stands out from the step, from the run's jitter and from the rank's own steps
    # (with two ranks, one rank's dip is the other's excess)
    own = m.busy - np.median(m.busy, axis=1, keepdims=True)
    spike_limit = max(rules.spike_ratio * step, rules.jitter_sigmas * jitter_ns(ex))
    findings: list[Finding] = []
    for i in range(len(m.ranks)):
        typical = float(nputil.median(ex[i]))
        stalls = slow[i] & (ex[i] >= spike_limit) & (own[i] >= spike_limit)
        persistent = bool(
            n >= rules.min_persistent_steps
            and typical >= rules.excess_ratio * step
            and sign_test(int(np.count_nonzero(ex[i] > 0)), n) < rules.persistent_alpha
            and np.count_nonzero(slow[i]) >= 2
            and not _stalls_dominate(m, ex[i], stalls, rules)
            and _costly(m, i, rules)
        )
        if persistent:
            flagged = np.flatnonzero(slow[i])
        elif persistent_only:
            continue
        else:
            flagged = np.flatnonzero(stalls)
            whole_step = bool((ex[i, flagged] >= step).any())
            enough = flagged.size >= rules.min_spikes or whole_step or _short(m, rules)
            if not flagged.size or not enough:
                continue
        extra = [] if persistent else _confirmed_in_window(m, ctx.trace, i, flagged, rules)
        f = _finding(m, ctx, i, flagged, persistent, ex, extra)
        findings.append(_with_blame(f, ex[i], slow, i) if persistent else f)
    return findings


def _with_blame(f: Finding, own: F64, slow: npt.NDArray[np.bool_], i: int) -> Finding:
    """A persistent straggler with its blame evidence: does the excess move, is it steady?

    ``moved_steps_ratio``: the share of compared steps in which another rank was slow;
    ``excess_spread_ratio``: the robust spread of its excess over the compared steps ÷
    its median (:func:`gpudiag.analysis.stragglers.busy_host.own_straggler` reads both).
    """
    others = np.delete(slow, i, axis=0)
    moved = float(others.any(axis=0).mean()) if others.size else 0.0
    med = float(nputil.median(own)) if own.size else 0.0
    spread = jitter_ns(own) / med if med > 0 else float("inf")
    m = dataclasses.replace(
        f.metrics_as(StragglerMetrics),
        moved_steps_ratio=round(moved, 4),
        excess_spread_ratio=round(min(spread, 99.0), 4),
    )
    return dataclasses.replace(f, metrics=m)


def _costly(m: StepMatrix, i: int, rules: StragglerRules) -> bool:
    """Rank ``i`` at the others' speed would shorten the mean step by ``excess_ratio`` of it.

    The cost the finding, the verdict, the what-if and the remedy quote: a rank whose typical
    excess the others absorb without waiting (or whose excess comes in steps they wait in
    anyway) is no persistent straggler.
    """
    now, after = at_median_speed(m, i)
    return now - after >= rules.excess_ratio * now


def _stalls_dominate(
    m: StepMatrix, ex: F64, stalls: npt.NDArray[np.bool_], rules: StragglerRules
) -> bool:
    """In a short window, stalls holding most of a rank's excess are stalls, not persistence.

    Two 0.5 s stalls in 6 steps beside a rank slowed ~25 ms a step by a busy host would
    otherwise be a "persistent straggler" typically 20% slower: the stalls lift the median
    excess of so few steps. When the stalls hold at least ``short_window_stall_share`` of
    the rank's excess, the window names them (too few steps to tell the rest).
    """
    if not _short(m, rules) or not stalls.any():
        return False
    total = float(np.clip(ex, 0, None).sum())
    return total > 0 and float(ex[stalls].sum()) >= rules.short_window_stall_share * total


def _confirmed_in_window(
    m: StepMatrix,
    trace: StepMatrix | None,
    i: int,
    flagged: npt.NDArray[np.intp],
    rules: StragglerRules,
) -> list[int]:
    """Profiled steps that continue a periodic stall, confirmed by the trace's own excess.

    The telemetry leaves the profiled window out (the profiler perturbs it); when the stalls
    recur every N-th step, the window's steps of the same residue are checked in the trace.
    """
    if m.source != "telemetry" or trace is None or m.ranks[i] not in trace.ranks:
        return []
    steps = [m.steps[j] for j in flagged.tolist()]
    n = _period(steps, m.steps)
    if n is None:
        return []
    ti = trace.ranks.index(m.ranks[i])
    tex = excess(trace.busy)
    typical = float(nputil.median(m.duration))
    return [
        s
        for j, s in enumerate(trace.steps)
        if s % n == steps[0] % n and s not in m.steps and tex[ti, j] >= rules.spike_ratio * typical
    ]


def _short(m: StepMatrix, rules: StragglerRules) -> bool:
    """A profiled window too short to tell a persistent straggler from periodic stalls."""
    return m.source == "trace" and len(m.steps) < rules.short_window_steps


def _and(items: Sequence[int], most: int = 8) -> str:
    """``3``, ``3 and 7``, ``3, 7 and 11``; ``…`` past ``most`` items."""
    shown = [str(x) for x in items[:most]]
    if len(items) > most:
        return ", ".join(shown) + " …"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _period(steps: list[int], compared: Sequence[int]) -> int | None:
    """N when the slow steps recur every N-th step, else None.

    At least 3 of them, and every compared step of the same residue modulo N among them:
    steps left out of the comparison (the profiled window) do not break the pattern.
    """
    if len(steps) < 3:
        return None
    n = int(np.gcd.reduce(np.diff(steps)))
    if n <= 1:
        return None
    same = [s for s in compared if s % n == steps[0] % n]
    return n if set(same) <= set(steps) else None


def _caused(
    m: StepMatrix, ctx: StragglerContext, i: int, flagged: npt.NDArray[np.intp], steps: list[int]
) -> tuple[int, str]:
    """The other ranks' waiting attributed to rank ``i`` over its slow steps, and how."""
    if m.source == "trace" and ctx.sync:
        # matched collectives: the others' synchronisation wait in its slow steps
        rank = m.ranks[i]
        caused = sum(ctx.sync_totals.get(s, 0) - ctx.sync.get((rank, s), 0) for s in steps)
        return caused, "synchronisation wait of matched collectives"
    # min(busy gap, their wait), summed
    gap = m.busy[i, flagged][None, :] - np.delete(m.busy[:, flagged], i, axis=0)
    their_wait = np.delete(m.wait[:, flagged], i, axis=0)
    return int(np.nansum(np.minimum(np.clip(gap, 0, None), their_wait))), "busy-time gap"


def _cost_words(now: float, after: float, source: str) -> str:
    """One number: its cost to the mean step, as the verdict, what-if and remedy quote it."""
    text = (
        f"the others wait for it {duration(now - after, 'human')} a step "
        f"({(now - after) / now:.0%} of the mean step {duration(now, 'human')})"
    )
    if source == "telemetry":
        text += (
            "; it works longer outside backward and they wait inside it, so every "
            "rank's step takes about as long"
        )
    return text


def _finding(
    m: StepMatrix,
    ctx: StragglerContext,
    i: int,
    flagged: npt.NDArray[np.intp],
    persistent: bool,
    ex: F64,
    confirmed: Sequence[int] = (),
) -> Finding:
    rank = m.ranks[i]
    steps = sorted([m.steps[j] for j in flagged.tolist()] + list(confirmed))
    caused, attribution = _caused(m, ctx, i, flagged, steps)
    med_busy = np.median(m.busy, axis=1)
    score = float(med_busy.min() / med_busy[i]) if med_busy[i] > 0 else 1.0
    # persistent: the rank's typical excess over every compared step; a stall: each time
    median_excess = float(nputil.median(ex[i] if persistent else ex[i, flagged]))
    step_median = float(nputil.median(m.duration))
    cause, parts = cause_of(m, ctx, rank, steps, persistent)
    short = not persistent and _short(m, ctx.rules)
    now, after = at_median_speed(m, i) if persistent else (step_median, step_median)
    of_steps = f"{len(steps)} of {len(m.steps)} steps"
    if persistent:
        what = f"rank {rank} is a persistent straggler, slower than the other ranks in {of_steps}"
    elif short:
        what = (
            f"rank {rank} stalled in {len(steps)} of {len(m.steps)} profiled "
            f"step{'s' if len(m.steps) != 1 else ''} ({_and(steps)}, "
            f"~{duration(median_excess, 'brief')} behind the others each time)"
        )
    else:
        n = _period(steps, sorted(set(m.steps) | set(confirmed)))
        when = (
            f"every {words.ordinal(n)} step"
            if n
            else f"in step{'s' if len(steps) > 1 else ''} " + ", ".join(map(str, steps[:8]))
        )
        what = (
            f"rank {rank} stalls {when} ({of_steps}), "
            f"{duration(median_excess, 'human')} behind the others each time"
        )
    why = CAUSE_WORDS[cause]
    also = also_parts(cause, parts, step_median, ctx.rules)
    if also:
        # two parts of about the same size: naming only the larger would mislead
        top = parts["compute" if cause == Cause.HARDWARE else str(cause)]
        more = " and ".join(f"{PART_WORDS[k]} (+{duration(parts[k], 'human', 0)})" for k in also)
        why = f"{why} (+{duration(top, 'human', 0)} a step) and {more}"
    msg = f"{what}, {why}; the other ranks waited {duration(caused, 'human')} in total for it"
    if persistent:
        msg = f"{what}, {why}: {_cost_words(now, after, m.source)}"
    if short:
        msg += (
            f"; too few steps to tell persistent from periodic — profile at least "
            f"{ctx.rules.short_window_steps} steps or use `gpudiag run`"
        )
    return Finding(
        kind=FindingKind.STRAGGLER,
        severity=Severity.ERROR if persistent else Severity.WARNING,
        message=msg,
        ranks=[rank],
        steps=[] if persistent else steps,
        metrics=StragglerMetrics(
            source=m.source,
            wait_attribution=attribution,
            score=score,
            median_excess_ns=round(median_excess),
            median_excess_ratio=median_excess / step_median if step_median else 0.0,
            slow_steps=len(steps),
            steps_compared=len(m.steps),
            excess_by_part_ns={k: round(v) for k, v in parts.items()},
            also=also,
            step_time_ns_median=round(step_median),
            step_time_ns_if_median_speed=round(after),
            short_window=short,
            step_time_ns_mean=round(now) if persistent else None,
        ),
        cause=cause,
        persistent=persistent,
        wait_caused_ns=caused,
    )
