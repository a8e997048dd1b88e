r"""The classified timeline of each rank, aggregated to stay small: what the Perfetto view draws.

For every rank, inside its analysed steps (the periods P of :mod:`gpudiag.analysis.reading.steps`),
the four parts exactly as :mod:`gpudiag.analysis.rank.classify` counts them:

* compute   = K ∩ P
* comm-wait = (C \ K) ∩ P
* data-wait = (D \ (K ∪ C ∪ M)) ∩ P
* other     = P minus the three

Each part's intervals are *coalesced* so that a rank contributes at most
:data:`MAX_SLICES` slices per part: gaps shorter than a resolution are closed, the
resolution doubling from 1 µs until the count fits (the resolution is recorded, and the
parts' totals are those of the Diagnosis, not of the coalesced slices). A 256-rank run
then stays within tens of MB of JSON before compression.

``full`` keeps each rank's raw GPU kernels, copies and collectives too (the
``--timeline-full`` view), up to :data:`MAX_KERNELS` per rank, the longest first.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np
import numpy.typing as npt

from gpudiag._support.records import dataclass
from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.rank.classify import RankSets
from gpudiag.analysis.reading.steps import StepWindows
from gpudiag.analysis.run.collectives import Collectives
from gpudiag.traces.schema import I64, Kind, RankTimeline

PARTS = ("compute", "comm-wait", "data-wait", "other")
MAX_SLICES = 1500  # per part and rank
MAX_KERNELS = 20_000  # per rank, --timeline-full


@dataclass
class RankLanes:
    """One rank's steps, its classified parts (coalesced) and, optionally, its raw kernels."""

    rank: int
    step: I64  # step numbers of the analysed steps
    start: I64  # their periods
    end: I64
    parts: dict[str, iv.IntervalSet]
    resolution_ns: dict[str, int]  # gaps closed below this, per part (0: exact)
    kernels: list[tuple[str, str, int, int]] = field(default_factory=list)  # name, lane, s, e


def coalesce(a: iv.IntervalSet, most: int) -> tuple[iv.IntervalSet, int]:
    """Close the gaps shorter than a resolution that doubles until ``most`` intervals remain."""
    s, e = a
    gap_res = 0
    while s.size > most:
        gap_res = max(1_000, gap_res * 2)
        gaps = s[1:] - e[:-1]
        keep = np.concatenate(([True], gaps >= gap_res))
        first = np.flatnonzero(keep)
        s, e = s[first], np.maximum.reduceat(e, first)
    return (s, e), gap_res


def rank_lanes(
    tl: RankTimeline,
    win: StepWindows,
    sets: RankSets,
    keep: npt.NDArray[np.bool_],
    full: bool = False,
) -> RankLanes:
    """The rank's parts inside its kept steps (see the module docstring)."""
    start, end = win.start[keep], win.end[keep]
    periods = iv.union(start, end)
    k, c, m, d = sets.compute, sets.comm, sets.copy, sets.data
    compute = iv.intersect(k, periods)
    comm = iv.intersect(iv.subtract(c, k), periods)
    data = iv.intersect(iv.subtract(d, iv.join(iv.join(k, c), m)), periods)
    other = iv.subtract(periods, iv.join(iv.join(compute, comm), data))
    parts, res = {}, {}
    for name, a in zip(PARTS, (compute, comm, data, other), strict=True):
        parts[name], res[name] = coalesce(a, MAX_SLICES)
    kernels: list[tuple[str, str, int, int]] = []
    if full and len(tl):
        gpu = tl.gpu_lane_mask()[tl.lane]
        mask = gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET])
        if sets.mode == "cpu":
            mask = ~gpu & np.isin(tl.kind, [Kind.CPU_OP, Kind.COMM])
        idx = np.flatnonzero(mask)
        j = np.searchsorted(start, tl.start_ns[idx], side="right") - 1
        idx = idx[(j >= 0) & (tl.start_ns[idx] < end[np.maximum(j, 0)])]
        if idx.size > MAX_KERNELS:
            longest = np.argsort(tl.end_ns[idx] - tl.start_ns[idx])[::-1][:MAX_KERNELS]
            idx = np.sort(idx[longest])
        kernels = [
            (
                tl.names[int(tl.name[i])],
                tl.lanes[int(tl.lane[i])],
                int(tl.start_ns[i]),
                int(tl.end_ns[i]),
            )
            for i in idx.tolist()
        ]
    return RankLanes(
        rank=tl.rank,
        step=win.step[keep].astype(np.int64),
        start=start.astype(np.int64),
        end=end.astype(np.int64),
        parts=parts,
        resolution_ns=res,
        kernels=kernels,
    )


@dataclass
class Timeline:
    """Every rank's lanes and collectives, and the collectives matched across ranks."""

    ranks: list[RankLanes]
    collectives: dict[int, Collectives]
    matched: list[dict[int, int]]
