"""Step phases from the telemetry: the input wait they show, and which rank and phase lead.

The rank hook marks, every step, the first module call and the first backward, and the
lead optimizer's ``step()`` (:mod:`gpudiag.collect.rank.hook`), so each step splits into
``pre_forward_ns`` (input and host work before the forward pass, whatever produces the
batch), ``forward_ns``, ``backward_ns`` and ``optimizer_ns``.

**Input wait** (:func:`with_input_wait`): a DataLoader's wait is measured inside
``DataLoader.__next__``; a batch made by the job's own code (a generator, a streaming
reader) is not, but its time is in the pre-forward phase. The pre-forward phase also
holds the host work every step does before its forward (moving the batch, zeroing
gradients), so only its **growth** counts: over the rank's floor, the
``steady.input_floor_quantile`` (0.1) quantile of its steady steps' pre-forward phases.
A step's data-wait is the larger of the DataLoader's wait (kept as ``loader_wait_ns``) and
that growth. Live, the floor is the least pre-forward phase of the rank's steps judged so
far (:class:`gpudiag.analysis.run.online.LiveRules`).

**Who holds the others back** (:func:`phase_frontier`): in a synchronous step every rank
waits, inside backward, for the last one to reach it. Per steady step, the last rank is
the one with the longest time to its backward (pre-forward + forward); the phase that
holds the others back is the one of the two in which it exceeds the other ranks' median
the most. The (rank, phase) that does so in the most steps is the run's frontier, with its
share of the steps and its median excess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.model.diagnosis import PhaseFrontier, RunStep
from gpudiag.config import SteadyRules

PHASES = ("pre_forward", "forward")
PHASE_WORDS = {
    "pre_forward": "before its forward pass (input and host work)",
    "forward": "in its forward pass",
}


def input_floor(values: Sequence[int], rules: SteadyRules) -> float | None:
    """A rank's pre-forward floor: the ``input_floor_quantile`` of its steady steps' phases."""
    if not values:
        return None
    return float(np.quantile(np.asarray(values, np.float64), rules.input_floor_quantile))


def input_wait(s: RunStep, floor: float | None) -> int | None:
    """The step's input wait: the DataLoader's, or the pre-forward growth when larger."""
    loader = s.loader_wait_ns if s.loader_wait_ns is not None else s.data_wait_ns
    if s.pre_forward_ns is None or floor is None:
        return loader
    growth = max(0, round(s.pre_forward_ns - floor))
    return max(loader or 0, min(growth, s.duration_ns))


def with_input_wait(
    steps: Sequence[RunStep], keep: Collection[tuple[int, int]], rules: SteadyRules
) -> list[RunStep]:
    """The steps with ``data_wait_ns`` the input wait (the module docstring's rule)."""
    pre: dict[int, list[int]] = {}
    for s in steps:
        if s.pre_forward_ns is not None and (s.rank, s.step) in keep:
            pre.setdefault(s.rank, []).append(s.pre_forward_ns)
    if not pre:
        return list(steps)
    floors = {r: input_floor(v, rules) for r, v in pre.items()}
    return [
        dataclasses.replace(
            s, loader_wait_ns=s.data_wait_ns, data_wait_ns=input_wait(s, floors.get(s.rank))
        )
        if s.pre_forward_ns is not None
        else s
        for s in steps
    ]


def phase_frontier(
    steps: Sequence[RunStep], keep: Collection[tuple[int, int]]
) -> PhaseFrontier | None:
    """The rank and phase that hold the others back most often (None: phases not seen)."""
    by_step: dict[int, dict[int, RunStep]] = {}
    for s in steps:
        if (s.rank, s.step) in keep and s.pre_forward_ns is not None and s.forward_ns is not None:
            by_step.setdefault(s.step, {})[s.rank] = s
    votes: dict[tuple[int, str], list[float]] = {}
    counted = 0
    for per in by_step.values():
        if len(per) < 2:
            continue
        counted += 1
        ranks = sorted(per)
        reach = {r: per[r].pre_forward_ns + per[r].forward_ns for r in ranks}  # type: ignore[operator]
        last = max(ranks, key=lambda r: reach[r])
        others = [per[r] for r in ranks if r != last]
        excess = {
            p: float(getattr(per[last], f"{p}_ns"))
            - float(nputil.median([float(getattr(o, f"{p}_ns")) for o in others]))
            for p in PHASES
        }
        phase = max(PHASES, key=lambda p: excess[p])
        votes.setdefault((last, phase), []).append(excess[phase])
    if not votes or not counted:
        return None
    (rank, phase), ex = max(votes.items(), key=lambda kv: (len(kv[1]), -kv[0][0]))
    return PhaseFrontier(
        rank=rank,
        phase=phase,
        steps=len(ex),
        steps_compared=counted,
        excess_ns_median=round(float(nputil.median(ex))),
    )
