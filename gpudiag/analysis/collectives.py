"""Matches collectives across ranks, splits transfer from synchronisation, measures bandwidth.

A collective kernel (or gloo range) starts when its rank reaches it and ends when all peers
have: on early ranks its duration is *waiting for the last rank* plus the transfer. So:

* **Matching** (best key first): ``Comms Id`` or (process group, ``Seq``) from the trace's
  collective args, identical on every rank; otherwise the order of collectives of one type
  on each rank (the i-th all-reduce everywhere), checked against the message size where both
  sides know it — a size mismatch drops that pair rather than guessing.
* **Transfer** of a matched collective = its shortest duration over the ranks (the last
  arrival waits for no one); each rank's **synchronisation wait** = its duration − transfer.
* **Bandwidth**, as nccl-tests defines it, from the transfer time t and the message size S:
  ``algbw = S / t`` and ``busbw = algbw × f(n)`` with f = 2(n−1)/n for all-reduce,
  (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast, reduce and
  point-to-point; n = the group size. Collectives are grouped by type and size bucket.
  With a single rank's trace nothing can be matched: the raw duration (which includes
  waiting) is used and the bandwidth is marked a lower bound (never a finding).
* **Nominal peak**: the per-direction NVLink bandwidth of the GPU model named by the trace
  (table :data:`NVLINK_PEAK_GBPS`), used only when the group fits in one host (its size is
  at most the number of GPUs the trace lists). A large-message bucket (≥ 1 MiB) running
  below 25% of it is reported as ``low_bandwidth``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag.analysis.model import Finding
from gpudiag.traces.schema import I64, Kind, RankTimeline

# Per-direction NVLink bandwidth, GB/s (10^9 B/s), by GPU model (first match wins).
NVLINK_PEAK_GBPS: list[tuple[str, float]] = [
    ("GB200", 900.0), ("B200", 900.0), ("H200", 450.0), ("H100 PCIe", 300.0), ("H100", 450.0),
    ("H800", 200.0), ("A100-PCIE", 300.0), ("A100", 300.0), ("A800", 200.0), ("V100-SXM2", 150.0),
    ("V100-SXM3", 150.0),
]  # fmt: skip
LOW_BANDWIDTH_RATIO = 0.25
LARGE_MESSAGE = 1 << 20
BUCKETS = [(0, 64 << 10, "<64KiB"), (64 << 10, 1 << 20, "64KiB-1MiB"),
           (1 << 20, 16 << 20, "1-16MiB"), (16 << 20, 256 << 20, "16-256MiB"),
           (256 << 20, 1 << 62, ">=256MiB")]  # fmt: skip

_KERNEL_TYPE = re.compile(r"nccl(?:Sym)?(?:Dev)?Kernel_([A-Za-z]+)")
_ALIASES = {
    "allreduce": "allreduce", "allgather": "allgather", "allgatherbase": "allgather",
    "allgatherintocoalesced": "allgather", "reducescatter": "reducescatter",
    "reducescatterbase": "reducescatter", "alltoall": "alltoall", "alltoallv": "alltoall",
    "alltoallbase": "alltoall", "broadcast": "broadcast", "reduce": "reduce",
    "send": "send", "recv": "recv", "sendrecv": "sendrecv", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter",
}  # fmt: skip
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
}  # fmt: skip


def collective_type(name: str) -> str:
    """``allreduce``, ``allgather``, ``sendrecv`` … from a kernel, range or args name."""
    m = _KERNEL_TYPE.search(name)
    raw = m.group(1) if m else name.split(":", 1)[-1]
    key = re.sub(r"[^a-z]", "", raw.lower())
    return _ALIASES.get(key, "unknown" if key in ("generic", "") else key)


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


def extract(tl: RankTimeline, mode: str) -> Collectives:
    """The rank's collective operations: comm kernels (GPU) or comm-thread ranges (CPU)."""
    gpu = tl.gpu_lane_mask()[tl.lane] if len(tl) else np.zeros(0, bool)
    if mode == "gpu":
        mask = (tl.kind == Kind.COMM) & gpu
    else:
        # gloo/nccl ranges; c10d:: and record_param_comms wrap them on the calling thread
        names = np.array([n.startswith(("gloo:", "nccl:", "mpi:", "ucc:")) for n in tl.names])
        mask = (tl.kind == Kind.COMM) & ~gpu & names[tl.name] if len(tl) else np.zeros(0, bool)
    idx = np.flatnonzero(mask)
    idx = idx[np.argsort(tl.start_ns[idx], kind="stable")]
    label = np.where(tl.coll_name[idx] >= 0, tl.coll_name[idx], tl.name[idx])
    types = [collective_type(tl.names[int(i)]) for i in label.tolist()]
    keep = [j for j, t in enumerate(types) if t not in ("barrier", "wait")]
    idx = idx[keep]
    devs = tl.meta.devices
    return Collectives(
        rank=tl.rank,
        type=[types[j] for j in keep],
        key=tl.coll_id[idx],
        nbytes=tl.nbytes[idx],
        start=tl.start_ns[idx],
        dur=tl.end_ns[idx] - tl.start_ns[idx],
        step=tl.step[idx],
        devices=len(devs),
        device_name=devs[0] if devs else "",
    )


def _peak(device: str) -> float | None:
    for pat, gbps in NVLINK_PEAK_GBPS:
        if pat.lower() in device.lower():
            return gbps
    return None


def _bucket(nbytes: float) -> str:
    for lo, hi, label in BUCKETS:
        if lo <= nbytes < hi:
            return label
    return BUCKETS[-1][2]


