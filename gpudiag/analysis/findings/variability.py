"""Flags varying step times: jitter, single outliers and regime changes, named by step number.

The job's step time is, per step, the longest rank's (a synchronous step ends with its
last rank). Over the analysed (steady) steps, with ``m`` their median:

* a **regime change**: a step ``k`` after which every step is at least
  ``variability.regime_factor`` (2×) slower — or faster — than the steps before it, in
  median, with at least ``variability.min_steps_per_regime`` (2) steps on each side; the
  split with the largest ratio is named ("from step 12 on, steps take 9.1× as long");
* **outliers**: steps longer than ``variability.outlier_factor`` (1.5) × ``m`` — one is a
  single outlier ("step 7 took 425 ms, 2.0× the median") unless other steps come close to
  it (``variability.cluster_ratio``: see :func:`_cluster`), several are recurring stalls
  (their numbers listed); ``m`` is over the job's steps and the message says so;
* **jitter**: p90 / ``m`` above ``variability.p90_factor`` (1.3), or the spread p90 / p10
  above ``variability.spread_factor`` (1.6), without either of the above ("steps vary
  from 82 to 166 ms"; fast single steps — a short last step — do not count).

Outliers, stalls and regime changes name what fills the slow steps when one class of
host calls does (at least half of their excess over the median: ``hipFree`` in every
slow step, a 463 ms ``cudaMemcpyAsync`` in ``aten::copy_``) — but not a blocking call
(synchronisation, a copy) that waits for GPU work at least ``variability.gpu_wait_share``
(half) of its time: the slow steps are then the GPU work's, and the part of the step that
grows is named instead (compute, with the kernels that grew), the call a note beside it. At least
``variability.min_steps`` (4) steps are needed. The finding is information
(a warning from ``variability.severe_factor`` (2×) p90/median up): variability is a
symptom, its cause is in the other findings or in the slow steps themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import nputil
from gpudiag._support.records import asdict, dataclass
from gpudiag.analysis.findings.causes import LABEL, fmt_ns, gpu_busy_share, waits_for
from gpudiag.analysis.model import words
from gpudiag.analysis.model.causes import CALL_CLASSES, CallClass, HostCause, KernelsGrew
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    RankSummary,
    Severity,
    StepBreakdown,
)
from gpudiag.analysis.model.kinds import VariabilityPattern
from gpudiag.analysis.model.metrics import VariabilityMetrics
from gpudiag.analysis.rank import kernels
from gpudiag.analysis.run.modes import step_modes
from gpudiag.config import SteadyRules, VariabilityRules


def _ms(ns: float) -> str:
    return (
        f"{ns / 1e9:.2f} s"
        if ns >= 1e9
        else f"{ns / 1e6:.1f} ms"
        if ns >= 1e5
        else (f"{ns / 1e3:.0f} µs")
    )


def job_steps(steps: Sequence[StepBreakdown]) -> tuple[list[int], list[int], dict[int, int]]:
    """Step numbers in order, the job's step times, and which rank was slowest in each."""
    per: dict[int, tuple[int, int]] = {}
    for s in steps:
        cur = per.get(s.step)
        if cur is None or s.duration_ns > cur[0]:
            per[s.step] = (s.duration_ns, s.rank)
    nums = sorted(per)
    return nums, [per[n][0] for n in nums], {n: per[n][1] for n in nums}


def _regime(nums: list[int], dur: list[int], rules: VariabilityRules) -> tuple[int, float] | None:
    """The split (index of the first step after it, ratio after/before) with the largest ratio."""
    k_min = rules.min_steps_per_regime
    best: tuple[int, float] | None = None
    for k in range(k_min, len(dur) - k_min + 1):
        before, after = dur[:k], dur[k:]
        lo_b, hi_b, lo_a, hi_a = min(before), max(before), min(after), max(after)
        if lo_a < rules.regime_factor * hi_b and lo_b < rules.regime_factor * hi_a:
            continue
        ratio = float(nputil.median(after) / nputil.median(before))
        score = max(ratio, 1 / ratio)
        if best is None or score > max(best[1], 1 / best[1]):
            best = (k, ratio)
    return best


