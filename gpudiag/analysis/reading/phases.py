"""What the trace was taken to be, before any rule judges it: start-up, edges, iterations.

Between the timeline (and its steps, :mod:`gpudiag.analysis.reading.steps`) and the rules,
each rank's trace is read by mechanism, never by a list of names
(docs/definitions.md, "Reading"):

* **Start-up**: the runtime calls made before the rank's first kernel that last at least
  ``reading.startup_call_min_ns`` and that no later call of the same name repeats (none
  lasts ``reading.startup_repeat_ratio`` of it): context creation, the first allocations,
  lazy module loading in the first launch, first-call library set-up. It ends with the
  last of them. Start-up is one-off: steps that lie in it, and steps that are mostly it
  (``reading.startup_dominant_ratio``) while other steps remain, are left out; a step it
  ends in starts where it ends.
* **Idle head and tail**: in one window (no steps, or one phase range found), the time
  before the first and after the last GPU work of the window is the capture's edge: the
  window is cut to its GPU work (after start-up), so edges never decide the verdict.
* **Iterations**: ranges found automatically as steps (a user range, optimizer steps) are
  steps only when the GPU work they launch is at least ``reading.step_gpu_coverage_ratio``
  of the rank's GPU time; else the window is analysed as one phase and the reading says so.

Pure: the timeline is read, never written.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from gpudiag.analysis.model.evidence import RankReading
from gpudiag.analysis.model.kinds import StepSource
from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.reading.steps import StepWindows, find_steps
from gpudiag.config import ReadingRules
from gpudiag.traces.schema import GPU_BUSY_KINDS, Kind, RankTimeline, no_steps

_FOUND = (StepSource.USER_RANGE, StepSource.OPTIMIZER)  # steps gpudiag found, not marked


def read_rank(
    tl: RankTimeline, win: StepWindows, rules: ReadingRules, linked_min_ratio: float = 0.5
) -> tuple[StepWindows, npt.NDArray[np.bool_], RankReading]:
    """The rank's steps as read, which of them to analyse, and the reading (its evidence).

    Found steps may be refused, start-up and edges are cut (see the module docstring).
    """
    gpu = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    busy = gpu & np.isin(tl.kind, [int(k) for k in GPU_BUSY_KINDS])
    found = len(win)
    win, inside, refused = _refused(tl, win, busy, rules, linked_min_ratio)
    work = tl.kind != Kind.OS_WAIT
    t0 = int(tl.start_ns[work].min()) if work.any() else 0
    t1 = int(tl.end_ns[work].max()) if work.any() else 0
    startup_end, startup = _startup(tl, gpu, rules)
    keep = np.ones(len(win), bool)
    start, end = win.start.copy(), win.end.copy()
    in_startup = None
    one = win.source == StepSource.WHOLE or (win.source == StepSource.USER_RANGE and len(win) == 1)
    mine = busy & (win.owner >= 0) if win.source != StepSource.WHOLE else busy
    if one and mine.any():
        g0 = int(tl.start_ns[mine & (tl.start_ns >= startup_end)].min(initial=t1))
        g1 = int(tl.end_ns[mine].max())
        lo, hi = max(int(start[0]), startup_end, g0), min(int(end[0]), g1)
        if lo < hi:
            start[0], end[0] = lo, hi
    elif startup:
        start = _cut_startup(win, startup_end, rules, start, keep)
        in_startup = int(np.count_nonzero(~keep))
    reading = RankReading(
        steps_found=found,
        source=str(win.source),
        range=tl.steps.range_name or None,
        gpu_in_steps_ratio=round(inside, 4) if inside is not None else None,
        refused=refused,
        window_ns=t1 - t0,
        startup_ns=int(iv.total(startup[0])) if startup else 0,
        startup_calls=startup[1] if startup else None,
        startup_end_ns=startup_end - t0 if startup else None,
        steps_in_startup=in_startup,
        idle_head_ns=max(int(start[keep].min()) - max(t0, startup_end), 0) if keep.any() else None,
        idle_tail_ns=max(t1 - int(end[keep].max()), 0) if keep.any() else None,
        holds=_holds(tl, gpu),
    )
    return dataclasses.replace(win, start=start, end=end), keep, reading


def _refused(
    tl: RankTimeline,
    win: StepWindows,
    busy: npt.NDArray[np.bool_],
    rules: ReadingRules,
    linked_min_ratio: float,
) -> tuple[StepWindows, float | None, str | None]:
    """Found steps' share of the GPU time; too small, one window instead, and why."""
    if win.source not in _FOUND or not busy.any():
        return win, None, None
    dur = (tl.end_ns - tl.start_ns)[busy]
    inside = float(dur[win.owner[busy] >= 0].sum() / max(int(dur.sum()), 1))
    if inside >= rules.step_gpu_coverage_ratio:
        return win, inside, None
    what = f"ranges '{tl.steps.range_name}'" if tl.steps.range_name else "steps found"
    note = (
        f"{what} ({len(win)}) hold only {inside:.0%} of the GPU time: not taken "
        "as iterations; the trace is analysed as one window"
    )
    win = find_steps(dataclasses.replace(tl, steps=no_steps()), linked_min_ratio)
    return dataclasses.replace(win, notes=[note]), inside, note


