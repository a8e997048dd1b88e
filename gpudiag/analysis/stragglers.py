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
  :mod:`gpudiag.analysis.collectives`) when the profiled window is the source, else
  Σ ``min(busy[r] − busy[r'], wait[r'])``; and the median step time if it ran at the
  others' speed.

Nothing is named with one rank, or when every rank is within the thresholds; the
telemetry (every step) is preferred to the few profiled steps when both exist, but its busy
time leaves out all of backward (DDP's all-reduce wait cannot be told from backward
compute there), so persistent stragglers of the profiled steps that it misses are added
when the telemetry shows the same rank ahead in ≥ ``lean_steps_ratio`` (80%) of its
steps by a median ≥ ``lean_excess_ratio`` (3%) of a step. Only steady steps count
(:mod:`gpudiag.analysis.steady`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gpudiag import nputil
from gpudiag.analysis import words
from gpudiag.analysis.metrics import LateArrivalMetrics, StragglerMetrics
from gpudiag.analysis.model import (
    Cause,
    CollectivesSummary,
    Finding,
    FindingKind,
    GpuStats,
    LateArrival,
    RunStep,
    Severity,
    StepBreakdown,
    WholeRun,
    by_rank,
)
from gpudiag.analysis.steady import steady_steps
from gpudiag.analysis.words import duration
from gpudiag.config import CollectiveRules, SteadyRules, StragglerRules
from gpudiag.nputil import median_without_each
from gpudiag.records import dataclass

F64 = npt.NDArray[np.float64]
MAD_TO_SIGMA = 1.4826  # median absolute deviation → standard deviation of a normal sample


@dataclass
class StepMatrix:
    """Per (rank, step) values aligned on steps every rank has: rows = ranks, cols = steps."""

    ranks: list[int]
    steps: list[int]
    duration: F64
    busy: F64
    wait: F64  # time the rank waited for the others (nan when unknown)
    compute: F64  # nan when unknown (telemetry)
    data: F64
    source: str  # "trace" or "telemetry"


def _matrix(ranks: list[int], steps: list[int], rows: Mapping[tuple[int, int], tuple[float, ...]],
            source: str) -> StepMatrix:  # fmt: skip
    arr = np.full((6, len(ranks), len(steps)), np.nan)
    for i, r in enumerate(ranks):
        for j, s in enumerate(steps):
            arr[:, i, j] = rows[(r, s)]
    return StepMatrix(ranks, steps, arr[0], arr[1], arr[2], arr[3], arr[4], source)


def trace_matrix(steps: Sequence[StepBreakdown]) -> StepMatrix | None:
    """The profiled window's steps that every rank has."""
    ranks = sorted({s.rank for s in steps})
    if len(ranks) < 2:
        return None
    grouped = by_rank(steps)
    common = sorted(set.intersection(*[{s.step for s in grouped[r]} for r in ranks]))
    if not common:
        return None
    keep = set(common)
    rows = {
        (s.rank, s.step): (s.duration_ns, s.duration_ns - s.comm_wait_ns, s.comm_wait_ns,
                           s.compute_ns, s.data_wait_ns, s.other_ns)
        for s in steps if s.step in keep
    }  # fmt: skip
    return _matrix(ranks, common, rows, "trace")


def telemetry_matrix(whole: WholeRun | None, steady: SteadyRules) -> StepMatrix | None:
    """The run's steady steps that every rank has, from telemetry.

    None unless backward (or comm wait) was measured.
    """
    if whole is None:
        return None
    ranks = sorted({s.rank for s in whole.steps})
    if len(ranks) < 2:
        return None
    keep = steady_steps(whole.steps, steady)
    per_rank = [{st for r2, st in keep if r2 == r} for r in ranks]
    return steps_matrix(whole.steps, ranks, sorted(set.intersection(*per_rank)))


def steps_matrix(
    steps: Sequence[RunStep], ranks: list[int], common: list[int]
) -> StepMatrix | None:
    """The telemetry steps ``common`` of ``ranks`` (each must have every one of them).

    busy = step time − backward (else − comm wait); None when neither was measured.
    """
    keep, members = set(common), set(ranks)
    rows: dict[tuple[int, int], tuple[float, ...]] = {}
    for s in steps:
        if s.step not in keep or s.rank not in members:
            continue
        wait = s.backward_ns if s.backward_ns is not None else s.comm_wait_ns
        if wait is None:
            return None
        data = float(s.data_wait_ns) if s.data_wait_ns is not None else np.nan
        rows[(s.rank, s.step)] = (s.duration_ns, s.duration_ns - wait, wait, np.nan, data, np.nan)
    if len(rows) != len(ranks) * len(common) or not common:
        return None
    return _matrix(ranks, common, rows, "telemetry")


def excess(busy: F64) -> F64:
    """busy[r, s] − median of the other ranks' busy in step s (leave-one-out)."""
    return busy - others_median(busy)


def others_median(a: F64) -> F64:
    """out[r, s] = median of the other ranks' values in step s, for every rank r.

    One sort per step (:func:`gpudiag.nputil.median_without_each`), not one median of a
    copy per rank: linear-logarithmic in ranks, not quadratic. With one rank, or a NaN,
    the per-rank medians themselves (NaN where there are no others, as before).
    """
    n = a.shape[0]
    if n >= 2 and not np.isnan(a).any():
        return median_without_each(a)
    out = np.empty_like(a)
    for i in range(n):
        out[i] = np.median(np.delete(a, i, axis=0), axis=0)
    return out


def slow_steps(m: StepMatrix, rules: StragglerRules) -> tuple[F64, npt.NDArray[np.bool_], float]:
    """(excess, slow, typical step): the per-step rule, offline and live alike.

    (r, s) is slow when its excess is at least ``excess_ratio`` × the typical step (the
    median step time of ``m``, not the possibly stalled step itself) and the rank waited no
    more than the others' median in that step.
    """
    ex = excess(m.busy)
    step = float(nputil.median(m.duration))
    others_wait = others_median(m.wait)
    return ex, (ex >= rules.excess_ratio * step) & (m.wait <= others_wait), step


def at_median_speed(m: StepMatrix, i: int) -> tuple[float, float]:
    """(mean step now, mean step were rank ``i`` as fast as the others): the what-if's model.

    :mod:`gpudiag.analysis.whatif`'s synchronous step, on this matrix: the mean of each
    step's longest rank now, and of ``max_r busy + min_r wait`` with rank ``i``'s busy time
    set to the others' median in that step, clamped to [0, now]. In the step telemetry the
    wait is backward (DDP's all-reduce wait is in it), so a rank that works longer outside
    backward shows here, where the ranks' step times alone (equal: the others wait) do not.
    """
    now = float(np.mean(m.duration.max(axis=0)))
    busy = m.busy.copy()
    busy[i] = np.median(np.delete(m.busy, i, axis=0), axis=0)
    after = float(np.mean(busy.max(axis=0) + np.nanmin(m.wait, axis=0)))
    return now, min(now, max(0.0, after))


def jitter_ns(ex: F64) -> float:
    """One robust standard deviation of excesses (MAD × 1.4826)."""
    return MAD_TO_SIGMA * float(nputil.median(np.abs(ex - nputil.median(ex)))) if ex.size else 0.0


@dataclass
class _Context:
    """What every straggler decision of one run reads."""

    trace: StepMatrix | None
    gpus: Sequence[GpuStats]
    rules: StragglerRules
    sync: Mapping[tuple[int, int], int]
    sync_totals: dict[int, int]  # every rank's sync wait per step, summed once


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
    ctx = _Context(trace, gpus, rules, sync, totals)
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
                findings.append(dataclasses.replace(
                    f, message=f"{f.message} (seen in the profiled steps: the step telemetry "
                    "cannot split compute from waiting inside backward)",
                ))  # fmt: skip
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


def sign_test(positive: int, n: int, p: float = 0.5) -> float:
    """P(X ≥ positive) for X ~ Binomial(n, p).

    How often chance alone puts a rank ahead of the others' median (p = 1/2) in that many
    of n steps, or makes it the last of R ranks (p = 1/R) at that many of n collectives.
    """
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(positive, n + 1))


