"""Matches collectives across ranks, splits transfer from synchronisation, measures bandwidth.

A collective kernel (or gloo range) starts when its rank reaches it and ends when all peers
have: on early ranks its duration is *waiting for the last rank* plus the transfer. So:

* **Matching** (best key first): ``Comms Id`` or (process group, ``Seq``) from the trace's
  collective args, identical on every rank; otherwise the order of collectives of one type
  on each rank (the i-th all-reduce everywhere), checked against the message size where both
  sides know it — a size mismatch drops that pair rather than guessing.
* **Transfer** of a matched collective = its shortest duration over the ranks (the last
  arrival waits for no one); each rank's **synchronisation wait** = its duration − transfer,
  the interval [entry, entry + wait]. A rank's wait (in all and per step) is the length of
  the union of those intervals: collectives that run side by side on one rank (DDP's
  buckets on gloo's worker threads, NCCL on several streams) wait for the same late rank
  at the same time, and that time is counted once.
* **Late arrival**: the rank with the shortest duration arrived last — everyone else
  waited for it. Counted per rank (``late_arrival``) when the others' mean wait is at
  least ``collectives.late_wait_ns`` (10 µs, below which it is jitter), with the others'
  total wait (each rank's as a union, as above) and the range of their mean wait per
  collective. Durations, and each rank's own entry times, alone decide, so ranks' clocks
  need not agree.
* **Sizes**: NCCL's own annotation, else the launching operator's recorded inputs
  (:func:`gpudiag.analysis.efficiency.comm.sizes_from_operators`).
* **Bandwidth**, as nccl-tests defines it, from the transfer time t and the message size S:
  ``algbw = S / t`` and ``busbw = algbw × f(n)`` with f = 2(n−1)/n for all-reduce,
  (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast, reduce and
  point-to-point; n = the group size. Collectives are grouped by type and size bucket.
  With a single rank's trace nothing can be matched: the raw duration (which includes
  waiting) is used and the bandwidth is marked a lower bound (never a finding).
* **Nominal peak**: the per-direction bandwidth of the link of the GPU model named by the
  trace (NVLink, an NVLink bridge, PCIe or xGMI: :mod:`gpudiag.analysis.efficiency.peaks`),
  used only when the group fits in one host (its size is
  at most the number of GPUs the trace lists). A large-message bucket (≥
  ``collectives.large_message_bytes``, 1 MiB) running below
  ``collectives.low_bandwidth_ratio`` (25%) of it is reported as ``low_bandwidth``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import nputil
from gpudiag._support.nputil import unique
from gpudiag._support.records import dataclass
from gpudiag.analysis.efficiency.comm import likely_cause, link_of, sizes_from_operators
from gpudiag.analysis.model.diagnosis import (
    CollectiveRow,
    CollectivesSummary,
    Finding,
    FindingKind,
    LateArrival,
    RankSync,
    Severity,
    StepBreakdown,
)
from gpudiag.analysis.model.kinds import MatchMethod
from gpudiag.analysis.model.metrics import BandwidthMetrics
from gpudiag.analysis.rank.intervals import union_shares
from gpudiag.config import CollectiveRules
from gpudiag.traces.schema import I32, I64, Kind, RankTimeline

ABOVE_LINK = 1.02  # a rounding margin over the link's peak
BUCKETS = [
    (0, 64 << 10, "<64KiB"),
    (64 << 10, 1 << 20, "64KiB-1MiB"),
    (1 << 20, 16 << 20, "1-16MiB"),
    (16 << 20, 256 << 20, "16-256MiB"),
    (256 << 20, 1 << 62, ">=256MiB"),
]

_KERNEL_TYPE = re.compile(r"nccl(?:Sym)?(?:Dev)?Kernel_([A-Za-z]+)")
_ALIASES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "allgatherbase": "allgather",
    "allgatherintocoalesced": "allgather",
    "reducescatter": "reducescatter",
    "reducescatterbase": "reducescatter",
    "alltoall": "alltoall",
    "alltoallv": "alltoall",
    "alltoallbase": "alltoall",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "send",
    "recv": "recv",
    "sendrecv": "sendrecv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


# Element types of collectives, as Kineto's ``dtype`` arg (c10 ScalarType names) or an NCCL
# kernel name (``…_bf16_RING_LL``, older ``…_Sum_bfloat16``) gives them: canonical short names.
_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "half": "fp16",
    "float16": "fp16",
    "f16": "fp16",
    "float": "fp32",
    "float32": "fp32",
    "f32": "fp32",
    "double": "fp64",
    "float64": "fp64",
    "f64": "fp64",
    "float8e4m3fn": "fp8",
    "float8e5m2": "fp8",
    "float8e4m3fnuz": "fp8",
    "float8e5m2fnuz": "fp8",
    "f8e4m3": "fp8",
    "f8e5m2": "fp8",
    "byte": "uint8",
    "uint8": "uint8",
    "u8": "uint8",
    "char": "int8",
    "int8": "int8",
    "i8": "int8",
    "short": "int16",
    "int16": "int16",
    "int": "int32",
    "int32": "int32",
    "i32": "int32",
    "u32": "uint32",
    "long": "int64",
    "int64": "int64",
    "i64": "int64",
    "u64": "uint64",
    "bool": "bool",
}
# floating types of at most 16 bits: compressing them to 16 bits saves nothing
NARROW_FLOAT = frozenset({"bf16", "fp16", "fp8"})
_KERNEL_DTYPE = re.compile(
    r"_(bf16|f16|f32|f64|f8e4m3|f8e5m2|i8|u8|i32|u32|i64|u64|bfloat16|half|float|double)(?=[_(]|$)"
)


def collective_dtype(arg: str, kernel: str) -> str:
    """A collective's element type (``bf16``, ``fp32`` …), '' when neither name gives it.

    ``arg`` is the trace's ``dtype`` argument, ``kernel`` the event's name (NCCL kernels
    other than ``ncclDevKernel_Generic`` name their type).
    """
    if arg:
        key = arg.lower().replace("_", "")
        return _DTYPES.get(key, key)
    m = (
        _KERNEL_DTYPE.search(kernel)
        if "ncclKernel" in kernel or "ncclDevKernel" in kernel
        else None
    )
    return _DTYPES[m.group(1)] if m else ""


def collective_type(name: str) -> str:
    """``allreduce``, ``allgather``, ``sendrecv`` … from a kernel, range or args name."""
    m = _KERNEL_TYPE.search(name)
    raw = m.group(1) if m else name.split(":", 1)[-1]
    key = re.sub(r"[^a-z]", "", raw.lower())
    if key in _ALIASES:
        return _ALIASES[key]
    if key.startswith("memcpy"):  # CUDA-aware MPI and P2P copies: "Memcpy PtoP (Device -> Device)"
        return "peer copy" if "ptop" in key or "peer" in key else "copy"
    for alias in sorted(_ALIASES, key=len, reverse=True):  # e.g. "all_reduce_coalesced"
        if alias in key:
            return _ALIASES[alias]
    return "unknown" if key in ("generic", "") else "other"


@dataclass
class Collectives:
    """One rank's collectives, column-wise, in start order."""

    rank: int
    type: list[str]
    key: I64  # cross-rank id, -1 when the trace has none
    nbytes: I64
    start: I64
    dur: I64
    step: npt.NDArray[np.int32]
    devices: int  # GPUs the trace lists (host size bound for the nominal peak)
    device_name: str
    dtype: list[str] = field(default_factory=list)  # element type, '' unknown (or none given)