def match(colls: Sequence[Collectives]) -> tuple[str, list[dict[int, int]]]:
    """Matched collectives as {rank: index in that rank's Collectives}; and the method used."""
    if len(colls) < 2 or not all(len(c.type) for c in colls):
        return "none", []
    if all((c.key >= 0).all() for c in colls):
        maps = [{int(k): i for i, k in enumerate(c.key.tolist())} for c in colls]
        common = set.intersection(*[set(m) for m in maps])
        keys = sorted(common, key=lambda k: int(colls[0].start[maps[0][k]]))
        return "comms_id", [{c.rank: m[k] for c, m in zip(colls, maps, strict=True)} for k in keys]
    # order within each collective type, checked against the size
    out: list[dict[int, int]] = []
    types = set.intersection(*[set(c.type) for c in colls])
    for t in sorted(types):
        per = [[i for i, x in enumerate(c.type) if x == t] for c in colls]
        for j in range(min(len(p) for p in per)):
            m = {c.rank: p[j] for c, p in zip(colls, per, strict=True)}
            sizes = {int(c.nbytes[m[c.rank]]) for c in colls} - {-1}
            if len(sizes) <= 1:
                out.append(m)
    return "order", out


def analyse(colls: Sequence[Collectives], world_size: int | None = None) -> dict[str, Any]:
    """The collectives section of a Diagnosis (see the module docstring); {} without any."""
    colls = [c for c in colls if len(c.type)]
    if not colls:
        return {}
    method, matched = match(colls)
    by_rank = {c.rank: c for c in colls}
    rows: list[tuple[str, float, float, int, float]] = []  # type, bytes, transfer, n, total dur
    sync = {c.rank: 0 for c in colls}
    transfer_total = {c.rank: 0 for c in colls}
    sync_by_step: dict[tuple[int, int], int] = {}
    if matched:
        for m in matched:
            durs = {r: int(by_rank[r].dur[i]) for r, i in m.items()}
            t = min(durs.values())
            for r, d in durs.items():
                sync[r] += d - t
                transfer_total[r] += t
                st = int(by_rank[r].step[m[r]])
                sync_by_step[(r, st)] = sync_by_step.get((r, st), 0) + d - t
            r0 = next(iter(m))
            c0 = by_rank[r0]
            nb = max(int(by_rank[r].nbytes[i]) for r, i in m.items())
            rows.append((c0.type[m[r0]], float(nb), float(t), len(m), float(sum(durs.values()))))
        lower_bound = False
    else:
        for c in colls:
            for i, ty in enumerate(c.type):
                rows.append((ty, float(c.nbytes[i]), float(c.dur[i]), 0, float(c.dur[i])))
        lower_bound = True
    group = world_size or len(colls)
    peak = _peak(colls[0].device_name)
    host_gpus = colls[0].devices
    groups: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for ty, size, dur, n, _ in rows:
        label = _bucket(size) if size >= 0 else "unknown size"
        groups.setdefault((ty, label), []).append((size, dur, n))
    table = []
    for (ty, label), items in sorted(groups.items()):
        nbs = np.array([x[0] for x in items])
        ts = np.array([x[1] for x in items])
        known = nbs >= 0
        row: dict[str, Any] = {
            "type": ty, "size_bucket": label, "count": len(items),
            "bytes_median": int(np.median(nbs[known])) if known.any() else None,
            "transfer_ns_median": int(np.median(ts)),
            "algbw_gbps": None, "busbw_gbps": None, "peak_gbps": None, "efficiency": None,
        }  # fmt: skip
        if known.any() and ts[known].sum() > 0:
            algbw = float(nbs[known].sum() / ts[known].sum())  # bytes/ns = GB/s
            n = max(max(x[2] for x in items), 2) if not lower_bound else max(group, 2)
            factor = BUS_FACTOR[ty](n) if ty in BUS_FACTOR else 1.0
            row["algbw_gbps"] = algbw
            row["busbw_gbps"] = algbw * factor
            if peak and (host_gpus == 0 or n <= host_gpus):
                row["peak_gbps"] = peak
                row["efficiency"] = row["busbw_gbps"] / peak
        table.append(row)
    per_rank = (
        {str(r): {"sync_wait_ns": sync[r], "transfer_ns": transfer_total[r]} for r in sorted(sync)}
        if matched
        else {}
    )
    return {
        "method": method,
        "matched": len(matched),
        "bandwidth_is_lower_bound": lower_bound,
        "by_type": table,
        "per_rank": per_rank,
        "_sync_by_step": sync_by_step,
    }


def bandwidth_findings(section: dict[str, Any]) -> list[Finding]:
    """``low_bandwidth`` for large-message buckets far below the nominal link peak."""
    out: list[Finding] = []
    if section.get("bandwidth_is_lower_bound", True):
        return out  # unmatched durations include waiting: not evidence of a slow link
    for row in section.get("by_type", []):
        eff = row.get("efficiency")
        if (
            eff is None
            or (row.get("bytes_median") or 0) < LARGE_MESSAGE
            or eff >= LOW_BANDWIDTH_RATIO
        ):
            continue
        out.append(Finding(
            kind="low_bandwidth", severity="warning",
            message=(f"{row['type']} of {row['size_bucket']} reaches "
                     f"{row['busbw_gbps']:.0f} GB/s bus bandwidth, {eff:.0%} of the "
                     f"{row['peak_gbps']:.0f} GB/s NVLink peak"),
            metrics={k: row[k] for k in ("type", "size_bucket", "count", "bytes_median",
                                         "busbw_gbps", "peak_gbps", "efficiency")},
        ))  # fmt: skip
    return out
