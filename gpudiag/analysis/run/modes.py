"""Two kinds of step: when a median step time describes neither (issue 24).

A run whose steps alternate between two durations (the NERSC baseline: ~0.2 s and ~1.5 s,
a loader that runs dry every other step, gradient accumulation with an optimizer step every
k-th micro-batch) has a median that is one kind of step or, worse, between the two. The
steps are **bimodal** when, sorted, the largest ratio between neighbours is at least
``steady.mode_gap_factor`` (1.5×) and each side holds at least ``steady.mode_min_share``
(a fifth) of the steps and at least 2 of them; each side is then described by its count,
median and range. Every renderer's header uses :func:`step_modes` (one function), so the
console, Markdown and HTML say the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.config import SteadyRules


@dataclass(frozen=True)
class StepMode:
    """One kind of step: how many, their median and their range (ns)."""

    steps: int
    median_ns: int
    min_ns: int
    max_ns: int


def step_modes(durations: Sequence[int], rules: SteadyRules | None = None) -> list[StepMode]:
    """The two kinds of step (shorter first) when the durations are bimodal, else ``[]``."""
    rules = rules or SteadyRules()
    xs = np.sort(np.asarray([d for d in durations if d > 0], dtype=np.float64))
    n = len(xs)
    least = max(2, int(np.ceil(rules.mode_min_share * n)))
    if n < 2 * least:
        return []
    ratios = xs[1:] / xs[:-1]
    # the cut must leave `least` steps on each side
    cand = ratios[least - 1 : n - least]
    if not len(cand):
        return []
    i = int(np.argmax(cand)) + least - 1
    if ratios[i] < rules.mode_gap_factor:
        return []
    lo, hi = xs[: i + 1], xs[i + 1 :]
    return [
        StepMode(len(g), round(float(nputil.median(g))), round(float(g[0])), round(float(g[-1])))
        for g in (lo, hi)
    ]


def describe(
    durations: Sequence[int],
    fmt: Callable[[float], str],
    thresholds: Mapping[str, object] | None = None,
) -> str:
    """``two kinds of step: 15 around 158 ms (150–171 ms), 14 around 480 ms (…)``, or ``""``.

    ``fmt`` writes a duration (the renderer's); ``thresholds`` is a Diagnosis's (``steady``
    read from it), so a saved diagnosis is described by the rules it was made with.
    """
    steady = (thresholds or {}).get("steady")
    known = (
        {k: v for k, v in steady.items() if k in SteadyRules.__dataclass_fields__}
        if (isinstance(steady, dict))
        else {}
    )
    modes = step_modes(durations, SteadyRules(**known))
    if not modes:
        return ""
    parts = [
        f"{m.steps} around {fmt(m.median_ns)} ({fmt(m.min_ns)}–{fmt(m.max_ns)})" for m in modes
    ]
    return "two kinds of step: " + ", ".join(parts)