def _detect(m: StepMatrix, ctx: _Context, persistent_only: bool = False) -> list[Finding]:
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
        findings.append(_finding(m, ctx, i, flagged, persistent, ex, extra))
    return findings


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
        s for j, s in enumerate(trace.steps)
        if s % n == steps[0] % n and s not in m.steps and tex[ti, j] >= rules.spike_ratio * typical
    ]  # fmt: skip


def _cause(m: StepMatrix, ctx: _Context, rank: int, flagged_steps: list[int],
           persistent: bool) -> tuple[Cause, dict[str, float]]:  # fmt: skip
    """Which part of the straggler's busy time exceeds the others' (ns per slow step)."""
    trace = ctx.trace
    src, cols = m, [m.steps.index(s) for s in flagged_steps if s in m.steps]
    if m.source == "telemetry" and trace is not None and rank in trace.ranks:
        # the profiled window splits compute from host: use its slow steps if it saw any
        seen = [trace.steps.index(s) for s in flagged_steps if s in trace.steps]
        if seen or persistent:
            src, cols = trace, seen or list(range(len(trace.steps)))
    i = src.ranks.index(rank)

    def delta(a: F64) -> float:
        # the typical slow step: a median, so one host-disturbed step does not decide
        others = np.median(np.delete(a, i, axis=0), axis=0)
        return float(np.nanmedian((a[i] - others)[cols])) if cols else float("nan")

    data = delta(src.data)
    if src.source == "trace":
        parts = {
            "data": data,
            "compute": delta(src.compute),
            "host": delta(src.busy - src.data - src.compute),
        }
    else:
        parts = {"data": data, "other": delta(src.busy - src.data)}
    parts = {k: v for k, v in parts.items() if not np.isnan(v)}
    if not parts or max(parts.values()) <= 0:
        return Cause.UNKNOWN, parts
    top = max(parts, key=lambda k: parts[k])
    # telemetry alone ("other") cannot tell compute from host
    cause = Cause.UNKNOWN if top == "other" else Cause(top)
    if cause in (Cause.COMPUTE, Cause.UNKNOWN) and _hardware(rank, ctx.gpus, ctx.rules):
        cause = Cause.HARDWARE
    return cause, parts