def extract(tl: RankTimeline, mode: str, step_of: I32, comm_op_re: str) -> Collectives:
    """The rank's collective operations: comm kernels (GPU) or comm-thread ranges (CPU).

    ``step_of`` is each interval's step (:func:`gpudiag.analysis.reading.steps.find_steps`); on CPU
    traces only ranges matching ``comm_op_re`` count (c10d ops and record_param_comms
    merely wrap them on the calling thread).
    """
    gpu = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    if mode == "gpu":
        mask = (tl.kind == Kind.COMM) & gpu
    else:
        rx = re.compile(comm_op_re)
        names = np.array([bool(rx.search(n)) for n in tl.names], bool)
        mask = (tl.kind == Kind.COMM) & ~gpu & names[tl.name] if len(tl) else np.zeros(0, bool)
    idx = np.flatnonzero(mask)
    idx = idx[np.argsort(tl.start_ns[idx], kind="stable")]
    label = np.where(tl.coll_name[idx] >= 0, tl.coll_name[idx], tl.name[idx])
    types = [collective_type(tl.names[int(i)]) for i in label.tolist()]
    keep = [j for j, t in enumerate(types) if t not in ("barrier", "wait")]
    idx = idx[keep]
    # once per distinct (dtype argument, name) pair, not per collective
    pairs = list(zip(tl.coll_dtype[idx].tolist(), tl.name[idx].tolist(), strict=True))
    known = {
        p: collective_dtype(tl.names[p[0]] if p[0] >= 0 else "", tl.names[p[1]]) for p in set(pairs)
    }
    dtypes = [known[p] for p in pairs]
    devs = tl.meta.devices
    return Collectives(
        rank=tl.rank,
        type=[types[j] for j in keep],
        key=tl.coll_id[idx],
        nbytes=sizes_from_operators(tl, idx) if mode == "gpu" else tl.nbytes[idx],
        start=tl.start_ns[idx],
        dur=tl.end_ns[idx] - tl.start_ns[idx],
        step=step_of[idx],
        devices=len(devs),
        device_name=devs[0] if devs else "",
        dtype=dtypes,
    )


