"""Which steps count as the steady state: one rule for whole-run statistics, stragglers, gate.

A step is left out when

* the profiler slowed it down: a profiled step (``gpudiag run``'s window) or the step
  right after a window, which pays for writing the trace (step numbers are run-wide: a
  step profiled on any rank is left out on every rank, so ranks stay comparable);
* it is one of a rank's first ``steady.warmup_steps`` remaining steps (one-off costs:
  allocator growth, NCCL/gloo initialisation, autotuning, DDP bucket rebuilding), when the
  rank has at least ``steady.warmup_min_steps`` steps, so a short run keeps its data.

Everything else — stalls in the middle of a run included — is steady: they are real.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpudiag.config import SteadyRules


class StepRecord(Protocol):
    """Anything with a rank, a step number and whether the profiler recorded it."""

    @property
    def rank(self) -> int: ...  # noqa: D102

    @property
    def step(self) -> int: ...  # noqa: D102

    @property
    def profiled(self) -> bool: ...  # noqa: D102


def disturbed_steps(steps: Iterable[StepRecord]) -> set[int]:
    """Steps the profiler slowed down: profiled steps, and the step after each window."""
    profiled = {s.step for s in steps if s.profiled}
    return profiled | {s + 1 for s in profiled}


def steady_steps(
    steps: Iterable[StepRecord], rules: SteadyRules, warmup_steps: int | None = None
) -> set[tuple[int, int]]:
    """The (rank, step) pairs that count (see the module docstring).

    ``warmup_steps`` overrides ``rules.warmup_steps`` (the gate's ``--warmup-steps``).
    """
    steps = list(steps)
    disturbed = disturbed_steps(steps)
    per_rank: dict[int, list[int]] = {}
    for s in steps:
        if s.step not in disturbed:
            per_rank.setdefault(s.rank, []).append(s.step)
    k = rules.warmup_steps if warmup_steps is None else warmup_steps
    out: set[tuple[int, int]] = set()
    for rank, nums in per_rank.items():
        nums = sorted(set(nums))
        if len(nums) >= rules.warmup_min_steps:
            nums = nums[k:]
        out.update((rank, n) for n in nums)
    return out
