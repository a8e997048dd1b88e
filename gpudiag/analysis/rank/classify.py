r"""Per (rank, step): compute / data-wait / comm-wait / other ns → StepBreakdown.

Definitions (docs/definitions.md is the user-facing copy; keep both in step). With K the
compute set, C the communication set, M the copy set and D the data-fetch set of a rank:

* compute      = |K ∩ P|
* comm_wait    = |(C \\ K) ∩ P|            communication not hidden behind compute
* overlapped   = |(C ∩ K) ∩ P|            reported separately, not part of the sum
* data_wait    = |(D \\ (K ∪ C ∪ M)) ∩ P|  fetching data while the device is idle
* other        = |P| − the three above     host overhead, launch gaps, copies alone, sync
* gpu_idle     = |P \\ G|                  G: every kernel, copy and memset (GPU traces)

P is the step's period (:mod:`gpudiag.analysis.reading.steps`), so the four parts sum to it exactly.

Two idles: the *non-compute idle* is 1 − compute / |P| (copies, communication and host time
are idle in it; flagged above ``idle_ratio_max``); the *GPU idle* is |P \\ G| / |P|, the
time with no GPU activity of any kind — what HTA's temporal breakdown and nvidia-smi's
utilisation mean. GPU idle ≤ non-compute idle; the difference is communication and copies
alone (and host MPI calls) on a GPU with no compute beside them.

GPU traces: K = union of non-communication kernels, C = union of communication kernels
(one classification, :data:`gpudiag.config.COMM_KERNEL_LIBRARIES`: NCCL/RCCL, NVLS/multimem,
DeepEP, NVSHMEM) and of the training thread's blocking host communication calls
(:data:`gpudiag.config.HOST_COMM_CALL_RE`: MPI calls, gloo/UCC operations — no kernel stands
for them), M = union of memcpy/memset (peer-to-peer copies too: copy engines are copies),
D = DataLoader ranges on the training thread.

When the steps are the user's own iteration ranges (found automatically, or named by
``--step-marker``), D also holds the host time *between* consecutive step ranges: in a
``for batch in loader:`` loop the range opens after the batch has arrived, so the time
from one range's end to the next one's start is the input pipeline — provided the
training thread launches no GPU work in it (a gap where it does is part of the
iteration's own work that the range does not wrap). Only the GPU-idle part counts
(``D \\ (K ∪ C ∪ M)``): a GPU kept busy there (GPU-side decoding, DALI) is never
data-wait.

CPU-only traces (gloo, no GPU): K = operators on the training and autograd threads minus
the collective calls that block those threads (``c10d::*`` ops on them, sync gaps — not the
backend's operation ranges such as ``gloo:send``, which outlive an ``isend`` call while the
thread computes) and minus data ranges; C = collective ranges on any thread (``gloo:*`` on
gloo's threads, ``c10d::*``, …) where the compute threads show they are inside the step
(from their first to their last event in each step range: a background collective that
outlasts them, or a step thread that records nothing, shows no wait of the step's)
plus the training thread's *silent sync gaps*: a gap with no event that ends where DDP
copies a reduced bucket back (``copy_bucket_to_grad``), i.e. ``finalize_backward``
blocked on the allreduce futures, which gloo does not record as an event. M = ∅.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from gpudiag._support.nputil import unique
from gpudiag._support.records import dataclass
from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.reading.steps import StepWindows
from gpudiag.config import DEFAULT_COMM_OP_RE, HOST_COMM_CALL_RE
from gpudiag.traces.schema import I64, Kind, RankTimeline

_BUCKET_COPY = "torch.distributed.ddp.reducer::copy_bucket_to_grad"


@dataclass
class StepParts:
    """Per-step parts of one rank, column-wise (ns)."""

    compute: I64
    comm_wait: I64
    data_wait: I64
    other: I64
    overlapped: I64
    mode: str  # "gpu" or "cpu"
    gpu_idle: I64 | None = None  # no kernel, copy or memset of any kind (GPU traces only)


@dataclass
class RankSets:
    """The four interval sets a rank's classification is made of."""

    compute: iv.IntervalSet
    comm: iv.IntervalSet
    copy: iv.IntervalSet
    data: iv.IntervalSet
    mode: str
    gpu_busy: iv.IntervalSet | None = None  # every kernel, copy and memset (GPU traces)


def _set(tl: RankTimeline, mask: npt.NDArray[np.bool_]) -> iv.IntervalSet:
    return iv.union(tl.start_ns[mask], tl.end_ns[mask])