def comm_type_shares(c: Collectives) -> dict[str, float]:
    """Each collective type's share of a rank's time in collectives, largest first."""
    total: dict[str, int] = {}
    for ty, d in zip(c.type, c.dur.tolist(), strict=True):
        total[ty] = total.get(ty, 0) + int(d)
    whole = sum(total.values())
    if not whole:
        return {}
    return {t: round(v / whole, 4) for t, v in sorted(total.items(), key=lambda kv: -kv[1])}


def comm_dtype_shares(c: Collectives) -> dict[str, dict[str, float]]:
    """Per collective type, each element type's share of its time ('' none: left out).

    Only types some of whose collectives name their element type are listed.
    """
    total: dict[str, dict[str, int]] = {}
    for ty, dt, d in zip(c.type, c.dtype, c.dur.tolist(), strict=True):
        row = total.setdefault(ty, {})
        row[dt] = row.get(dt, 0) + int(d)
    out: dict[str, dict[str, float]] = {}
    for ty, row in total.items():
        whole = sum(row.values())
        if whole and any(row.keys() - {""}):
            out[ty] = {
                k: round(v / whole, 4) for k, v in sorted(row.items(), key=lambda kv: -kv[1]) if k
            }
    return out


P2P_TYPES = ("send", "recv", "sendrecv")


def p2p_share(evidence: Sequence[Any]) -> float | None:
    """Of some ranks' communication time, the share in point-to-point operations.

    From each rank's ``comm_types`` (a ``SendRecv`` kernel split by the host-side
    operations, as NCCL runs all-to-all with it too), else its blocking host calls
    (``comm_calls``: ``MPI_Sendrecv`` …); each rank weighs the same. None: neither is known.
    """
    p2p = whole = 0.0
    for ev in evidence:
        types, calls = ev.comm_types or {}, ev.comm_calls or {}
        if types:
            host = {t: v for t, v in (ev.host_comm_types or {}).items() if t != "sendrecv"}
            for t, v in types.items():
                if t == "sendrecv" and host:
                    p2p += (
                        v
                        * sum(hv for ht, hv in host.items() if ht in P2P_TYPES)
                        / sum(host.values())
                    )
                elif t in P2P_TYPES:
                    p2p += v
            whole += sum(types.values())
        elif sum(calls.values()):
            total = sum(calls.values())
            p2p += sum(ns for n, ns in calls.items() if collective_type(n) in P2P_TYPES) / total
            whole += 1.0
    return round(p2p / whole, 4) if whole else None


def host_comm_types(tl: RankTimeline, comm_op_re: str) -> dict[str, float]:
    """Collective types of the host-side operation ranges (``nccl:all_to_all`` …), by time.

    On GPU traces they tell what a ``SendRecv`` kernel is doing: NCCL runs all-to-all and
    point-to-point alike with it.
    """
    if not len(tl):
        return {}
    rx = re.compile(comm_op_re)
    ops = np.array([bool(rx.search(n)) for n in tl.names], bool)
    mask = (tl.kind == Kind.COMM) & ~tl.gpu_lane_mask()[tl.lane] & ops[tl.name]
    total: dict[str, int] = {}
    for i, d in zip(
        tl.name[mask].tolist(), (tl.end_ns[mask] - tl.start_ns[mask]).tolist(), strict=True
    ):
        t = collective_type(tl.names[i])
        if t not in ("barrier", "wait", "unknown"):
            total[t] = total.get(t, 0) + int(d)
    whole = sum(total.values())
    return (
        {t: round(v / whole, 4) for t, v in sorted(total.items(), key=lambda kv: -kv[1])}
        if whole
        else {}
    )


