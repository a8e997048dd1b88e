"""Splits each rank's timeline into StepWindows from its host steps.

Rules (docs/definitions.md, "Steps"):

* Host steps are resolved by the loader core
  (:func:`gpudiag.traces.core.step_ranges.resolve_steps`):
  step ranges on the training thread, else periods ending where ``Optimizer.step`` ranges
  end, else one window. This module only places work in them.
* GPU work belongs to the step whose host range *launched* it (its runtime call's start,
  found through the correlation id); work without a known launch is placed by its start,
  except that unlinked work running before the first linked op is backlog launched before
  the profiler started (it belongs to no step, but delays the first one).
* A step's *period* runs from its start to the next step's start, so the idle time between
  steps is counted. On the device timeline the start is
  ``S(N) = max(host_start(N), min(first op of N, last op end of N−1))``: when the GPU
  runs behind the host the step starts when its own GPU work can start; when the host is
  behind, at the host step. The last period ends at the later of its host end and its
  last GPU op. Periods never overlap.

Pure: the timeline is read, never written; each interval's step is returned as ``owner``.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np

from gpudiag._support.records import dataclass
from gpudiag.analysis.model.kinds import StepSource
from gpudiag.traces.schema import GPU_BUSY_KINDS, I32, I64, Kind, RankTimeline


@dataclass
class StepWindows:
    """The analysed steps of one rank, column-wise, and the step of every interval."""

    step: I32
    host_start: I64
    host_end: I64
    start: I64
    end: I64
    gpu_ops: I64
    source: StepSource
    owner: I32  # per interval of the timeline: the step number it belongs to, else -1
    notes: list[str] = field(default_factory=list)
    # start-up spans inside one window, cut out of it before the rules (reading.excise)
    cut_start: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    cut_end: I64 = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @property
    def duration(self) -> I64:
        """Period lengths in ns."""
        return self.end - self.start


def find_steps(tl: RankTimeline, linked_min_ratio: float = 0.5) -> StepWindows:
    """The step windows of ``tl`` (see the module docstring).

    ``linked_min_ratio``: ``Thresholds.loader.launch_linked_min_ratio`` (launch links are
    trusted when at least this share of the GPU work has one).
    """
    hs = tl.steps
    if not len(hs):
        work = tl.kind != Kind.OS_WAIT
        lo = int(tl.start_ns[work].min()) if work.any() else 0
        hi = int(tl.end_ns[work].max()) if work.any() else 0
        host_s, host_e = np.array([lo], np.int64), np.array([hi], np.int64)
        numbers, source, notes = np.zeros(1, np.int32), StepSource.WHOLE, []
    else:
        host_s, host_e = hs.start_ns, hs.end_ns
        numbers, source, notes = hs.number.astype(np.int32), StepSource(hs.source), list(hs.notes)
    n = host_s.size
    bound = np.empty(n, np.int64)  # a host step owns launches in [host_s[i], bound[i])
    bound[:-1] = host_s[1:]
    bound[-1] = host_e[-1]

    gpu_lane = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    busy = gpu_lane & np.isin(tl.kind, [int(k) for k in GPU_BUSY_KINDS])
    key = np.where(tl.launch_ns >= 0, tl.launch_ns, tl.start_ns)
    idx = np.searchsorted(host_s, key, side="right") - 1
    inside = (idx >= 0) & (key < bound[np.maximum(idx, 0)])
    owner = np.where(inside, idx, np.where(idx < 0, -1, -2))  # -1: before the first step
    # When launches are linked for most GPU work, unlinked work that runs before the first
    # linked op was launched before the profiler started: it is backlog, not step work.
    linked = busy & (tl.launch_ns >= 0)
    if busy.any() and np.count_nonzero(linked) >= linked_min_ratio * np.count_nonzero(busy):
        first_linked = tl.start_ns[linked].min()
        owner[busy & ~linked & (tl.start_ns < first_linked)] = -1

    ops = np.flatnonzero(busy & (owner >= 0))
    o = owner[ops]
    gpu_ops = np.bincount(o, minlength=n).astype(np.int64)
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    last = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(first, o, tl.start_ns[ops])
    np.maximum.at(last, o, tl.end_ns[ops])
    pre = np.flatnonzero(busy & (owner == -1))
    last_pre = tl.end_ns[pre].max() if pre.size else np.iinfo(np.int64).min

    prev_end = np.concatenate(([last_pre], last[:-1]))
    start = np.maximum(host_s, np.minimum(first, prev_end))
    start = np.maximum.accumulate(start)
    end = np.empty(n, np.int64)
    end[:-1] = start[1:]
    end[-1] = max(int(host_e[-1]), int(last[-1]), int(start[-1]))

    # Each interval's step: GPU work by launch, host events by start time.
    step_of = np.full(len(tl), -1, np.int32)
    host_idx = np.searchsorted(host_s, tl.start_ns, side="right") - 1
    host_in = (host_idx >= 0) & (tl.start_ns < bound[np.maximum(host_idx, 0)])
    step_of[~busy & host_in] = numbers[host_idx[~busy & host_in]]
    step_of[ops] = numbers[o]
    return StepWindows(numbers, host_s, host_e, start, end, gpu_ops, source, step_of, notes)