def rank_sets(tl: RankTimeline, comm_op_re: str = DEFAULT_COMM_OP_RE) -> RankSets:
    """Build K, C, M and D for a rank (see the module docstring)."""
    lane_is_gpu = tl.gpu_lane_mask()
    gpu = lane_is_gpu[tl.lane] if len(tl) else np.zeros(0, bool)
    main = tl.meta.main_lane
    on_main = (tl.lane == main) if main >= 0 else ~gpu
    data = _set(tl, (tl.kind == Kind.DATALOADER) & on_main)
    if tl.steps.user_ranges:
        data = iv.join(data, input_gaps(tl, gpu, on_main))
    gpu_busy = gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET])
    if gpu_busy.any():
        host_calls = (tl.kind == Kind.COMM) & on_main & ~gpu
        if host_calls.any():
            rx = re.compile(HOST_COMM_CALL_RE)
            host_calls &= np.array([bool(rx.search(n)) for n in tl.names], bool)[tl.name]
        return RankSets(
            compute=_set(tl, gpu & (tl.kind == Kind.COMPUTE)),
            comm=iv.join(_set(tl, gpu & (tl.kind == Kind.COMM)), _set(tl, host_calls)),
            copy=_set(tl, gpu & np.isin(tl.kind, [Kind.MEMCPY, Kind.MEMSET])),
            data=data,
            mode="gpu",
            gpu_busy=_set(tl, gpu_busy),
        )
    # CPU-only: the training thread and autograd threads do the compute.
    names = tl.meta.thread_names
    compute_lanes = [
        i
        for i, ln in enumerate(tl.lanes)
        if i == main or any("autograd" in n for n in names.get(ln, []))
    ]
    on_compute_lane = np.isin(tl.lane, compute_lanes)
    ops = _set(tl, (tl.kind == Kind.CPU_OP) & on_compute_lane)
    # A collective *call* on a compute thread blocks it (what runs inside it is the
    # collective's); a backend operation range (``gloo:send``) spans the operation's life,
    # which for isend/irecv goes on while the thread computes — it blocks nothing.
    rx = re.compile(comm_op_re)
    op_range = np.array([bool(rx.search(n)) for n in tl.names], bool)[tl.name]
    calls = (tl.kind == Kind.COMM) & on_compute_lane & ~op_range
    blocked = iv.join(_set(tl, calls), _sync_gaps(tl, on_main))
    # a collective on a background thread is the step's wait only where the compute threads
    # show they are inside the step (between their first and last event of it): a step
    # thread that records nothing shows no wait on anything
    span = _thread_span(tl, on_compute_lane)
    comm = iv.join(iv.intersect(_set(tl, (tl.kind == Kind.COMM) & ~gpu), span), blocked)
    return RankSets(
        compute=iv.subtract(iv.subtract(ops, blocked), data),
        comm=comm,
        copy=iv.EMPTY,
        data=data,
        mode="cpu",
    )


def input_gaps(
    tl: RankTimeline,
    gpu: npt.NDArray[np.bool_] | None = None,
    on_main: npt.NDArray[np.bool_] | None = None,
) -> iv.IntervalSet:
    """The gaps between user step ranges in which the training thread launches no GPU work."""
    if gpu is None:
        gpu = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    if on_main is None:
        on_main = tl.lane == tl.meta.main_lane
    s, e = tl.steps.gaps()
    if not s.size:
        return iv.EMPTY
    launches_on_main = tl.start_ns[on_main & (tl.kind == Kind.RUNTIME)]
    ops = gpu & (tl.launch_ns >= 0) & np.isin(tl.launch_ns, launches_on_main)
    at = np.sort(tl.launch_ns[ops])
    launched = np.searchsorted(at, e, side="left") - np.searchsorted(at, s, side="left")
    keep = launched == 0
    return iv.union(s[keep], e[keep])


def _sync_gaps(tl: RankTimeline, on_main: npt.NDArray[np.bool_]) -> iv.IntervalSet:
    """Gaps on the training thread that end where DDP copies a reduced bucket back."""
    try:
        bucket = tl.names.index(_BUCKET_COPY)
    except ValueError:
        return iv.EMPTY
    if not on_main.any():
        return iv.EMPTY
    busy = _set(tl, on_main & (tl.kind != Kind.STEP))
    if busy[0].size == 0:
        return iv.EMPTY
    gaps = iv.complement(busy, int(busy[0][0]), int(busy[1][-1]))
    copies = tl.start_ns[on_main & (tl.name == bucket)]
    hit = np.isin(gaps[1], copies)
    return gaps[0][hit], gaps[1][hit]