def _peak(device: str) -> float | None:
    link = link_of(device)
    return link[1] if link is not None else None


def _bucket(nbytes: float) -> str:
    for lo, hi, label in BUCKETS:
        if lo <= nbytes < hi:
            return label
    return BUCKETS[-1][2]


POINT_TO_POINT = ("send", "recv")


def match(colls: Sequence[Collectives]) -> tuple[MatchMethod, list[dict[int, int]]]:
    """Matched collectives as {rank: index in that rank's Collectives}; and the method used.

    Explicit point-to-point operations (``send``, ``recv``) are not collectives: a send on
    one rank pairs with a receive on another, and nobody else waits for either, so they
    are never matched across ranks (pipelines measure them on their own).
    """
    if len(colls) < 2 or not all(len(c.type) for c in colls):
        return "none", []
    if all((c.key >= 0).all() for c in colls):
        maps = [
            {int(k): i for i, k in enumerate(c.key.tolist()) if c.type[i] not in POINT_TO_POINT}
            for c in colls
        ]
        common = set.intersection(*[set(m) for m in maps])
        keys = sorted(common, key=lambda k: int(colls[0].start[maps[0][k]]))
        return "comms_id", [{c.rank: m[k] for c, m in zip(colls, maps, strict=True)} for k in keys]
    # order within each collective type, checked against the size
    out: list[dict[int, int]] = []
    types = set.intersection(*[set(c.type) for c in colls]) - set(POINT_TO_POINT)
    for t in sorted(types):
        per = [[i for i, x in enumerate(c.type) if x == t] for c in colls]
        for j in range(min(len(p) for p in per)):
            m = {c.rank: p[j] for c, p in zip(colls, per, strict=True)}
            sizes = {int(c.nbytes[m[c.rank]]) for c in colls} - {-1}
            if len(sizes) <= 1:
                out.append(m)
    return "order", out


SyncByStep = dict[tuple[int, int], int]
Row = tuple[str, float, float, int]  # a collective's type, bytes, transfer, ranks matched


def summarize_collectives(
    colls: Sequence[Collectives],
    world_size: int | None = None,
    rules: CollectiveRules | None = None,
) -> tuple[CollectivesSummary | None, SyncByStep]:
    """The collectives section of a Diagnosis and each (rank, step)'s synchronisation wait.

    See the module docstring; (None, {}) without collectives.
    """
    rules = rules or CollectiveRules()
    colls = [c for c in colls if len(c.type)]
    if not colls:
        return None, {}
    method, matched = match(colls)
    sync, transfer_total, sync_by_step, late, rows = _matched_waits(colls, matched, rules)
    lower_bound = not matched
    if lower_bound:
        rows = [
            (ty, float(c.nbytes[i]), float(c.dur[i]), 0)
            for c in colls
            for i, ty in enumerate(c.type)
        ]
    table = _bandwidth_table(rows, world_size or len(colls), lower_bound, colls[0])
    per_rank = (
        {str(r): RankSync(sync[r], transfer_total[r]) for r in sorted(sync)} if matched else {}
    )
    late_arrival = {str(r): v for r, v in sorted(late.items())}
    summary = CollectivesSummary(
        method, len(matched), lower_bound, table, per_rank, late_arrival=late_arrival
    )
    return summary, sync_by_step


