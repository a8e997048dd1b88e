"""Which steps count as the steady state: one rule for shares, whole-run stats, stragglers, gate.

A step is left out when

* the profiler slowed it down: a profiled step (``gpudiag run``'s window) or the step
  right after a window, which pays for writing the trace (step numbers are run-wide: a
  step profiled on any rank is left out on every rank, so ranks stay comparable);
* it is **warm-up**: one of the leading steps whose duration (the median over ranks) is
  more than ``steady.warmup_factor`` (3×) the median of the steps after it — worker
  start-up, cuDNN autotuning, allocator growth, lazy initialisation — as long as at least
  ``steady.warmup_min_steps`` (3) steps remain and no later step takes even half as
  long (a slowness that recurs is a periodic stall, not warm-up: a 6-step window that
  opens on a stall every 4th step keeps it); and, for the step telemetry of
  ``gpudiag run`` (which starts at the job's very first step), each rank's first
  ``steady.warmup_steps`` (1) steps under the same condition.

Everything else — stalls in the middle of a run included — is steady: they are real.
``steady.include_warmup`` (``--include-warmup``) keeps the warm-up steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from gpudiag._support import nputil
from gpudiag.config import SteadyRules


class StepRecord(Protocol):
    """Anything with a rank, a step number, a duration and whether the profiler recorded it."""

    @property
    def rank(self) -> int: ...  # noqa: D102

    @property
    def step(self) -> int: ...  # noqa: D102

    @property
    def duration_ns(self) -> int: ...  # noqa: D102

    @property
    def profiled(self) -> bool: ...  # noqa: D102


def disturbed_steps(steps: Iterable[StepRecord]) -> set[int]:
    """Steps the profiler slowed down: profiled steps, and the step after each window."""
    profiled = {s.step for s in steps if s.profiled}
    return profiled | {s + 1 for s in profiled}


class Timed(Protocol):
    """Anything with a step number and a duration."""

    @property
    def step(self) -> int: ...  # noqa: D102

    @property
    def duration_ns(self) -> int: ...  # noqa: D102


def warmup_steps(steps: Sequence[Timed], rules: SteadyRules) -> dict[int, float]:
    """Leading step numbers far slower than the steps after them → their median duration.

    Run-wide: a step's duration is its median over the ranks that have it.
    """
    if rules.include_warmup:
        return {}
    per_step: dict[int, list[int]] = {}
    for s in steps:
        per_step.setdefault(s.step, []).append(s.duration_ns)
    nums = sorted(per_step)
    dur = [float(nputil.median(per_step[n])) for n in nums]
    out: dict[int, float] = {}
    for i, n in enumerate(nums):
        rest = dur[i + 1 :]
        if len(rest) < rules.warmup_min_steps or dur[i] <= rules.warmup_factor * nputil.median(
            rest
        ):
            break
        out[n] = dur[i]
    tail = dur[len(out) :]
    if out and max(tail) >= 0.5 * min(out.values()):
        return {}  # as slow again later: a recurring stall, which is real, not warm-up
    return out


def steady_steps(
    steps: Iterable[StepRecord],
    rules: SteadyRules,
    first_steps: int | None = None,
) -> set[tuple[int, int]]:
    """The (rank, step) pairs that count (see the module docstring).

    ``first_steps``: how many of each rank's first steps are always left out (the step
    telemetry: ``rules.warmup_steps`` by default, the gate's ``--warmup-steps``); pass 0
    for a profiled window, whose first step is not the job's.
    """
    steps = list(steps)
    disturbed = disturbed_steps(steps)
    kept = [s for s in steps if s.step not in disturbed]
    slow = set(warmup_steps(kept, rules))
    k = rules.warmup_steps if first_steps is None else first_steps
    if rules.include_warmup:
        k = 0
    per_rank: dict[int, list[int]] = {}
    for s in kept:
        per_rank.setdefault(s.rank, []).append(s.step)
    out: set[tuple[int, int]] = set()
    for rank, nums in per_rank.items():
        nums = sorted(set(nums))
        if len(nums) >= rules.warmup_min_steps:
            nums = nums[k:]
        out.update((rank, n) for n in nums if n not in slow)
    return out