def _why(
    named: Sequence[int],
    excess: float,
    slowest: dict[int, int],
    ranks: Sequence[RankSummary],
    rules: VariabilityRules,
    waiting: bool = False,
) -> tuple[str, HostCause | None]:
    """The class of runtime calls that fills the slow steps' excess time, if one does.

    Of the host-call classes (analysis/hostcause.py) other than launches, the one with the
    most time in the named steps on their slowest rank beyond its median in the other
    steps; named when that holds at least half of the steps' excess over the median.
    A blocking class (sync, copy) that waits for GPU work ``rules.gpu_wait_share`` of its
    time is left out — or, with ``waiting``, the only ones looked at (the note beside the
    part that grows).
    """
    by = {r.rank: r for r in ranks}
    slow_ranks = [r for r in ranks if r.rank in {slowest[n] for n in named}]
    best: tuple[int, CallClass | None] = (0, None)
    for each_cls in CALL_CLASSES:
        if _waits_on_gpu(slow_ranks, each_cls, rules) != waiting:
            continue
        ns = 0
        for n in named:
            r = by.get(slowest[n])
            e: Mapping[str, Any] = ((r.evidence.host_api or {}) if r else {}).get(each_cls) or {}
            own = e.get("ns_per_step", [])
            if waiting:  # a call waiting for the GPU work: all of its time, busy part too
                busy = e.get("gpu_busy_ns_per_step") or [0] * len(own)
                own = [a + b for a, b in zip(own, busy, strict=False)]
            per = dict(zip(e.get("steps", []), own, strict=False))
            usual = [v for k, v in per.items() if k not in named]
            typical = float(nputil.median(usual)) if usual else 0.0
            ns += max(0, round(per.get(n, 0) - typical))
        if ns > best[0]:
            best = (ns, each_cls)
    ns, cls = best
    if cls is None or ns < 0.5 * excess:
        return "", None
    entries: list[Mapping[str, Any]] = [
        ((r.evidence.host_api or {}).get(cls) or {}) for r in slow_ranks
    ]
    apis = list(dict.fromkeys(a for e in entries for a in e.get("apis", [])))[:2]
    ops = [str(e["longest_op"]) for e in entries if e.get("longest_op")]
    where = f" in {ops[0]}" if ops else ""
    each = (
        fmt_ns(ns) if len(named) == 1 else f"{fmt_ns(ns / len(named))} more a slow step than usual"
    )
    what = f"{' and '.join(apis) or cls} {each}{where}"
    waits = waits_for(slow_ranks, cls) if cls in ("sync", "copy") else None
    cause = HostCause(
        kind=cls,
        label=LABEL[cls],
        text=f"{what}, in {_steps(named)}",
        api=apis[0] if apis else cls,
        ns_per_step=round(ns / len(named)),
        steps=list(named),
        waits_for=waits,
    )
    if waiting:  # a note: the call waits for the GPU work that grows
        busy = words.percent(gpu_busy_share(waits or {}))
        return (
            f"; {' and '.join(apis) or cls}{where} blocks {each} too, waiting for that "
            f"GPU work {busy} of its time",
            cause,
        )
    return f" — {LABEL[cls]}: {what}", cause


def _waits_on_gpu(ranks: Sequence[RankSummary], cls: str, rules: VariabilityRules) -> bool:
    """A blocking class whose calls mostly wait for GPU work (not the cause of slow steps)."""
    if cls not in ("sync", "copy"):
        return False
    return gpu_busy_share(waits_for(ranks, cls)) >= rules.gpu_wait_share


_PARTS = {
    "data_wait_ns": "data wait",
    "comm_wait_ns": "exposed communication",
    "other_ns": "host time outside compute",
    "compute_ns": "compute",
}