def _thread_span(tl: RankTimeline, on_lanes: npt.NDArray[np.bool_]) -> iv.IntervalSet:
    """Per host step range, from the first to the last event of those threads inside it.

    Without step ranges, from their first event to their last.
    """
    ev = on_lanes & (tl.kind != Kind.STEP)
    if not ev.any():
        return iv.EMPTY
    s, e = tl.start_ns[ev], tl.end_ns[ev]
    if not tl.steps.start_ns.size:
        return iv.union(np.array([s.min()]), np.array([e.max()]))
    a, b = tl.steps.start_ns.astype(np.int64), tl.steps.end_ns.astype(np.int64)
    n = a.size
    lo, hi = b.copy(), a.copy()  # empty until an event is found
    k = np.searchsorted(a, s, side="right") - 1  # the step range each event starts in
    inside = (k >= 0) & (s < b[np.maximum(k, 0)])
    np.minimum.at(lo, k[inside], s[inside])
    np.maximum.at(hi, k[inside], np.minimum(e[inside], b[k[inside]]))
    # an event that began before a step and runs into it: the thread is in it from its start
    us, ue = iv.union(s, e)
    j = np.searchsorted(us, a, side="right") - 1
    covered = (j >= 0) & (a < ue[np.maximum(j, 0)]) if us.size else np.zeros(n, bool)
    lo[covered] = a[covered]
    hi[covered] = np.maximum(hi[covered], np.minimum(b[covered], ue[j[covered]]))
    return iv.union(lo, hi)


def classify_steps(tl: RankTimeline, win: StepWindows, sets: RankSets | None = None) -> StepParts:
    """Split every step period of a rank into its parts (vectorised over steps)."""
    return classify_sets(sets or rank_sets(tl), win.start, win.end)


def idle_in_steps(sets: RankSets, win: StepWindows) -> iv.IntervalSet:
    """The "other" time during which the host is inside a step range.

    The GPU is idle, nothing is communicated or fetched, while the training thread runs the
    step's own code. These gaps are what CUDA graphs and fusion remove when they are short (launch
    overhead); long ones are synchronisations and host work.
    """
    hosts = iv.intersect(iv.union(win.host_start, win.host_end), iv.union(win.start, win.end))
    busy = iv.join(iv.join(iv.join(sets.compute, sets.comm), sets.copy), sets.data)
    return iv.subtract(hosts, busy)


def copies_alone(sets: RankSets, win: StepWindows) -> int:
    """Copy and memset time with no compute, communication or data wait beside it (ns)."""
    periods = iv.union(win.start, win.end)
    alone = iv.subtract(sets.copy, iv.join(iv.join(sets.compute, sets.comm), sets.data))
    return iv.total(iv.intersect(alone, periods))


def classify_sets(sets: RankSets, start: I64, end: I64) -> StepParts:
    """The pure core: interval sets and periods in, parts out."""
    k, c, m, d = sets.compute, sets.comm, sets.copy, sets.data
    compute = iv.measure(k, start, end)
    comm_wait = iv.measure(iv.subtract(c, k), start, end)
    overlapped = iv.measure(iv.intersect(c, k), start, end)
    busy = iv.join(iv.join(k, c), m)
    data_wait = iv.measure(iv.subtract(d, busy), start, end)
    other = (end - start) - compute - comm_wait - data_wait
    gpu_idle = None
    if sets.gpu_busy is not None:
        gpu_idle = (end - start) - iv.measure(sets.gpu_busy, start, end)
    return StepParts(compute, comm_wait, data_wait, other, overlapped, sets.mode, gpu_idle)


def time_by_name(
    tl: RankTimeline, mask: npt.NDArray[np.bool_], within: iv.IntervalSet, top: int = 3
) -> list[tuple[str, int]]:
    """The names of the ``mask`` intervals holding the most time inside ``within``."""
    out = []
    for i in unique(tl.name[mask]).tolist():
        sel = mask & (tl.name == i)
        t = iv.total(iv.intersect(_set(tl, sel), within))
        if t > 0:
            out.append((tl.names[i], t))
    return sorted(out, key=lambda nt: -nt[1])[:top]


def dominant_names(
    tl: RankTimeline, kind: Kind, gpu: bool | None = None, top: int = 3
) -> list[tuple[str, int]]:
    """The names of ``kind`` intervals holding the most time (for evidence in messages)."""
    mask = tl.kind == kind
    if gpu is not None and len(tl):
        mask &= tl.gpu_lane_mask()[tl.lane] == gpu
    if not mask.any():
        return []
    w = np.bincount(
        tl.name[mask],
        weights=(tl.end_ns[mask] - tl.start_ns[mask]).astype(np.float64),
        minlength=len(tl.names),
    )
    order = np.argsort(w)[::-1][:top]
    return [(tl.names[int(i)], int(w[i])) for i in order if w[i] > 0]
