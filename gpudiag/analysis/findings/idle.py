"""Flags ranks whose idle ratio exceeds the threshold, and names where their time goes.

Metrics are time-weighted over a rank's analysed steps (sum of part ÷ sum of step time):

* ``idle_ratio`` = 1 − compute / step time; flagged above ``idle_ratio_max`` (0.30).
  The busy/idle split is the one users see as "GPU utilisation swings": 30% is where a
  job clearly pays for something other than compute.
* ``data_bound``: data-wait share ≥ ``data_bound_ratio`` (0.10). Above a tenth of the
  step, the input pipeline is worth fixing before anything else (the TensorBoard plugin
  used 5%; gpudiag asks for twice that before it speaks up).
* ``comm_bound``: comm-wait share (communication not hidden behind compute) ≥
  ``comm_bound_ratio`` (0.10), the TensorBoard plugin's communication threshold.
* ``host_bound``: "other" share ≥ ``host_bound_ratio`` (0.30): time with no compute,
  exposed communication or data wait — host overhead, launch gaps, synchronisation,
  copies alone.

A rank is flagged when its time-weighted value crosses the threshold *and* either its
per-step value does in at least ``most_steps_ratio`` (half) of its steps, or the
time-weighted value without its single worst step still crosses it (stalls that recur —
a loader that runs dry every few steps — are the rank's regime). One stalled step
(reported by the straggler analysis as an intermittent stall) never labels the whole
rank. One finding per kind covers every rank flagged; ``metrics.per_rank`` holds each
rank's value and ``steps`` the steps in which it was crossed. Data- and comm-bound
findings are errors from ``severe_share_ratio`` (30%) up. The four rules are one table
(:data:`RULES`) of (kind, value per rank, value per step, threshold, message).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from gpudiag._support.records import dataclass
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    Mode,
    RankSummary,
    Severity,
    StepBreakdown,
    by_rank,
)
from gpudiag.analysis.model.metrics import (
    CommBoundMetrics,
    DataBoundMetrics,
    IdleMetrics,
    ShareMetrics,
)
from gpudiag.analysis.run.collectives import p2p_share
from gpudiag.config import Thresholds

_DL = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#(\w+)\.__next__$")


def pretty_range(name: str) -> str:
    """A short readable name for a host range (``DataLoader.__next__`` for the long form)."""
    m = _DL.match(name)
    if m:
        return f"{m.group(1)}.__next__"
    if "(" in name and not name.startswith(("enumerate", "##")):
        name = name.split("(", 1)[0]  # a kernel's signature adds nothing to its name
    return name if len(name) <= 60 else name[:57] + "..."


def _per_rank(values: dict[int, float]) -> dict[str, float]:
    """Per-rank values keyed as JSON keys are: strings."""
    return {str(r): v for r, v in sorted(values.items())}


def _ranks_text(values: dict[int, float]) -> str:
    items = sorted(values.items(), key=lambda kv: -kv[1])
    if len(items) == 1:
        r, v = items[0]
        return f"rank {r}: {v:.0%}"
    lo, hi = min(values.values()), max(values.values())
    ranks = sorted(values)
    shown = words.fold(ranks)
    if len(shown) > 40:
        shown = words.fold(ranks[:6]) + f" and {len(ranks) - 6} more"
    span = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}–{hi:.0%}"
    return f"ranks {shown}: {span}"


def _steps_over(
    steps: Sequence[StepBreakdown],
    ranks: set[int],
    value: Callable[[StepBreakdown], float],
    limit: float,
) -> list[int]:
    return sorted({s.step for s in steps if s.rank in ranks and s.duration_ns and value(s) > limit})


def _mostly(
    candidates: dict[int, float],
    steps: Sequence[StepBreakdown],
    value: Callable[[StepBreakdown], float],
    limit: float,
    ratio: float,
) -> dict[int, float]:
    """Keep ranks whose value crosses ``limit`` in most steps, or recurrently.

    Most: in at least ``ratio`` of their steps. Recurrently: the time-weighted value
    without the single worst step still crosses. One stalled step is an intermittent event
    (the straggler analysis reports those), not the rank's regime.
    """
    out = {}
    grouped = by_rank(s for s in steps if s.duration_ns)
    for rank, v in candidates.items():
        mine = grouped.get(rank, [])
        over = sum(1 for s in mine if value(s) >= limit)
        if not mine or over >= ratio * len(mine) or _without_worst(mine, value) >= limit:
            out[rank] = v
    return out


def _without_worst(
    steps: Sequence[StepBreakdown], value: Callable[[StepBreakdown], float]
) -> float:
    """The time-weighted value of some steps once the step where it is largest is left out."""
    if len(steps) < 2:
        return 0.0
    worst = max(steps, key=lambda s: value(s) * s.duration_ns)
    rest = [s for s in steps if s is not worst]
    total = sum(s.duration_ns for s in rest)
    return sum(value(s) * s.duration_ns for s in rest) / total if total else 0.0


@dataclass(frozen=True)
class ShareRule:
    """One idle-family finding: which value, which threshold, what it says."""

    kind: FindingKind
    value: Callable[[RankSummary], float]
    per_step: Callable[[StepBreakdown], float]
    limit: Callable[[Thresholds], float]
    strict: bool  # flagged above the limit (idle), else at or above it
    can_be_severe: bool  # an error from severe_share_ratio up, else a warning
    text: Callable[[Sequence[RankSummary], set[int]], str]  # after "ranks …: X% of step time"
    # the finding's metrics from (ranks, flagged, per-rank values, threshold)
    metrics: Callable[[Sequence[RankSummary], set[int], dict[str, float], float], ShareMetrics]


def _frac(part: str) -> Callable[[StepBreakdown], float]:
    return lambda s: getattr(s, part) / s.duration_ns


def _idle_text(_r: Sequence[RankSummary], _f: set[int]) -> str:
    return "without compute work"


def _gpu_idle_words(ranks: Sequence[RankSummary], flagged: set[int]) -> str:
    """``; GPU idle 16%`` (or a range) for the flagged ranks, when the trace has GPU events."""
    gpu = [r.gpu_idle_ratio for r in ranks if r.rank in flagged and r.gpu_idle_ratio is not None]
    if not gpu:
        return ""
    lo, hi = words.percent(min(gpu)), words.percent(max(gpu))
    return f"; GPU idle {lo if lo == hi else f'{lo}–{hi}'}: no kernel, copy or memset"


def _data_names(ranks: Sequence[RankSummary], flagged: set[int]) -> list[str]:
    return sorted({n for r in ranks if r.rank in flagged and (n := r.evidence.data_range)})


# OS calls a thread blocks in when it waits on a queue, a pipe or a lock (a DataLoader's
# main thread waiting for its workers), rather than sleeping.
_QUEUE_WAITS = re.compile(r"cond|sem_|futex|poll|select|epoll|read|recv|mutex|join|wait")


def _data_text(ranks: Sequence[RankSummary], flagged: set[int]) -> str:
    names = _data_names(ranks, flagged)
    if names:
        return "waiting for data in " + (
            pretty_range(names[0]) if len(names) == 1 else "the data loader"
        )
    if all(r.mode == Mode.TELEMETRY for r in ranks if r.rank in flagged):
        # the step telemetry's input wait: the DataLoader's, or the growth of the time before
        # the forward pass (analysis/run/phases.py), whatever makes the batch
        return "waiting for data before the forward pass (the DataLoader or the job's own code)"
    between = [
        b for r in ranks if r.rank in flagged and (b := r.evidence.between_steps) is not None
    ]
    if not between:
        return "waiting for data in the data loader"
    blocked: dict[str, float] = {}
    for b in between:
        for n, share in b.blocked_in.items():
            blocked[n] = max(blocked.get(n, 0.0), share)
    calls = [n for n, _ in sorted(blocked.items(), key=lambda kv: -kv[1])[:2]]
    why = ""
    if calls:
        queue = all(_QUEUE_WAITS.search(c) for c in calls)
        what = " — waiting on a queue, as for a DataLoader's workers" if queue else ""
        why = f" (the training thread blocked in {' and '.join(calls)}{what})"
    return f"waiting for the next batch between step ranges, the GPU idle{why}"


def _comm_text(ranks: Sequence[RankSummary], flagged: set[int]) -> str:
    names = [t for r in ranks if r.rank in flagged and (t := r.evidence.comm_top)]
    mostly = f" (mostly {pretty_range(names[0])})" if names else ""
    return f"waiting for communication not hidden behind compute{mostly}" + _by_call(
        [r for r in ranks if r.rank in flagged]
    )


def _by_call(ranks: Sequence[RankSummary]) -> str:
    """Each rank's blocking communication calls as shares of their time (up to 4 ranks).

    The totals of a synchronous job's ranks agree; where each waits differs (one in its
    halo exchange, another in the reduction, waiting for the others).
    """
    parts, several = [], False
    for r in sorted(ranks, key=lambda r: r.rank)[:4]:
        calls = r.evidence.comm_calls or {}
        total = sum(calls.values())
        shown = [(n, v / total) for n, v in calls.items() if total and v / total >= 0.01][:3]
        several |= len(shown) > 1
        if shown:
            parts.append(f"rank {r.rank} " + ", ".join(f"{n} {x:.0%}" for n, x in shown))
    return f"; by call: {' · '.join(parts)}" if several else ""


def _host_text(ranks: Sequence[RankSummary], flagged: set[int]) -> str:
    gpu = all(r.mode == Mode.GPU for r in ranks if r.rank in flagged)
    why = (
        ("host overhead, kernel-launch gaps, synchronisation or copies with the GPU otherwise idle")
        if gpu
        else "Python/host overhead outside operators"
    )
    return f"in neither compute, communication nor data: {why}"


def _idle_metrics(
    _r: Sequence[RankSummary], _f: set[int], per: dict[str, float], limit: float
) -> ShareMetrics:
    return IdleMetrics(per, limit)


def _host_metrics(
    _r: Sequence[RankSummary], _f: set[int], per: dict[str, float], limit: float
) -> ShareMetrics:
    return ShareMetrics(per, limit)


def _data_metrics(
    rs: Sequence[RankSummary], f: set[int], per: dict[str, float], limit: float
) -> ShareMetrics:
    return DataBoundMetrics(per, limit, data_range=next(iter(_data_names(rs, f)), None))


def _comm_metrics(
    rs: Sequence[RankSummary], f: set[int], per: dict[str, float], limit: float
) -> ShareMetrics:
    hidden = {str(r.rank): r.comm_hidden_ratio for r in rs if r.rank in f}
    p2p = p2p_share([r.evidence for r in rs if r.rank in f])
    return CommBoundMetrics(per, limit, comm_hidden_ratio=hidden, p2p_share=p2p)


RULES: tuple[ShareRule, ...] = (
    ShareRule(
        FindingKind.IDLE_RATIO,
        lambda r: r.idle_ratio,
        lambda s: s.idle_ratio,
        lambda th: th.idle_ratio_max,
        True,
        False,
        _idle_text,
        _idle_metrics,
    ),
    ShareRule(
        FindingKind.DATA_BOUND,
        lambda r: r.shares.data_wait,
        _frac("data_wait_ns"),
        lambda th: th.data_bound_ratio,
        False,
        True,
        _data_text,
        _data_metrics,
    ),
    ShareRule(
        FindingKind.COMM_BOUND,
        lambda r: r.shares.comm_wait,
        _frac("comm_wait_ns"),
        lambda th: th.comm_bound_ratio,
        False,
        True,
        _comm_text,
        _comm_metrics,
    ),
    ShareRule(
        FindingKind.HOST_BOUND,
        lambda r: r.shares.other,
        _frac("other_ns"),
        lambda th: th.host_bound_ratio,
        False,
        False,
        _host_text,
        _host_metrics,
    ),
)


def idle_findings(
    ranks: Sequence[RankSummary],
    steps: Sequence[StepBreakdown],
    th: Thresholds,
    telemetry_idle: bool = False,
) -> list[Finding]:
    """The idle, data, communication and host findings of a run (one per rule at most).

    ``telemetry_idle``: judge the idle ratio of telemetry-only ranks too (1 − busy / step:
    the live alerts where no GPU is sampled); the diagnosis leaves it to NVML.
    """
    out: list[Finding] = []
    for rule in RULES:
        limit = rule.limit(th)
        judged = ranks
        if rule.kind == FindingKind.HOST_BOUND or (
            rule.kind == FindingKind.IDLE_RATIO and not telemetry_idle
        ):
            # telemetry alone cannot split compute from host work (NVML judges idle there)
            judged = [r for r in ranks if r.mode != Mode.TELEMETRY]
        flagged = {
            r.rank: v
            for r in judged
            if (v := rule.value(r)) > limit or (not rule.strict and v == limit)
        }
        flagged = _mostly(flagged, steps, rule.per_step, limit, th.most_steps_ratio)
        if not flagged:
            continue
        severe = rule.can_be_severe and max(flagged.values()) >= th.severe_share_ratio
        text = rule.text(ranks, set(flagged))
        suffix = (
            f" (non-compute idle above the {limit:.0%} threshold"
            f"{_gpu_idle_words(ranks, set(flagged))})"
            if rule.kind == FindingKind.IDLE_RATIO
            else ""
        )
        out.append(
            Finding(
                kind=rule.kind,
                severity=Severity.ERROR if severe else Severity.WARNING,
                message=f"{_ranks_text(flagged)} of step time {text}{suffix}",
                ranks=sorted(flagged),
                steps=_steps_over(steps, set(flagged), rule.per_step, limit),
                metrics=rule.metrics(ranks, set(flagged), _per_rank(flagged), limit),
            )
        )
    return out