def _part(
    named: Sequence[int],
    excess: float,
    slowest: dict[int, int],
    steps: Sequence[StepBreakdown],
    ranks: Sequence[RankSummary] = (),
) -> tuple[str, str | None, KernelsGrew | None]:
    """The part of the step (data wait, communication, host, compute) that grows in them.

    (text, the part as ``VariabilityMetrics.grows`` names it, the kernels when compute).

    Measured on each slow step's slowest rank, beyond that rank's median of the part in
    the other steps; named when it holds at least half of the steps' excess.
    """
    by = {(s.rank, s.step): s for s in steps}
    best: tuple[float, str] = (0.0, "")
    for attr in _PARTS:
        grew = 0.0
        for n in named:
            r = slowest[n]
            usual = [getattr(s, attr) for s in steps if s.rank == r and s.step not in named]
            grew += getattr(by[(r, n)], attr) - (float(nputil.median(usual)) if usual else 0.0)
        if grew > best[0]:
            best = (grew, attr)
    grew, attr = best
    if not attr or grew < 0.5 * excess:
        return "", None, None
    each = fmt_ns(grew) if len(named) == 1 else f"{fmt_ns(grew / len(named))} a slow step"
    which, grown = "", None
    if attr == "compute_ns":
        which, grown = _kernels_grew(named, slowest, ranks)
    return f" — {_PARTS[attr]} grows by {each}{which}", attr.removesuffix("_ns"), grown


def _kernels_grew(
    named: Sequence[int], slowest: dict[int, int], ranks: Sequence[RankSummary]
) -> tuple[str, KernelsGrew | None]:
    """The kernels a slow step runs against the others' median, and those whose time grew.

    From each slow step's slowest rank's ``kernels_by_step`` (analysis/hostcause.py):
    ``({count_slow, count_usual, grew: {name: ns more a slow step}}``, up to three names
    that grew by at least a tenth of the largest.
    """
    by: dict[int, Mapping[str, Any]] = {r.rank: r.evidence.kernels_by_step or {} for r in ranks}
    count_slow, count_usual, grew = 0.0, 0.0, dict[str, float]()
    for n in named:
        e = by.get(slowest[n]) or {}
        nums = list(e.get("steps", []))
        if n not in nums:
            return "", None
        k, others = nums.index(n), [i for i, m in enumerate(nums) if m not in named]
        if not others:
            return "", None
        count_slow += e["count"][k] / len(named)
        count_usual += float(nputil.median([e["count"][i] for i in others])) / len(named)
        for name, per in e.get("ns", {}).items():
            usual = float(nputil.median([per[i] for i in others]))
            grew[name] = grew.get(name, 0.0) + (per[k] - usual) / len(named)
    top = sorted(((v, k) for k, v in grew.items() if v > 0), reverse=True)[:3]
    top = [(v, k) for v, k in top if v >= 0.1 * top[0][0]] if top else []
    names = ", ".join(f"{kernels.display_name(k)} +{fmt_ns(v)}" for v, k in top)
    text = (
        f" ({count_slow:,.0f} kernels a slow step against {count_usual:,.0f}"
        + (f"; {names}" if names else "")
        + ")"
    )
    return text, KernelsGrew(
        count_slow=round(count_slow, 1),
        count_usual=round(count_usual, 1),
        grew={k: round(v) for v, k in top},
    )


