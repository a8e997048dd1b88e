"""Communication by what launched it: kernels launched inside collectives or on their stream.

Names are a fallback (:func:`gpudiag.traces.core.common.refine_kinds`): a kernel whose
launching runtime call (the launch link, ``launch_ns``) starts inside a host range that is
a collective or point-to-point operation on the call's own thread (``c10d::*``,
``nccl:*``, ``record_param_comms``, ``gloo:*``, MPI ranges: the comm-host pattern) is
communication whatever it is called — a custom all-to-all, DeepEP's dispatch/combine, a
renamed NCCL kernel. A GPU stream whose kernels are almost all communication
(``LoaderRules.comm_stream_ratio`` of them, at least ``comm_stream_min`` kernels) is the
collectives' stream: its other kernels are communication too.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpudiag.config import LoaderRules
from gpudiag.traces.schema import Kind, gpu_lanes

I64 = npt.NDArray[np.int64]


def _inside(starts: I64, ends: I64, at: I64) -> npt.NDArray[np.bool_]:
    """Per time in ``at``: inside any of the (possibly nested) ranges [start, end]."""
    if not starts.size or not at.size:
        return np.zeros(at.size, bool)
    order = np.argsort(starts, kind="stable")
    s, reach = starts[order], np.maximum.accumulate(ends[order])
    k = np.searchsorted(s, at, side="right") - 1
    ok = k >= 0
    ok[ok] = reach[k[ok]] >= at[ok]
    return ok


def comm_by_launch(
    kind: I64,
    lane: I64,
    lanes: list[str],
    start_ns: I64,
    end_ns: I64,
    launch_ns: I64,
    rules: LoaderRules,
) -> tuple[I64, int]:
    """The kinds with launched-as-communication kernels made COMM; and how many were renamed."""
    gpu_lane = gpu_lanes(lanes)
    is_gpu = gpu_lane[lane] if lane.size else np.zeros(0, bool)
    out = kind.copy()
    kern = np.flatnonzero(is_gpu & (kind == Kind.COMPUTE) & (launch_ns >= 0))
    ranges = np.flatnonzero(~is_gpu & (kind == Kind.COMM))
    rt = np.flatnonzero(~is_gpu & (kind == Kind.RUNTIME))
    if kern.size and ranges.size and rt.size:
        order = rt[np.argsort(start_ns[rt], kind="stable")]
        rs = start_ns[order]
        k = np.searchsorted(rs, launch_ns[kern])
        hit = k < rs.size
        hit[hit] = rs[k[hit]] == launch_ns[kern[hit]]
        kern, call = kern[hit], order[k[hit]]
        for ln in np.unique(lane[ranges]).tolist():
            mine = lane[call] == ln
            if not mine.any():
                continue
            r = ranges[lane[ranges] == ln]
            inside = _inside(start_ns[r], end_ns[r], launch_ns[kern[mine]])
            out[kern[mine][inside]] = Kind.COMM
    _comm_streams(out, lane, is_gpu, rules)
    return out, int(np.count_nonzero((out == Kind.COMM) & (kind == Kind.COMPUTE)))


def _comm_streams(kind: I64, lane: I64, is_gpu: npt.NDArray[np.bool_], rules: LoaderRules) -> None:
    """Kernels on a stream that is almost only communication become communication (in place)."""
    kernels = is_gpu & np.isin(kind, [Kind.COMPUTE, Kind.COMM])
    if not kernels.any():
        return
    n = np.bincount(lane[kernels])
    c = np.bincount(lane[kernels & (kind == Kind.COMM)], minlength=n.size)
    streams = np.flatnonzero((c >= rules.comm_stream_min) & (c >= rules.comm_stream_ratio * n))
    if streams.size:
        kind[kernels & (kind == Kind.COMPUTE) & np.isin(lane, streams)] = Kind.COMM
