"""Splits each rank's timeline into StepWindows from step markers.

Rules (docs/definitions.md, "Steps"):

* Host steps come from ``ProfilerStep#N`` ranges (or any ``step_re`` match) on the
  training thread. Without them, from the ends of ``Optimizer.step#…`` ranges (one
  iteration ends where the optimizer step ends); without those, the whole trace is one
  window. Either fallback is reported.
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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from gpudiag.traces.schema import GPU_BUSY_KINDS, I32, I64, Kind, RankTimeline

_OPT_STEP = "Optimizer.step#"


@dataclass
class StepWindows:
    """The analysed steps of one rank, column-wise."""

    step: I32
    host_start: I64
    host_end: I64
    start: I64
    end: I64
    gpu_ops: I64
    source: str  # "ProfilerStep", "optimizer", "whole"
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @property
    def duration(self) -> I64:
        """Period lengths in ns."""
        return self.end - self.start


def find_steps(tl: RankTimeline, step_re: str) -> StepWindows:
    """Compute the step windows of ``tl`` and write the ``step`` column in place."""
    host_s, host_e, numbers, source, notes = _host_steps(tl, step_re)
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
    if busy.any() and np.count_nonzero(linked) >= 0.5 * np.count_nonzero(busy):
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

    # The step column: GPU work by launch, host events by start time.
    step_col = np.full(len(tl), -1, np.int32)
    host_idx = np.searchsorted(host_s, tl.start_ns, side="right") - 1
    host_in = (host_idx >= 0) & (tl.start_ns < bound[np.maximum(host_idx, 0)])
    step_col[~busy & host_in] = numbers[host_idx[~busy & host_in]]
    step_col[ops] = numbers[o]
    tl.step = step_col
    return StepWindows(numbers, host_s, host_e, start, end, gpu_ops, source, notes)


def _host_steps(tl: RankTimeline, step_re: str) -> tuple[I64, I64, I32, str, list[str]]:
    """Host step ranges, their numbers, where they came from, and notes."""
    main = tl.meta.main_lane
    notes: list[str] = []
    steps = np.flatnonzero(tl.kind == Kind.STEP)
    if steps.size and main >= 0 and np.any(tl.lane[steps] == main):
        steps = steps[tl.lane[steps] == main]
    if steps.size:
        steps = steps[np.argsort(tl.start_ns[steps], kind="stable")]
        rx = re.compile(step_re)
        nums = []
        for i, j in enumerate(steps.tolist()):
            m = rx.search(tl.names[int(tl.name[j])])
            nums.append(int(m.group(1)) if m and m.groups() and m.group(1) else i)
        numbers = np.asarray(nums, np.int64)
        _, first_of = np.unique(numbers, return_index=True)  # drop repeated numbers
        keep = np.sort(first_of)
        steps, numbers = steps[keep], numbers[keep]
        return (tl.start_ns[steps], tl.end_ns[steps], numbers.astype(np.int32),
                "ProfilerStep", notes)  # fmt: skip

    opt_names = [i for i, s in enumerate(tl.names) if s.startswith(_OPT_STEP)]
    opt = np.flatnonzero(np.isin(tl.name, opt_names) & (tl.kind == Kind.ANNOTATION))
    if main >= 0:
        opt = opt[tl.lane[opt] == main]
    lo, hi = _extent(tl)
    if opt.size >= 2:
        ends = np.sort(tl.end_ns[opt])
        host_s = np.concatenate(([lo], ends[:-1]))
        notes.append(
            f"no ProfilerStep markers: {opt.size} steps inferred from the ends of "
            "Optimizer.step ranges"
        )
        return host_s, ends, np.arange(opt.size, dtype=np.int32), "optimizer", notes
    notes.append(
        "no step markers (ProfilerStep#N or Optimizer.step): the whole trace is one window"
    )
    return (np.array([lo], np.int64), np.array([hi], np.int64), np.zeros(1, np.int32),
            "whole", notes)  # fmt: skip


def _extent(tl: RankTimeline) -> tuple[int, int]:
    if not len(tl):
        return 0, 0
    return int(tl.start_ns.min()), int(tl.end_ns.max())