def variability(
    steps: Sequence[StepBreakdown],
    rules: VariabilityRules,
    ranks: Sequence[RankSummary] = (),
    steady: SteadyRules | None = None,
) -> list[Finding]:
    """The step-variability finding of a run, if its steps vary (module docstring)."""
    nums, dur, slowest = job_steps([s for s in steps if s.duration_ns > 0])
    if len(dur) < rules.min_steps:
        return []
    arr = np.asarray(dur, np.float64)
    med = float(nputil.median(arr))
    p90 = nputil.percentile(arr, 90)
    lo, hi = float(arr.min()), float(arr.max())
    if med <= 0:
        return []
    p10 = nputil.percentile(arr, 10)
    ratio, spread = p90 / med, p90 / p10 if p10 > 0 else float("inf")
    found_pattern = _pattern(nums, dur, slowest, rules, steady or SteadyRules())
    if found_pattern is None:
        return []
    pat = found_pattern
    text, kind, named, base = pat.text, pat.kind, pat.named, pat.base
    excess = sum(max(0.0, dur[nums.index(n)] - base) for n in named)
    cause = blocking = grown = None
    grows: str | None = None
    if excess > 0:
        why, cause = _why(named, excess, slowest, ranks, rules)
        if not why:
            why, grows, grown = _part(named, excess, slowest, steps, ranks)
            note, blocking = _why(named, excess, slowest, ranks, rules, waiting=True)
            why += note
        text += why
    metrics = VariabilityMetrics(
        pattern=kind,
        median_ns=round(med),
        p90_ns=round(p90),
        min_ns=round(lo),
        max_ns=round(hi),
        p90_median_ratio=round(ratio, 3),
        p90_p10_ratio=round(spread, 3),
        steps_ns={str(n): d for n, d in zip(nums, dur, strict=True)},
        excess_share=round(
            sum(max(0.0, dur[nums.index(n)] - base) for n in named) / float(arr.sum()), 4
        ),
        change_at_step=pat.change_at_step,
        regime_ratio=pat.regime_ratio,
        median_before_ns=pat.median_before_ns,
        median_after_ns=pat.median_after_ns,
        cause=cause,
        grows=grows,
        kernels=grown,
        blocking_call=blocking,
        modes=pat.modes,
    )
    severe = ratio >= rules.severe_factor or kind == "regime_change"
    return [
        Finding(
            kind=FindingKind.STEP_VARIABILITY,
            severity=Severity.WARNING if severe else Severity.INFO,
            message=text,
            ranks=sorted({slowest[n] for n in named}),
            steps=sorted(named),
            metrics=metrics,
        )
    ]


@dataclass(frozen=True)
class _Pattern:
    """The pattern the steps show: its message, the steps it names and their base time.

    ``base``: the time the named steps' excess is over; the rest: the pattern's own figures.
    """

    text: str
    kind: VariabilityPattern
    named: list[int]
    base: float
    change_at_step: int | None = None  # a regime change: where, by how much, …
    regime_ratio: float | None = None
    median_before_ns: int | None = None  # … and the medians on each side
    median_after_ns: int | None = None
    modes: list[dict[str, int]] | None = None  # two kinds of step: each kind's figures


# what the finding's median and p90 are over (the header's are over every rank's steps)
OVER = "per step, the slowest rank's time"


def _cluster(nums: list[int], dur: list[int], med: float, rules: VariabilityRules) -> list[int]:
    """The slow steps: over ``outlier_factor`` × the median, and those close to a lone one.

    A step over the factor is a *single* outlier only when no other step's excess over the
    median is ``cluster_ratio`` (half) of its excess or more; otherwise it is one of a
    cluster of slow steps (150, 147, 144 and 141 ms against a median of 99 ms), and every
    step of that cluster is named.
    """
    slow = [n for n, d in zip(nums, dur, strict=True) if d > rules.outlier_factor * med]
    if len(slow) != 1:
        return slow
    top = dur[nums.index(slow[0])] - med
    return [n for n, d in zip(nums, dur, strict=True) if d - med >= rules.cluster_ratio * top]


