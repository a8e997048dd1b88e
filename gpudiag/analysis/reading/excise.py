"""Start-up in the middle of one window cut out of it: the steady work closes over the gap."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.reading.steps import StepWindows
from gpudiag.traces.schema import GPU_BUSY_KINDS, I64, Kind, RankTimeline


def mid_spans(
    tl: RankTimeline, items: dict[str, npt.NDArray[np.intp]], lo: int, hi: int
) -> tuple[I64, I64]:
    """The union of the start-up items inside the window ``[lo, hi)``, clipped to it.

    Items at its head (before ``lo``) are cut already. Only on a rank without
    communication: the other ranks' clocks would no longer match its collectives.
    """
    empty = np.zeros(0, np.int64)
    idx = [i for k, i in items.items() if k != "calls"]
    if not idx or np.any(tl.kind == Kind.COMM):
        return empty, empty
    every = np.concatenate(idx)
    every = every[(tl.end_ns[every] > lo) & (tl.start_ns[every] < hi)]
    if not every.size:
        return empty, empty
    s, e = iv.union(np.maximum(tl.start_ns[every], lo), np.minimum(tl.end_ns[every], hi))
    return np.asarray(s, np.int64), np.asarray(e, np.int64)


def with_cuts(win: StepWindows, cut_s: I64, cut_e: I64) -> tuple[StepWindows, int]:
    """``win`` with the spans to cut out of it, and their total."""
    if not cut_s.size:
        return win, 0
    return dataclasses.replace(win, cut_start=cut_s, cut_end=cut_e), int((cut_e - cut_s).sum())


def excise(tl: RankTimeline, win: StepWindows) -> tuple[RankTimeline, StepWindows]:
    """``tl`` and ``win`` with the spans ``win.cut_start``/``cut_end`` taken out of time.

    Intervals inside a span go, and GPU work launched inside one (its trials, its
    compilation's kernels); later times move back by the spans before them, an interval
    across a span loses its part in it. Nothing else changes.
    """
    a, b = win.cut_start, win.cut_end
    if not a.size:
        return tl, win
    cum = np.concatenate(([0], np.cumsum(b - a)))

    def shift(t: I64) -> I64:
        i = np.searchsorted(a, t, side="right") - 1
        j = np.maximum(i, 0)
        back = np.where(i >= 0, cum[j] + np.clip(t - a[j], 0, (b - a)[j]), 0)
        return (t - back).astype(np.int64)

    def within(t: I64) -> npt.NDArray[np.bool_]:
        i = np.searchsorted(a, t, side="right") - 1
        return (i >= 0) & (t < b[np.maximum(i, 0)])

    inside = within(tl.start_ns) & (
        tl.end_ns <= b[np.maximum(np.searchsorted(a, tl.start_ns, "right") - 1, 0)]
    )
    launched = (tl.launch_ns >= 0) & within(tl.launch_ns)
    keep = ~(inside | launched)
    gone = (
        ~keep & (tl.gpu_lane_mask()[tl.lane]) & np.isin(tl.kind, [int(k) for k in GPU_BUSY_KINDS])
    )
    gone &= win.owner >= 0
    ops = win.gpu_ops - np.bincount(win.owner[gone], minlength=len(win)).astype(np.int64)
    out = tl.select(keep)
    out = dataclasses.replace(
        out,
        start_ns=shift(out.start_ns),
        end_ns=shift(out.end_ns),
        launch_ns=np.where(out.launch_ns >= 0, shift(out.launch_ns), out.launch_ns),
    )
    w = dataclasses.replace(
        win,
        start=shift(win.start),
        end=shift(win.end),
        host_start=shift(win.host_start),
        host_end=shift(win.host_end),
        owner=win.owner[keep],
        gpu_ops=ops,
    )
    return out, w
