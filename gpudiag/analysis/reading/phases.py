"""What the trace was taken to be, before any rule judges it: start-up, edges, iterations.

Between the timeline (and its steps, :mod:`gpudiag.analysis.reading.steps`) and the rules,
each rank's trace is read by mechanism, never by a list of names
(docs/definitions.md, "Reading"):

* **Start-up** (:mod:`gpudiag.analysis.reading.startup`): one-off work before the steady
  pattern, by kind — runtime calls before the first kernel, compilation, autotuning, first
  calls far longer than the later ones. It ends with the last of them (in one window, the
  last before the first kernel). Start-up is one-off: steps that lie in it, and steps that
  are mostly it (``reading.startup_dominant_ratio``) while other steps remain, are left
  out; a step it ends in starts where it ends. **Teardown** (one-off runtime calls after
  the last GPU work) is named and left out of the idle tail.
* **Idle head and tail**: in one window (no steps, or one phase range found), the time
  before the first and after the last GPU work of the window is the capture's edge: the
  window is cut to its GPU work (after start-up), so edges never decide the verdict.
  Start-up inside the window (compilation, autotuning, first calls after the first kernel)
  is cut out of it on a rank without communication (:mod:`gpudiag.analysis.reading.excise`):
  the rules judge the steady work only.
* **Iterations**: ranges found automatically as steps (a user range, a Python function,
  optimizer steps) are
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
from gpudiag.analysis.reading import startup as su
from gpudiag.analysis.reading.excise import mid_spans, with_cuts
from gpudiag.analysis.reading.steps import StepWindows, find_steps
from gpudiag.config import ReadingRules
from gpudiag.traces.schema import GPU_BUSY_KINDS, Kind, RankTimeline, no_steps

# steps gpudiag found, not marked
_FOUND = (StepSource.USER_RANGE, StepSource.OPTIMIZER, StepSource.KERNELS)
_NONE = np.iinfo(np.int64).min  # no start-up end


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
    window_ns = t1 - t0
    one = win.source == StepSource.WHOLE or (win.source == StepSource.USER_RANGE and len(win) == 1)
    items, startup_end = su.startup_items(tl, gpu, None if one else int(win.end[0]), rules)
    every = np.concatenate(list(items.values())) if items else np.zeros(0, np.intp)
    startup = bool(every.size)
    down = su.teardown_items(tl, gpu, rules)
    if down.size:
        t1 = int(tl.start_ns[down].min())
    keep = np.ones(len(win), bool)
    start, end = win.start.copy(), win.end.copy()
    in_startup, cut_ns = None, 0
    mine = busy & (win.owner >= 0) if win.source != StepSource.WHOLE else busy
    if one and mine.any():
        g0 = int(tl.start_ns[mine & (tl.start_ns >= startup_end)].min(initial=t1))
        g1 = int(tl.end_ns[mine].max())
        lo, hi = max(int(start[0]), startup_end, g0), min(int(end[0]), g1)
        if lo < hi:
            start[0], end[0] = lo, hi
        win, cut_ns = with_cuts(win, *mid_spans(tl, items, int(start[0]), int(end[0])))
    elif startup_end > _NONE:
        start = _cut_startup(win, startup_end, rules, start, keep)
        in_startup = int(np.count_nonzero(~keep))
    head = tail = None
    if keep.any():
        # the head before the first analysed step, less the start-up in it
        first = int(start[keep].min())
        up = iv.measure(iv.union(tl.start_ns[every], tl.end_ns[every]), [t0], [first])
        head = max(first - t0 - int(up[0]), 0)
        tail = max(t1 - int(end[keep].max()), 0)
    holds, ranges, ranges_span = _holds(tl, gpu)
    reading = RankReading(
        steps_found=found,
        source=str(win.source),
        range=tl.steps.range_name or None,
        gpu_in_steps_ratio=round(inside, 4) if inside is not None else None,
        refused=refused,
        window_ns=window_ns,
        startup_ns=_span_total(tl, every),
        startup_calls=su.by_name(tl, every) if startup else None,
        startup_kinds=su.kinds_ns(tl, items) if startup else None,
        startup_end_ns=startup_end - t0 if startup and startup_end > _NONE else None,
        teardown_ns=int(iv.total(iv.union(tl.start_ns[down], tl.end_ns[down])))
        if down.size
        else None,
        teardown_calls=su.by_name(tl, down) if down.size else None,
        startup_cut_ns=cut_ns or None,
        steps_in_startup=in_startup,
        idle_head_ns=head,
        idle_tail_ns=tail,
        holds=holds,
        ranges_by_name=ranges,
        ranges_span_ns=ranges_span,
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


def _span_total(tl: RankTimeline, idx: npt.NDArray[np.intp]) -> int:
    """The time the intervals ``idx`` cover together."""
    return int(iv.total(iv.union(tl.start_ns[idx], tl.end_ns[idx])))


def _holds(
    tl: RankTimeline, gpu: npt.NDArray[np.bool_]
) -> tuple[dict[str, int], dict[str, int] | None, int | None]:
    """What the trace holds, counted: kernels, copies, memsets, host ranges and operators.

    With ranges alone, also their breakdown by name and their span (what such a trace shows).
    """
    k = np.bincount(tl.kind[gpu].astype(np.int64), minlength=len(Kind)) if len(tl) else None
    h = np.bincount(tl.kind[~gpu].astype(np.int64), minlength=len(Kind)) if len(tl) else None
    if k is None or h is None:
        return {}, None, None
    holds = {
        "kernels": int(k[Kind.COMPUTE] + k[Kind.COMM]),
        "copies": int(k[Kind.MEMCPY]),
        "memsets": int(k[Kind.MEMSET]),
        "runtime_calls": int(h[Kind.RUNTIME]),
        "operators": int(h[Kind.CPU_OP]),
        "ranges": int(h[Kind.ANNOTATION] + h[Kind.STEP] + h[Kind.DATALOADER]),
    }
    seen = {key: v for key, v in holds.items() if v}
    # ranges alone: no GPU activity, runtime call or operator, and no collective the host
    # called (a trace of steps and collectives is read as steps: its comm-wait is measured)
    if list(seen) != ["ranges"] or h[Kind.COMM]:
        return seen, None, None
    rng = ~gpu & np.isin(tl.kind, [Kind.ANNOTATION, Kind.STEP, Kind.DATALOADER])
    idx = np.flatnonzero(rng)
    return seen, su.by_name(tl, idx), int(tl.end_ns[idx].max() - tl.start_ns[idx].min())