def _also(
    cause: Cause, parts: Mapping[str, float], step_median: float, rules: StragglerRules
) -> list[str]:
    """Other parts whose excess is at least ``also_ratio`` of the cause's, and of a step."""
    key = "compute" if cause == Cause.HARDWARE else str(cause)
    top = parts.get(key, 0.0)
    if top <= 0:
        return []
    return [
        k for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
        if k != key and k in ("data", "compute", "host")
        and v >= rules.also_ratio * top and v >= rules.also_step_ratio * step_median
    ]  # fmt: skip


def _hardware(rank: int, gpus: Sequence[GpuStats], rules: StragglerRules) -> bool:
    """The rank's GPU was slowed down by the driver, or clocked well below the others."""
    mine = [g for g in gpus if g.rank == rank]
    if not mine:
        return False
    g = mine[0]
    if g.slowdown_ratio is not None and g.slowdown_ratio >= rules.slowdown_ratio:
        return True
    clocks = [o.sm_clock_mhz for o in gpus if o.rank not in (None, rank) and o.sm_clock_mhz]
    return bool(
        g.sm_clock_mhz
        and clocks
        and g.sm_clock_mhz < (1 - rules.clock_deficit_ratio) * float(nputil.median(clocks))
    )


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


_WORDS = {
    Cause.DATA: "waiting for its data",
    Cause.COMPUTE: "computing longer",
    Cause.HOST: "in host-side work outside compute and data (Python, launches, sleeps)",
    Cause.HARDWARE: "on a GPU the driver slowed down or clocked low",
    Cause.UNKNOWN: "for a reason the telemetry cannot split",
}
_SHORT = {"data": "waiting for data", "compute": "computing longer",
          "host": "in host-side work (Python, launches, sleeps)"}  # fmt: skip


def _caused(m: StepMatrix, ctx: _Context, i: int, flagged: npt.NDArray[np.intp],
            steps: list[int]) -> tuple[int, str]:  # fmt: skip
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
    text = (f"the others wait for it {duration(now - after, 'human')} a step "
            f"({(now - after) / now:.0%} of the mean step {duration(now, 'human')})")  # fmt: skip
    if source == "telemetry":
        text += ("; it works longer outside backward and they wait inside it, so every "
                 "rank's step takes about as long")  # fmt: skip
    return text


