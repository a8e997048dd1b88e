"""Communication against the link: collective sizes from operator inputs, the link's peak.

NCCL's kernels carry their message size only when the profiler annotated them (``In msg
nelems`` × ``dtype``); older traces and other libraries do not. Then the size comes from
the communication operator that launched the kernel (``c10d::*``, ``nccl:*``,
``record_param_comms``: the outermost such host range holding the kernel's launching call,
as :mod:`.measure` attributes compute kernels), from its recorded inputs, in nccl-tests'
convention (the total message: an all-gather's output, a reduce-scatter's input):

* ``_allgather_base_`` / ``all_gather_into_tensor`` (output, input): the first tensor;
* ``_reduce_scatter_base_`` / ``reduce_scatter_tensor`` (output, input): the second;
* every other operator (all-reduce, broadcast, all-to-all, send/recv): its tensor inputs.

A list-of-tensors all-gather (``allgather_``) gives one rank's part only: left unknown.

The link a collective is compared with is the device's (:mod:`.peaks`); a share far below it
is named with its likely cause: a consumer card without peer-to-peer (through host memory),
PCIe instead of NVLink, or a group larger than one host's GPUs (inter-node: the network).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag.analysis.efficiency.flops import TYPE_BYTES, decode_shape
from gpudiag.analysis.efficiency.peaks import peak_of
from gpudiag.traces.schema import Kind, RankTimeline

_COMM_OP = re.compile(r"^(c10d::|nccl:|record_param_comms$)")
_TOTAL_FIRST = re.compile(r"allgather_base|all_gather_into_tensor|_allgather_base_", re.I)
_TOTAL_SECOND = re.compile(r"reduce_scatter_base|reduce_scatter_tensor", re.I)
_PARTS = re.compile(r"allgather_$|all_gather$|allgather$", re.I)


def sizes_from_operators(tl: RankTimeline, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    """``tl.nbytes[idx]`` with the unknown sizes of GPU collectives filled from their operators."""
    out: npt.NDArray[np.int64] = tl.nbytes[idx].copy()
    todo = np.flatnonzero((out < 0) & (tl.launch_ns[idx] >= 0))
    if not len(todo) or not len(tl.shapes):
        return out
    names = np.array([bool(_COMM_OP.search(n)) for n in tl.names], bool)
    ops = np.flatnonzero((tl.shape >= 0) & (tl.kind != Kind.COMPUTE) & names[tl.name])
    if not len(ops):
        return out
    ops = _outermost(tl, ops)
    order = np.argsort(tl.start_ns[ops], kind="stable")
    s, e = tl.start_ns[ops][order], tl.end_ns[ops][order]
    launch = tl.launch_ns[idx[todo]]
    j = np.searchsorted(s, launch, side="right") - 1
    hit = (j >= 0) & (launch <= e[np.maximum(j, 0)])
    cache: dict[tuple[int, int], int] = {}
    for t, jj in zip(todo[hit].tolist(), j[hit].tolist(), strict=True):
        op = int(ops[order[jj]])
        key = (int(tl.name[op]), int(tl.shape[op]))
        if key not in cache:
            cache[key] = operator_bytes(tl.names[key[0]], tl.shapes[key[1]])
        out[t] = cache[key]
    return out


def _outermost(tl: RankTimeline, ops: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """The communication operators not inside another one on their thread."""
    order = np.lexsort((-tl.end_ns[ops], tl.start_ns[ops], tl.lane[ops]))
    ops = ops[order]
    keep = np.ones(len(ops), bool)
    last_end: dict[int, int] = {}
    for k, (ln, en) in enumerate(zip(tl.lane[ops].tolist(), tl.end_ns[ops].tolist(), strict=True)):
        if last_end.get(ln, -1) >= en:
            keep[k] = False
        else:
            last_end[ln] = en
    kept: npt.NDArray[np.intp] = ops[keep]
    return kept


def operator_bytes(name: str, shape_text: str) -> int:
    """A communication operator's message in bytes (see the module docstring), -1 unknown."""
    decoded = decode_shape(shape_text)
    if decoded is None or _PARTS.search(name):
        return -1
    dims, types, _ = decoded
    sizes = [_tensor_bytes(d, t) for d, t in zip(dims, types, strict=False)]
    tensors = [b for b in sizes if b > 0]
    if not tensors:
        return -1
    if _TOTAL_FIRST.search(name):
        return tensors[0]
    if _TOTAL_SECOND.search(name):
        return tensors[1] if len(tensors) > 1 else -1
    return sum(tensors)


def _tensor_bytes(d: Any, t: Any) -> int:
    if not (isinstance(d, list) and d and isinstance(t, str)):
        return -1
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
        return -1
    size = TYPE_BYTES.get(t.lower(), 0)
    return math.prod(d) * size if size else -1


def link_of(device: str) -> tuple[str, float] | None:
    """The device's link and its per-direction peak in GB/s; None when unknown."""
    p = peak_of(device)
    return (p.link, p.link_gbps) if p is not None else None


def likely_cause(device: str, group: int, host_gpus: int) -> str:
    """Why a collective reads far below its link's peak, as far as the trace tells."""
    if host_gpus and group > host_gpus:
        return "the group spans hosts: inter-node traffic, bounded by the network, not this link"
    link = link_of(device)
    if link is None:
        return ""
    if re.search(r"GeForce|RTX [2-5]0\d0", device):
        return (
            "a consumer card without peer-to-peer: NCCL copies through host memory "
            "(check NCCL_P2P_DISABLE / `nvidia-smi topo -m`)"
        )
    if link[0].startswith("PCIe") or "bridge" in link[0]:
        return "PCIe between the GPUs (no NVLink, or no bridge on this pair)"
    return "small messages or contention: latency-bound, or other traffic on the link"