def _pattern(
    nums: list[int],
    dur: list[int],
    slowest: dict[int, int],
    rules: VariabilityRules,
    steady: SteadyRules,
) -> _Pattern | None:
    """The pattern the steps show, its message and the steps it names, or None."""
    arr = np.asarray(dur, np.float64)
    med, hi = float(nputil.median(arr)), float(arr.max())
    ratio = float(nputil.percentile(arr, 90)) / med
    p10 = float(nputil.percentile(arr, 10))
    spread = float(nputil.percentile(arr, 90)) / p10 if p10 > 0 else float("inf")
    regime = _regime(nums, dur, rules)
    stalls = [n for n, d in zip(nums, dur, strict=True) if d > rules.outlier_factor * med]
    slow = _cluster(nums, dur, med, rules)
    kinds = step_modes(dur, steady) if regime is None else []
    both = ""
    modes: list[dict[str, int]] | None = None
    if kinds:
        # two kinds of step: a median describes neither; name both (and the slow ones)
        fast, slow_kind = kinds
        modes = [asdict(k) for k in kinds]
        both = (
            f"two kinds of step: {fast.steps} around {_ms(fast.median_ns)} "
            f"({_ms(fast.min_ns)}–{_ms(fast.max_ns)}) and {slow_kind.steps} around "
            f"{_ms(slow_kind.median_ns)} ({_ms(slow_kind.min_ns)}–{_ms(slow_kind.max_ns)}), "
            f"{slow_kind.median_ns / fast.median_ns:.1f}× as long"
        )
        if len(stalls) < 2:  # the slow kind is not a set of stalls over the median: name it
            named = [n for n, d in zip(nums, dur, strict=True) if d > fast.max_ns]
            text = (
                f"{both}; the slow ones: steps {_list(named)} (a median of {_ms(med)} "
                "describes neither)"
            )
            return _Pattern(text, "two_kinds", named, float(fast.median_ns), modes=modes)
    if regime is not None:
        return _regime_change(nums, arr, regime, med)
    if len(slow) == 1:
        n = slow[0]
        d = dur[nums.index(n)]
        text = (
            f"single outlier: step {n} took {_ms(d)} (rank {slowest[n]}), "
            f"{d / med:.1f}× the median {_ms(med)} ({OVER})"
        )
        return _Pattern(text, "outlier", slow, med, modes=modes)
    if slow:
        low = min(dur[nums.index(n)] for n in slow)
        verb = "stall" if low > rules.outlier_factor * med else "are slow"
        against = (
            f"; {both} (a median of {_ms(med)} describes neither)"
            if both
            else f" against a median of {_ms(med)} ({OVER})"
        )
        text = (
            f"{len(slow)} of {len(nums)} steps {verb}: steps {_list(slow)} take "
            f"{_ms(low)}–{_ms(hi)}{against}"
        )
        return _Pattern(text, "stalls", slow, med, modes=modes)
    if ratio > rules.p90_factor or spread > rules.spread_factor:
        top = sorted(sorted(nums, key=lambda n: -dur[nums.index(n)])[:3])
        text = (
            f"step times vary from {_ms(float(arr.min()))} to {_ms(hi)} (p90/median "
            f"{ratio:.2f}, median {_ms(med)}; {OVER}); slowest: steps {_list(top)}"
        )
        return _Pattern(text, "jitter", top, med, modes=modes)
    return None


def _regime_change(
    nums: list[int], arr: npt.NDArray[np.float64], regime: tuple[int, float], med: float
) -> _Pattern:
    """From step ``nums[k]`` on, the steps take ``r`` × as long (or as short)."""
    k, r = regime
    before, after = float(nputil.median(arr[:k])), float(nputil.median(arr[k:]))
    what = "slower" if r > 1 else "faster"
    text = (
        f"regime change: from step {nums[k]} on, steps take {_ms(after)} against "
        f"{_ms(before)} before ({max(r, 1 / r):.1f}× {what}; "
        f"steps {nums[0]}–{nums[k - 1]} then {nums[k]}–{nums[-1]})"
    )
    return _Pattern(
        text,
        "regime_change",
        nums[k:] if r > 1 else nums[:k],
        med,
        change_at_step=nums[k],
        regime_ratio=round(r, 3),
        median_before_ns=round(before),
        median_after_ns=round(after),
    )


def _steps(nums: Sequence[int]) -> str:
    return ("step " if len(nums) == 1 else "steps ") + _list(nums)


def _list(nums: Sequence[int]) -> str:
    shown = words.fold(list(nums)) if len(nums) <= 8 else words.fold(list(nums[:8])) + ", …"
    return shown