def _finding(
    m: StepMatrix,
    ctx: _Context,
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
    cause, parts = _cause(m, ctx, rank, steps, persistent)
    short = not persistent and _short(m, ctx.rules)
    now, after = at_median_speed(m, i) if persistent else (step_median, step_median)
    if persistent:
        what = (f"rank {rank} is a persistent straggler, slower than the other ranks in "
                f"{len(steps)} of {len(m.steps)} steps")  # fmt: skip
    elif short:
        what = (f"rank {rank} stalled in {len(steps)} of {len(m.steps)} profiled "
                f"step{'s' if len(m.steps) != 1 else ''} ({_and(steps)}, "
                f"~{duration(median_excess, 'brief')} behind the others each time)")  # fmt: skip
    else:
        n = _period(steps, sorted(set(m.steps) | set(confirmed)))
        when = (
            f"every {words.ordinal(n)} step"
            if n
            else f"in step{'s' if len(steps) > 1 else ''} " + ", ".join(map(str, steps[:8]))
        )
        what = (f"rank {rank} stalls {when} ({len(steps)} of {len(m.steps)} steps), "
                f"{duration(median_excess, 'human')} behind the others each time")  # fmt: skip
    why = _WORDS[cause]
    also = _also(cause, parts, step_median, ctx.rules)
    if also:
        # two parts of about the same size: naming only the larger would mislead
        top = parts["compute" if cause == Cause.HARDWARE else str(cause)]
        more = " and ".join(f"{_SHORT[k]} (+{duration(parts[k], 'human', 0)})" for k in also)
        why = f"{why} (+{duration(top, 'human', 0)} a step) and {more}"
    msg = (f"{what}, {why}; the other ranks waited {duration(caused, 'human')} in total "
           "for it")  # fmt: skip
    if persistent:
        msg = f"{what}, {why}: {_cost_words(now, after, m.source)}"
    if short:
        msg += (f"; too few steps to tell persistent from periodic — profile at least "
                f"{ctx.rules.short_window_steps} steps or use `gpudiag run`")  # fmt: skip
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


def late_arrival(
    coll: CollectivesSummary | None,
    trace_steps: Sequence[StepBreakdown],
    findings: Sequence[Finding],
    rules: StragglerRules | None = None,
    crules: CollectiveRules | None = None,
) -> list[Finding]:
    """The rank everyone waits for at the collectives, when no straggler rule named one.

    From matched collectives (``CollectivesSummary.late_arrival``), the rank the others
    waited for longest, when it arrives last *often* — at ``collectives.late_share`` (half)
    of them or more, at least twice as often as any other rank and more often than chance
    makes one of R ranks last (binomial, 1/R, at ``persistent_alpha``) — or *late*: half or
    more of all the waiting for the last rank is waiting for it, twice as much as for the
    next rank (a rank that enters the step late makes everyone wait at the first
    collective; who is last at the later ones is a race that host noise decides), while
    the others' waiting for it comes to at least
    ``excess_ratio`` of a step — the straggler verdict of a window too short for the
    persistent rule (one profiled step is enough). Its cause comes from its own parts
    against the others'.
    """
    rules, crules = rules or StragglerRules(), crules or CollectiveRules()
    if (
        coll is None
        or not coll.late_arrival
        or any(f.kind == FindingKind.STRAGGLER for f in findings)
    ):
        return []
    # how late first (the waiting it caused), then how often
    counts = sorted(coll.late_arrival.items(), key=lambda kv: (-kv[1].waited_ns, -kv[1].last))
    (rank_s, top), rest = counts[0], counts[1:]
    second = max((v.last for _, v in rest), default=0)
    next_wait = rest[0][1].waited_ns if rest else 0
    total_wait = sum(v.waited_ns for v in coll.late_arrival.values())
    wait_share = top.waited_ns / total_wait if total_wait else 0.0
    trace = trace_matrix(trace_steps)
    if trace is None or int(rank_s) not in trace.ranks:
        return []
    step = float(nputil.median(trace.duration))
    # what each other rank loses per step: its exposed communication wait beyond the late
    # rank's own (collectives in flight together would be counted twice by their durations)
    i = trace.ranks.index(int(rank_s))
    others = np.median(np.delete(trace.wait, i, axis=0), axis=0)
    per_step = float(np.mean(np.clip(others - trace.wait[i], 0, None)))
    chance = sign_test(top.last, coll.matched, 1 / max(len(trace.ranks), 2))
    often = (top.last >= crules.late_share * coll.matched and top.last >= 2 * second
             and chance < rules.persistent_alpha)  # fmt: skip
    # one late entry makes everyone wait at the first collective; the later ones of the
    # step are then a race that host noise decides: the waiting is the evidence
    late = wait_share >= crules.late_share and top.waited_ns >= 2 * next_wait
    if not (often or late) or per_step < rules.excess_ratio * step:
        return []
    then = f" (then rank {rest[0][0]}: {rest[0][1].last})" if rest and rest[0][1].last else ""
    return [_late_finding(trace, rules, coll.matched, int(rank_s), top, then, second,
                          wait_share, per_step)]  # fmt: skip


def _late_finding(
    trace: StepMatrix,
    rules: StragglerRules,
    matched: int,
    rank: int,
    top: LateArrival,
    then: str,
    second: int,
    wait_share: float,
    per_step: float,
) -> Finding:
    """The straggler finding of :func:`late_arrival`: the rank, its waiting and its cause."""
    step = float(nputil.median(trace.duration))
    ctx = _Context(trace, (), rules, {}, {})
    cause, parts = _cause(trace, ctx, rank, trace.steps, True)
    low, high = duration(top.waited_ns_min, "brief"), duration(top.waited_ns_max, "brief")
    span = low if top.waited_ns_min == top.waited_ns_max else f"{low}–{high}"
    msg = (f"rank {rank} arrives last at {top.last} of {matched} collectives{then}, "
           f"{wait_share:.0%} of all waiting for the last rank; "
           f"the other ranks wait {span} for it each time "
           f"({duration(per_step, 'brief')} a step each, "
           f"{per_step / step:.0%} of a step), {_WORDS[cause]}")  # fmt: skip
    return Finding(
        kind=FindingKind.STRAGGLER,
        severity=Severity.WARNING,
        message=msg,
        ranks=[rank],
        steps=list(trace.steps),
        metrics=LateArrivalMetrics(
            source="late_arrival",
            last_at=top.last,
            collectives_matched=matched,
            next_rank_last_at=second,
            wait_share=wait_share,
            waited_ns_per_step=round(per_step),
            median_excess_ns=round(per_step),
            excess_by_part_ns={k: round(v) for k, v in parts.items()},
            steps_compared=len(trace.steps),
            step_time_ns_median=round(step),
        ),
        cause=cause,
        persistent=None,
        wait_caused_ns=top.waited_ns,
    )


BUSY_HOST = "likely the host, not the job; re-run on a quiet host"


def busy_host_words(busy: Mapping[str, float]) -> str:
    """``other processes used 65% of the CPUs during the run`` (and the steal time)."""
    parts = []
    if busy.get("other_cpu_ratio") is not None:
        parts.append(f"other processes used {busy['other_cpu_ratio']:.0%} of the CPUs")
    if busy.get("steal_ratio") is not None:
        parts.append(f"the hypervisor took {busy['steal_ratio']:.0%} of the CPUs' time")
    return " and ".join(parts) + " during the run"


def on_busy_host(findings: Sequence[Finding], busy: Mapping[str, float],
                 gpu: bool) -> list[Finding]:  # fmt: skip
    """Stragglers that the run's recorded host contention likely explains, qualified.

    ``busy``: the host's CPU figures over the gate's limits
    (:func:`gpudiag.runconditions.host_contention`). CPU time the other processes take is
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
            why = ("a starved launch thread could explain it" if gpu else
                   "contention stretches a job's CPU compute, not its time outside it")  # fmt: skip
            out.append(dataclasses.replace(f, message=f"{f.message} (the host was busy too: "
                                           f"{busy_host_words(busy)}; {why})"))  # fmt: skip
        elif gpu:
            out.append(f)
        else:
            out.append(dataclasses.replace(
                f, severity=Severity.WARNING,
                message=f"{f.message} — {busy_host_words(busy)}: {BUSY_HOST}",
                metrics=dataclasses.replace(m, host_contention=dict(busy)),
            ))  # fmt: skip
    return out