def _matched_waits(
    colls: Sequence[Collectives], matched: list[dict[int, int]], rules: CollectiveRules
) -> tuple[dict[int, int], dict[int, int], SyncByStep, dict[int, LateArrival], list[Row]]:
    """Per matched collective: who waited for whom, and the transfer (the fastest rank's time).

    Returns each rank's total sync wait and transfer, the sync wait per (rank, step), what
    each rank that arrived last cost the others (rank → :class:`LateArrival`), and one
    (type, bytes, transfer, ranks) row per matched collective. Whole-matrix numpy over
    collectives × ranks: linear in both, whatever the number of ranks.
    """
    ranks = [c.rank for c in colls]
    sync = dict.fromkeys(ranks, 0)
    transfer_total = dict.fromkeys(ranks, 0)
    if not matched:
        return sync, transfer_total, {}, {}, []
    # every matched collective names every rank (match() keeps only those all ranks hold)
    idx = np.empty((len(matched), len(ranks)), np.int64)  # K x R, filled rank by rank
    for j, r in enumerate(ranks):
        idx[:, j] = np.fromiter((m[r] for m in matched), np.int64, len(matched))
    offs = np.cumsum([0] + [len(c.type) for c in colls[:-1]])
    flat = idx + offs[None, :]
    dur = np.concatenate([c.dur for c in colls])[flat]
    nb = np.concatenate([c.nbytes for c in colls])[flat].max(axis=1)
    t = dur.min(axis=1)  # the transfer: the last rank to arrive waits for nobody
    wait = dur - t[:, None]
    # a rank waits from its entry until the last rank's: [start, start + wait]. Collectives
    # that run side by side on one rank (gloo's worker threads, NCCL streams) wait for the
    # same late rank at once, so a rank's wait is the union of those intervals, not their sum
    start = np.concatenate([c.start for c in colls])[flat]
    own = union_shares(start, start + wait)
    for r, w in zip(ranks, own.sum(axis=0).tolist(), strict=True):
        sync[r] = int(w)
    total_t = int(t.sum())
    for r in ranks:
        transfer_total[r] = total_t
    step = np.concatenate([c.step.astype(np.int64) for c in colls])[flat]
    del flat
    sync_by_step = _sum_by_rank_step(np.asarray(ranks, np.int64), step, own)
    del step, own
    late: dict[int, LateArrival] = {}
    n = len(ranks)
    if n > 1:
        last = dur.argmin(axis=1)  # the first rank (in rank order) with the shortest wait
        waited = (dur.sum(axis=1) - n * t) // (n - 1)
        held = np.flatnonzero(waited >= rules.late_wait_ns)
        for li in unique(last[held]).tolist():
            rows = held[last[held] == li]
            w = waited[rows]
            # the others' waits for this rank, as a union per rank (side-by-side collectives)
            total = int(union_shares(start[rows], start[rows] + wait[rows]).sum())
            late[ranks[li]] = LateArrival(rows.size, total, int(w.min()), int(w.max()))
    types = colls[0].type
    rows = [
        (types[int(i)], float(nbk), float(tk), n)
        for i, nbk, tk in zip(idx[:, 0].tolist(), nb.tolist(), t.tolist(), strict=True)
    ]
    return sync, transfer_total, sync_by_step, late, rows


def _sum_by_rank_step(ranks: npt.NDArray[np.int64], step: Any, wait: Any) -> SyncByStep:
    """{(rank, step): summed wait}, keys in the order a collective-by-collective sum meets them.

    ``step`` and ``wait`` are collectives x ranks; each (rank column, step) pair gets one
    small integer (steps numbered among the few distinct ones), so the sums and first
    meetings are two scatter operations over arrays of pairs, not of collectives.
    """
    r = step.shape[1]
    steps = unique(step)
    key = np.searchsorted(steps, step)  # the step's number among the distinct steps
    key += np.arange(r, dtype=key.dtype)[None, :] * steps.size  # + its rank column
    key = key.ravel()  # collective-major: the order the sum meets the pairs
    sums = np.zeros(r * steps.size, np.int64)
    np.add.at(sums, key, wait.ravel())
    first = np.full(r * steps.size, key.size, np.int64)
    np.minimum.at(first, key, np.arange(key.size, dtype=np.int64))
    met = np.flatnonzero(first < key.size)
    met = met[np.argsort(first[met], kind="stable")]
    col, sid = np.divmod(met, steps.size)
    return {
        (int(ranks[c]), int(steps[j])): int(sums[m])
        for c, j, m in zip(col.tolist(), sid.tolist(), met.tolist(), strict=True)
    }


