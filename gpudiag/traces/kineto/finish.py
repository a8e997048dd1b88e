"""Accumulated columns → RankTimelines: damaged times dropped, µs → ns, launch links, ranks.

The time checks that need the whole trace run here (the base time, empty step ranges,
events days away from the rest); then times become integer nanoseconds, GPU work is linked
to the runtime call that launched it, and :mod:`.ranks` makes one timeline per rank.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from gpudiag._support import nputil
from gpudiag.errors import InputError
from gpudiag.traces.core.common import TIME_MAX_NS, dropped_notes, json_words
from gpudiag.traces.kineto.columns import (
    BAD_TIME,
    F64,
    I8,
    I64,
    Columns,
    EventColumns,
    Mask,
    TimedColumns,
)
from gpudiag.traces.kineto.events import Trace
from gpudiag.traces.kineto.ranks import timelines
from gpudiag.traces.schema import Kind, RankTimeline

# An event this far from the median start of its trace is damaged: a profiled window lasts
# seconds to hours, never a week. (Checked only when the trace spans more than this.)
MAX_SPAN_NS = 7 * 24 * 3600 * 10**9
_EMPTY_STEP = "step ranges of zero duration ignored"
_FAR = "events more than 7 days away from the rest of the trace ignored (damaged timestamps)"


def to_timelines(path: Path, trace: Trace, cols: Columns, rank: int | None) -> list[RankTimeline]:
    """Rank, metadata, time conversion and launch links from the accumulated columns.

    A file whose events name several ranks is split into one timeline per rank
    (:func:`.ranks.timelines`).
    """
    base = _base_ns(path, trace)
    if not cols.cats:  # cats are interned for "X" events only
        raise InputError(
            path, "the trace holds no events", "was the profiler's active window empty?"
        )
    notes = []
    if cols.unknown_cats:
        notes.append(
            f"skipped {cols.skipped} events of unknown categories {sorted(cols.unknown_cats)[:5]}"
        )
    events = _plausible(cols.columns(), base, cols.dropped)
    notes += dropped_notes(cols.dropped)
    if not len(events.ts_us):
        raise InputError(
            path,
            "no usable events (" + "; ".join(notes or ["none is timed"]) + ")",
            "the trace is damaged; re-capture it or copy it again",
        )
    timed = _in_ns(events, base)
    del events
    return timelines(path, trace, cols, timed, rank, notes)


def _plausible(ev: EventColumns, base: int, dropped: Counter[str]) -> EventColumns:
    """The events whose times survive the checks that need the whole trace."""
    if base:  # the scaled times must stay in range too
        start_f = ev.ts_us * 1000.0 + base
        ok = (start_f <= TIME_MAX_NS) & (start_f + ev.dur_us * 1000.0 <= TIME_MAX_NS)
        ev = _keep(ev, ok, dropped, BAD_TIME)
    # A step range that lasts no time is damaged (a training step always takes some), and
    # would make the median step of a run zero.
    ev = _keep(ev, (ev.kind != Kind.STEP) | (ev.dur_us > 0), dropped, _EMPTY_STEP)
    ts = ev.ts_us
    if len(ts) and float(ts.max() - ts.min()) * 1000.0 > MAX_SPAN_NS:
        mid = float(nputil.median(ts))
        ev = _keep(ev, np.abs(ts - mid) * 1000.0 <= MAX_SPAN_NS / 2, dropped, _FAR)
    return ev


def _keep(ev: EventColumns, ok: Mask, dropped: Counter[str], why: str) -> EventColumns:
    """The events where ``ok``; the others counted in ``dropped`` under ``why``."""
    if ok.all():
        return ev
    dropped[why] += int(np.count_nonzero(~ok))
    return ev.where(ok)


def _in_ns(ev: EventColumns, base: int) -> TimedColumns:
    """Times in integer ns from the trace's base, and the launch time of GPU work."""
    start = _to_ns(ev.ts_us, base)
    end = start + np.rint(ev.dur_us * 1000.0).astype(np.int64)
    return TimedColumns(
        start_ns=start,
        end_ns=end,
        kind=ev.kind,
        name=ev.name,
        lane_key=ev.lane_key,
        nbytes=ev.nbytes,
        is_gpu=ev.is_gpu,
        coll_id=ev.coll_id,
        coll_name=ev.coll_name,
        coll_dtype=ev.coll_dtype,
        shape=ev.shape,
        launch_ns=_launch_times(ev.kind, ev.is_gpu, ev.corr, start),
    )


def _base_ns(path: Path, trace: Trace) -> int:
    """``baseTimeNanoseconds`` (0 when absent); InputError when it is not a plausible time."""
    base = trace.baseTimeNanoseconds
    if base is None:
        return 0
    if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base <= TIME_MAX_NS:
        raise InputError(
            path,
            f"baseTimeNanoseconds is {json_words(base)}: not a time in nanoseconds "
            f"(0 … {TIME_MAX_NS}, about year 2116)",
            "the trace is damaged; re-capture it, or remove the key to read times as they are",
        )
    return base


def _to_ns(ts_us: F64, base_ns: int) -> I64:
    """µs floats → integer ns without losing precision on 16-digit epoch-µs values.

    The values were checked (:class:`.columns.Columns`, :func:`_plausible`): finite and
    within [``TIME_MIN_NS``, ``TIME_MAX_NS``] once scaled, so nothing here can overflow.
    """
    if ts_us.size == 0:
        return ts_us.astype(np.int64)
    origin = np.floor(ts_us.min())
    rel: I64 = np.rint((ts_us - origin) * 1000.0).astype(np.int64)
    out: I64 = rel + np.int64(int(origin) * 1000 + base_ns)
    return out


def _launch_times(kind: I8, is_gpu: Mask, corr: I64, start: I64) -> I64:
    """Launch time of GPU work: the start of the runtime call with its correlation id."""
    launch = np.full(len(kind), -1, dtype=np.int64)
    gpu_idx = np.flatnonzero(is_gpu & (corr >= 0))
    rt_idx = np.flatnonzero((kind == Kind.RUNTIME) & ~is_gpu & (corr >= 0))
    if len(gpu_idx) and len(rt_idx):
        rc = corr[rt_idx]
        rorder = np.argsort(rc, kind="stable")
        rc_sorted = rc[rorder]
        pos = np.searchsorted(rc_sorted, corr[gpu_idx])
        pos_c = np.minimum(pos, len(rc_sorted) - 1)
        hit = rc_sorted[pos_c] == corr[gpu_idx]
        launch[gpu_idx[hit]] = start[rt_idx[rorder[pos_c[hit]]]]
    return launch