def _cut_startup(
    win: StepWindows,
    startup_end: int,
    rules: ReadingRules,
    start: npt.NDArray[np.int64],
    keep: npt.NDArray[np.bool_],
) -> npt.NDArray[np.int64]:
    """Steps in start-up left out (``keep``), a step it ends in started at its end."""
    end = win.end
    for i in range(len(win)):
        if start[i] >= startup_end:
            break
        rest = int(end[i]) - startup_end
        if rest <= 0 or (
            len(win) - i > 1 and rest < (1 - rules.startup_dominant_ratio) * int(end[i] - start[i])
        ):
            keep[i] = False
        else:
            start[i] = startup_end
    if not keep.any():  # every step lies in start-up: analysed as they are
        keep[:], start = True, win.start.copy()
    return start


def _startup(
    tl: RankTimeline, gpu: npt.NDArray[np.bool_], rules: ReadingRules
) -> tuple[int, tuple[iv.IntervalSet, dict[str, int]] | None]:
    """Where start-up ends, its calls' union and time by call name (the longest four)."""
    kernels = gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM])
    first = int(tl.start_ns[kernels].min()) if kernels.any() else np.iinfo(np.int64).max
    calls = ~gpu & (tl.kind == Kind.RUNTIME)
    dur = tl.end_ns - tl.start_ns
    cand = np.flatnonzero(calls & (tl.start_ns < first) & (dur >= rules.startup_call_min_ns))
    if not cand.size:
        return np.iinfo(np.int64).min, None
    later = np.flatnonzero(calls & (tl.start_ns >= first))
    longest_later: dict[int, int] = {}
    for j in later[np.isin(tl.name[later], tl.name[cand])].tolist():
        nid = int(tl.name[j])
        longest_later[nid] = max(longest_later.get(nid, 0), int(dur[j]))
    one_off = [
        i
        for i in cand.tolist()
        if longest_later.get(int(tl.name[i]), 0) < rules.startup_repeat_ratio * dur[i]
    ]
    if not one_off:
        return np.iinfo(np.int64).min, None
    idx = np.asarray(one_off)
    by_name: dict[str, int] = {}
    for nid in np.unique(tl.name[idx]).tolist():
        mine = idx[tl.name[idx] == nid]
        by_name[tl.names[nid]] = iv.total(iv.union(tl.start_ns[mine], tl.end_ns[mine]))
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:4])
    return int(tl.end_ns[idx].max()), (iv.union(tl.start_ns[idx], tl.end_ns[idx]), top)


def _holds(tl: RankTimeline, gpu: npt.NDArray[np.bool_]) -> dict[str, int]:
    """What the trace holds, counted: kernels, copies, memsets, host ranges and operators."""
    k = np.bincount(tl.kind[gpu].astype(np.int64), minlength=len(Kind)) if len(tl) else None
    h = np.bincount(tl.kind[~gpu].astype(np.int64), minlength=len(Kind)) if len(tl) else None
    if k is None or h is None:
        return {}
    holds = {
        "kernels": int(k[Kind.COMPUTE] + k[Kind.COMM]),
        "copies": int(k[Kind.MEMCPY]),
        "memsets": int(k[Kind.MEMSET]),
        "runtime_calls": int(h[Kind.RUNTIME]),
        "operators": int(h[Kind.CPU_OP]),
        "ranges": int(h[Kind.ANNOTATION] + h[Kind.STEP] + h[Kind.DATALOADER]),
    }
    return {key: v for key, v in holds.items() if v}