def _bandwidth_table(
    rows: list[tuple[str, float, float, int]], group: int, lower_bound: bool, first: Collectives
) -> list[CollectiveRow]:
    """One row per (type, size bucket): median size and transfer, algbw, busbw, efficiency."""
    peak = _peak(first.device_name)
    host_gpus = first.devices
    groups: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for ty, size, dur, n in rows:
        label = _bucket(size) if size >= 0 else "unknown size"
        groups.setdefault((ty, label), []).append((size, dur, n))
    table = []
    for (ty, label), items in sorted(groups.items()):
        nbs = np.array([x[0] for x in items])
        ts = np.array([x[1] for x in items])
        known = nbs >= 0
        algbw = busbw = peak_gbps = eff = None
        link = cause = None
        if known.any() and ts[known].sum() > 0:
            algbw = float(nbs[known].sum() / ts[known].sum())  # bytes/ns = GB/s
            n = max(max(x[2] for x in items), 2) if not lower_bound else max(group, 2)
            busbw = algbw * (BUS_FACTOR[ty](n) if ty in BUS_FACTOR else 1.0)
            if peak and (host_gpus == 0 or n <= host_gpus):
                peak_gbps, eff = peak, busbw / peak
                link = _link_name(first.device_name)
            cause = likely_cause(first.device_name, n, host_gpus) or None
            if eff is not None and eff > ABOVE_LINK:
                # faster than the link can go: the range timed is not the transfer (a host
                # range that only enqueued it): no share of peak is claimed
                peak_gbps = eff = None
                cause = "faster than the link: the timed range is not the transfer"
        table.append(
            CollectiveRow(
                type=ty,
                size_bucket=label,
                count=len(items),
                bytes_median=int(nputil.median(nbs[known])) if known.any() else None,
                transfer_ns_median=int(nputil.median(ts)),
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                peak_gbps=peak_gbps,
                efficiency=eff,
                link=link,
                likely_cause=cause,
            )
        )
    return table


def _link_name(device: str) -> str | None:
    link = link_of(device)
    return link[0] if link is not None else None


def bandwidth_findings(section: CollectivesSummary | None, rules: CollectiveRules) -> list[Finding]:
    """``low_bandwidth`` for large-message buckets far below the nominal link peak."""
    if section is None or section.bandwidth_is_lower_bound:
        return []  # unmatched durations include waiting: not evidence of a slow link
    out: list[Finding] = []
    for row in section.by_type:
        eff = row.efficiency
        if (
            eff is None
            or row.busbw_gbps is None
            or row.peak_gbps is None
            or (row.bytes_median or 0) < rules.large_message_bytes
            or eff >= rules.low_bandwidth_ratio
        ):
            continue
        out.append(
            Finding(
                kind=FindingKind.LOW_BANDWIDTH,
                severity=Severity.WARNING,
                message=(
                    f"{row.type} of {row.size_bucket} reaches "
                    f"{row.busbw_gbps:.0f} GB/s bus bandwidth, {eff:.0%} of the "
                    f"{row.peak_gbps:.0f} GB/s {row.link or 'link'} peak"
                    + (f"; likely {row.likely_cause}" if row.likely_cause else "")
                ),
                metrics=BandwidthMetrics(
                    row.type,
                    row.size_bucket,
                    row.count,
                    row.bytes_median,
                    row.busbw_gbps,
                    row.peak_gbps,
                    eff,
                    row.transfer_ns_median,
                    row.link,
                    row.likely_cause,
                ),
            )
        )
    return out


def with_exposed_waits(
    coll: CollectivesSummary | None, sync_by_step: SyncByStep, steps: Sequence[StepBreakdown]
) -> CollectivesSummary | None:
    """Each rank's wait for the last rank that held its steps (``RankSync.exposed_wait_ns``).

    Per (rank, step), the least of the step's synchronisation wait and its comm-wait (the
    wait not hidden behind compute), summed over the rank's analysed steps: never more than
    either, so "waiting for the last rank" cannot exceed the communication wait it explains.
    """
    if coll is None or not coll.per_rank:
        return coll
    exposed: dict[int, int] = {}
    for s in steps:
        w = sync_by_step.get((s.rank, s.step), 0)
        exposed[s.rank] = exposed.get(s.rank, 0) + min(w, s.comm_wait_ns)
    per = {
        r: dataclasses.replace(v, exposed_wait_ns=exposed.get(int(r), 0))
        for r, v in coll.per_rank.items()
    }
    return dataclasses.replace(coll, per_rank=per)
