"""Names the host-side cause of GPU idle time from the runtime calls the training thread made.

"Other" time (no compute, exposed communication or data wait) has causes a trace can tell
apart, each with its own remedy:

* **synchronisation** — the thread blocks in ``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize`` (``.item()``, ``.cpu()``,
  ``_local_scalar_dense``) or their HIP/driver twins; what the GPU runs meanwhile says
  whom it waits for (its own kernels, a collective, a copy, or nothing);
* **allocator** — ``cudaMalloc``/``cudaFree``/``hipMalloc``/``hipFree`` (and host
  allocations) inside the step: PyTorch's caching allocator is off or thrashing;
* **blocking copies** — ``cudaMemcpy``/``hipMemcpy``/``hipMemcpyWithStream`` and
  ``*MemcpyAsync`` calls that return only when the copy is done (pageable host memory);
* **JIT compilation** — NVRTC/hipRTC and module loading (``cuModuleLoadData``…);
* **launch overhead** — many short kernels launched one by one (``cudaLaunchKernel``…):
  the case CUDA graphs exist for;
* **eager operator overhead** — a host thread of the rank is inside an operator
  (dispatch, autograd bookkeeping, launches) while the GPU computes nothing;
* **Python overhead** — no host thread of the rank is inside an operator.

Each class's time is the union of its calls on the rank's operator threads (the training
thread and its autograd threads, below; every host thread when the training thread is
unknown) inside the analysed steps, per step, **with the GPU computing or communicating
taken out**: a call that blocks while the GPU runs earlier work waits for the GPU, and
that time is the GPU's (``gpu_busy_ns`` keeps it), never the host's. The kernels'
count and median duration per step, graph launches (graphs already in use) and the share
of compute in half-precision kernels (AMP already on) are measured beside them.

The rank's *operator threads* are the training thread and its autograd threads: threads
named ``pt_autograd_N`` (or anything with "autograd"/"backward" in its name) and threads
running ``autograd::engine::evaluate_function`` ranges — in a GPU job, backward runs there,
not on the training thread. Their operators' union, per step, splits the steps' time into
"inside an operator" and "between operators" (``host_ops``). With Python frames in the
trace (``RankTimeline.python``), the GPU-idle time between operators goes to the innermost
frame open on the training thread (``python_sites``, :func:`python_sites`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpudiag._support import lazyre, nputil
from gpudiag._support.nputil import unique_inverse
from gpudiag._support.records import dataclass
from gpudiag.analysis.model.diagnosis import EvidenceParts
from gpudiag.analysis.model.evidence import (
    CopiesAlone,
    HostApiEntry,
    HostOps,
    KernelsByStep,
    PythonSite,
    PythonSites,
)
from gpudiag.analysis.rank import intervals as iv
from gpudiag.analysis.rank.classify import RankSets
from gpudiag.analysis.reading.steps import StepWindows
from gpudiag.traces.schema import Kind, RankTimeline

API_CLASSES: dict[str, re.Pattern[str]] = {
    cls: lazyre.compile(p)
    for cls, p in {
        "sync": r"^(cuda|hip)(Stream|Device|Event)Synchronize|^cu(Stream|Ctx|Event)Synchronize",
        "allocator": r"^(cuda|hip)(Malloc|Free|HostAlloc|HostMalloc|HostFree|MallocHost|"
        r"FreeHost|MallocManaged|MallocAsync|FreeAsync)|^cuMem(Alloc|Free|Create|Release|"
        r"Map\b|Unmap|AddressReserve|AddressFree|HostAlloc|FreeHost)",
        "copy": r"^(cuda|hip|cu)Memcpy",
        "jit": r"^(nvrtc|hiprtc)|^cu(ModuleLoad|LinkComplete|LinkAddData|LibraryLoad)|"
        r"^hipModuleLoad",
        "launch": r"^(cuda|hip|cu)(LaunchKernel|LaunchCooperativeKernel|ModuleLaunchKernel|"
        r"ExtModuleLaunchKernel|ExtLaunchKernel|LaunchKernelEx)",
        "graph": r"^(cuda|hip|cu)GraphLaunch",
    }.items()
}
# Kernels computing in half precision or lower (their names carry the type).
LOW_PRECISION_KERNEL = re.compile(
    r"bf16|bfloat16|__half|\bhalf\b|c10::Half|fp16|f16f16|_f16|h884|h1688|h16816|hmma|"
    r"e4m3|e5m2|fp8|_h_|_hh|Half>",
    re.IGNORECASE,
)
# Threads that run backward for the training thread (PyTorch names them pt_autograd_N).
AUTOGRAD_THREAD = re.compile(r"autograd|backward", re.IGNORECASE)
AUTOGRAD_OP = re.compile(r"^autograd::engine::evaluate_function")
_LAUNCH = list(API_CLASSES).index("launch")
_GRAPH = list(API_CLASSES).index("graph")
# Python functions named per rank (python_sites): those holding the most GPU-idle time
_PYTHON_SITES = 5
# Kernels named per step (kernels_by_step): the ones whose time varies most between steps.
_KERNELS_BY_STEP = 8
PAGEABLE_COPY = re.compile(r"Pageable", re.IGNORECASE)
# Copies between host and device (Kineto: "Memcpy HtoD (Pageable -> Device)"; Nsight: "Memcpy
# DtoH"), not device-to-device or peer copies.
HOST_DEVICE_COPY = re.compile(r"HtoD|DtoH|Pageable|Pinned|Host", re.IGNORECASE)


def host_evidence(
    tl: RankTimeline, win: StepWindows, keep: npt.NDArray[np.bool_], sets: RankSets
) -> EvidenceParts:
    """Runtime-call classes, kernel counts and precision of a rank's analysed steps.

    ``host_api`` maps each class of :data:`API_CLASSES` with any call in the analysed
    steps to ``{ns, ns_per_step (GPU-idle part), gpu_busy_ns(_per_step), steps, calls, api, apis,
    longest_ns, longest_step, longest_op}``, and ``sync`` and ``copy`` to ``waits_for``
    too: the shares of their time during which the GPU ran compute, a collective, a copy,
    or nothing.
    ``host_op_share``: the share of the steps' time with an operator open on one of the
    rank's operator threads (module docstring; the rest is Python, or waiting, between
    operators); ``host_ops``: per step, that time on the training thread and on the other
    operator threads, and the time inside and between operators with the GPU computing
    nothing and no communication or data wait (see :func:`_op_time`); ``kernels_per_step``,
    ``kernel_ns_median``, ``low_precision_share`` (of compute kernel time);
    ``kernels_by_step``: per step, the kernel count and the compute kernels whose time
    varies most between steps; ``copy_ns`` and ``pageable_copy_ns``: GPU copy time in the
    steps, all and from/to pageable memory; ``copies_alone``: per step, host-device copy
    time (HtoD, DtoH) with no compute, communication or data wait beside it.
    """
    if not len(tl) or not keep.any():
        return {}
    w = _Window(win.start[keep], win.end[keep], win.step[keep])
    gpu = tl.gpu_lane_mask()[tl.lane]
    main = tl.meta.main_lane
    host = (tl.lane == main) if main >= 0 else ~gpu
    out: EvidenceParts = {}
    lanes = op_lanes(tl)
    threads = np.isin(tl.lane, lanes) if lanes else host
    api = _host_api(tl, threads, w, sets)
    if api:
        out["host_api"] = api
    ops = np.flatnonzero(threads & (tl.kind == Kind.CPU_OP))
    if ops.size:
        out |= _op_time(tl, ops, w, sets)
        if tl.python is not None and main >= 0:
            out |= python_sites(tl, ops, w, sets, threads)
    return out | _kernels(tl, gpu, w) | _by_step(tl, gpu, w) | _copies(tl, gpu, w, sets)


def op_lanes(tl: RankTimeline) -> list[int]:
    """The rank's operator threads: the training thread and its autograd threads.

    Autograd threads are named so (``pt_autograd_0``) or run the autograd engine's
    ``autograd::engine::evaluate_function`` ranges. Empty when the training thread is
    unknown.
    """
    main = tl.meta.main_lane
    if main < 0:
        return []
    gpu = tl.gpu_lane_mask()
    names = tl.meta.thread_names
    lanes = {main} | {
        i
        for i, ln in enumerate(tl.lanes)
        if not gpu[i] and any(AUTOGRAD_THREAD.search(n) for n in names.get(ln, []))
    }
    ops = np.flatnonzero(tl.kind == Kind.CPU_OP)
    engine = _per_event(tl.names, tl.name[ops], _found(AUTOGRAD_OP)).astype(bool)
    lanes |= {int(x) for x in nputil.unique(tl.lane[ops[engine]]).tolist() if not gpu[int(x)]}
    return sorted(lanes)


def _op_time(
    tl: RankTimeline, ops: npt.NDArray[np.int64], w: _Window, sets: RankSets
) -> EvidenceParts:
    """Per step, the operator threads' time inside and between operators.

    ``training`` and ``other_threads``: operators open on the training thread and on the
    other operator threads; ``in_ops_idle`` and ``between_idle``: inside or between
    operators with the GPU computing nothing, no exposed communication and no data wait —
    the "other" time's two parts; ``between``: between operators, whatever the GPU does;
    ``launch``: kernel-launch calls on the operator threads.
    """
    main = ops[tl.lane[ops] == tl.meta.main_lane]
    rest = ops[tl.lane[ops] != tl.meta.main_lane]
    inside = iv.union(tl.start_ns[ops], tl.end_ns[ops])
    busy = iv.join(iv.join(sets.compute, sets.comm), sets.data)
    length = w.e - w.s
    in_ops = iv.measure(inside, w.s, w.e)
    threads = nputil.unique(tl.lane[ops])
    rt = np.flatnonzero(np.isin(tl.lane, threads) & (tl.kind == Kind.RUNTIME))
    launch = rt[_per_event(tl.names, tl.name[rt], _class_of) == _LAUNCH]
    return {
        "host_op_share": round(float(in_ops.sum() / max(int(length.sum()), 1)), 4),
        "host_ops": HostOps(
            steps=_ints(w.numbers),
            threads=int(threads.size),
            training_ns_per_step=_ints(
                iv.measure(iv.union(tl.start_ns[main], tl.end_ns[main]), w.s, w.e)
            ),
            other_threads_ns_per_step=_ints(
                iv.measure(iv.union(tl.start_ns[rest], tl.end_ns[rest]), w.s, w.e)
            ),
            in_ops_idle_ns_per_step=_ints(iv.measure(iv.subtract(inside, busy), w.s, w.e)),
            between_ns_per_step=_ints(length - in_ops),
            between_idle_ns_per_step=_ints(length - iv.measure(iv.join(inside, busy), w.s, w.e)),
            launch_ns_per_step=_ints(
                iv.measure(iv.union(tl.start_ns[launch], tl.end_ns[launch]), w.s, w.e)
            ),
        ),
    }


def python_sites(
    tl: RankTimeline,
    ops: npt.NDArray[np.int64],
    w: _Window,
    sets: RankSets,
    threads: npt.NDArray[np.bool_],
) -> EvidenceParts:
    """Per step, the Python functions the training thread is in while nothing else runs.

    The time counted is the ``between_idle`` time of :func:`_op_time` (no operator open on
    an operator thread, the GPU computing nothing, no communication or data wait); each
    instant of it goes to the **innermost** Python frame open on the training thread then
    (:func:`innermost`: the open frame that started last), so a function's time is its
    self time. ``before_graph_ns_per_step``: that time before each step's first graph
    launch (``cudaGraphLaunch``…) on the operator threads, when any step launches one.
    """
    py = tl.python
    assert py is not None
    on = np.flatnonzero(
        (py.lane == tl.meta.main_lane) & (py.end_ns > w.s[0]) & (py.start_ns < w.e[-1])
    )
    if not on.size:
        return {}
    idle = iv.subtract(
        iv.union(w.s, w.e),
        iv.join(iv.union(tl.start_ns[ops], tl.end_ns[ops]), _busy(sets)),
    )
    seg_s, seg_e, frame = _in_steps(w, *innermost(py.start_ns[on], py.end_ns[on]))
    ns = iv.measure(idle, seg_s, seg_e)
    step_of = np.searchsorted(w.s, seg_s, side="right") - 1
    names, inv = unique_inverse(py.name[on][frame])
    table = np.zeros((names.size, w.s.size), np.int64)
    np.add.at(table, (inv, step_of), ns)
    starts = _inside(py.start_ns[on], w.s, w.e)
    call_names, call_inv = unique_inverse(py.name[on][starts])
    calls = np.zeros((call_names.size, w.s.size), np.int64)
    call_step = np.searchsorted(w.s, py.start_ns[on][starts], side="right") - 1
    np.add.at(calls, (call_inv, call_step), 1)
    totals = table.sum(axis=1)
    top = [j for j in np.argsort(-totals, kind="stable")[:_PYTHON_SITES].tolist() if totals[j]]
    if not top:
        return {}
    row = {int(n): k for k, n in enumerate(call_names.tolist())}
    sites = [
        PythonSite(
            name=tl.names[int(names[j])],
            ns_per_step=_ints(table[j]),
            calls_per_step=_ints(calls[row[k]] if (k := int(names[j])) in row else table[j] * 0),
        )
        for j in top
    ]
    out = PythonSites(steps=_ints(w.numbers), ns_per_step=_ints(table.sum(axis=0)), sites=sites)
    first = _first_graph_launch(tl, threads, w)
    if first is not None:
        before = iv.measure(idle, w.s, np.where(first >= 0, first, w.s))
        out["before_graph_ns_per_step"] = _ints(np.where(first >= 0, before, -1))
    return {"python_sites": out}


def _busy(sets: RankSets) -> iv.IntervalSet:
    """The GPU computing or communicating, or the rank waiting for data."""
    return iv.join(iv.join(sets.compute, sets.comm), sets.data)


def innermost(
    start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The self-time pieces of nested calls on one thread: ``(start, end, call)``, disjoint.

    At each instant the innermost call is the open one (``start <= t < end``) that started
    last, the shorter first among calls starting together (the later one of two with the
    same bounds). One pass over the calls in
    start order with a stack of the open ones (a Python loop: calls are read once).
    """
    order = np.lexsort((-end, start)).tolist()
    s_of, e_of = start.tolist(), end.tolist()
    out_s: list[int] = []
    out_e: list[int] = []
    out_i: list[int] = []
    stack: list[int] = []
    cur = 0

    def close_until(t: int) -> None:
        nonlocal cur
        while stack and e_of[stack[-1]] <= t:
            top = stack.pop()
            if e_of[top] > cur:
                out_s.append(cur)
                out_e.append(e_of[top])
                out_i.append(top)
                cur = e_of[top]

    for i in order:
        close_until(s_of[i])
        if stack and s_of[i] > cur:
            out_s.append(cur)
            out_e.append(s_of[i])
            out_i.append(stack[-1])
        stack.append(i)
        cur = s_of[i]
    close_until(max(e_of, default=0))
    return np.array(out_s, np.int64), np.array(out_e, np.int64), np.array(out_i, np.int64)


def _in_steps(
    w: _Window, s: npt.NDArray[np.int64], e: npt.NDArray[np.int64], i: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The pieces cut at the steps' bounds and kept where they lie inside a step."""
    bounds = np.unique(np.concatenate([w.s, w.e]))
    first = np.searchsorted(bounds, s, side="right")
    last = np.searchsorted(bounds, e, side="left")
    cut = np.flatnonzero(last > first)  # a bound strictly inside: at most two a step
    if cut.size:
        extra = [
            (int(a), int(b), int(k))
            for j in cut.tolist()
            for a, b, k in zip(
                [s[j], *bounds[first[j] : last[j]].tolist()],
                [*bounds[first[j] : last[j]].tolist(), e[j]],
                [i[j]] * (int(last[j] - first[j]) + 1),
                strict=True,
            )
        ]
        keep = np.ones(s.size, bool)
        keep[cut] = False
        s = np.concatenate([s[keep], np.array([x[0] for x in extra], np.int64)])
        e = np.concatenate([e[keep], np.array([x[1] for x in extra], np.int64)])
        i = np.concatenate([i[keep], np.array([x[2] for x in extra], np.int64)])
    inside = _inside(s, w.s, w.e)
    return s[inside], e[inside], i[inside]


def _first_graph_launch(
    tl: RankTimeline, threads: npt.NDArray[np.bool_], w: _Window
) -> npt.NDArray[np.int64] | None:
    """Per step, the start of its first graph launch on the operator threads (-1: none)."""
    rt = np.flatnonzero(threads & (tl.kind == Kind.RUNTIME))
    graph = rt[_per_event(tl.names, tl.name[rt], _class_of) == _GRAPH]
    graph = graph[_inside(tl.start_ns[graph], w.s, w.e)]
    if not graph.size:
        return None
    never = np.iinfo(np.int64).max
    first = np.full(w.s.size, never, np.int64)
    np.minimum.at(
        first, np.searchsorted(w.s, tl.start_ns[graph], side="right") - 1, tl.start_ns[graph]
    )
    return np.where(first == never, -1, first)


def _ints(a: npt.NDArray[Any]) -> list[int]:
    """A numpy series as a list of ints (JSON)."""
    return [int(x) for x in a]


def _by_step(tl: RankTimeline, gpu: npt.NDArray[np.bool_], w: _Window) -> EvidenceParts:
    """Kernels a step and the compute kernels whose time varies most between steps."""
    kern = np.flatnonzero(gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM]))
    kern = kern[_inside(tl.start_ns[kern], w.s, w.e)]
    if not kern.size or w.s.size < 2:
        return {}
    step_of = np.searchsorted(w.s, tl.start_ns[kern], side="right") - 1
    count = np.bincount(step_of, minlength=w.s.size)
    comp = tl.kind[kern] == Kind.COMPUTE
    names, inv = unique_inverse(tl.name[kern[comp]])
    dur = (tl.end_ns[kern[comp]] - tl.start_ns[kern[comp]]).astype(np.float64)
    table = np.zeros((names.size, w.s.size))
    np.add.at(table, (inv, step_of[comp]), dur)
    spread = table.max(axis=1) - table.min(axis=1) if names.size else np.zeros(0)
    top = [j for j in np.argsort(-spread)[:_KERNELS_BY_STEP].tolist() if spread[j] > 0]
    return {
        "kernels_by_step": KernelsByStep(
            steps=_ints(w.numbers),
            count=_ints(count),
            ns={tl.names[int(names[j])]: _ints(table[j]) for j in top},
        )
    }


@dataclass(frozen=True)
class _Window:
    """The analysed steps: starts, ends and numbers."""

    s: npt.NDArray[np.int64]
    e: npt.NDArray[np.int64]
    numbers: npt.NDArray[np.int32]


def _host_api(
    tl: RankTimeline, host: npt.NDArray[np.bool_], w: _Window, sets: RankSets
) -> dict[str, HostApiEntry]:
    """Each class of runtime calls on the training thread inside the steps (docstring above)."""
    rt = np.flatnonzero(host & (tl.kind == Kind.RUNTIME))
    if not rt.size:
        return {}
    cls_of = _per_event(tl.names, tl.name[rt], _class_of)
    api: dict[str, HostApiEntry] = {}
    gpu_working = iv.join(sets.compute, sets.comm)
    for k, cls in enumerate(API_CLASSES):
        idx = rt[cls_of == k]
        calls = iv.union(tl.start_ns[idx], tl.end_ns[idx])
        whole = iv.measure(calls, w.s, w.e)
        # blame follows the GPU: the time a call blocks while the GPU computes or
        # communicates is the GPU's time; only the rest is the host's
        per = iv.measure(iv.subtract(calls, gpu_working), w.s, w.e)
        idx = idx[_inside(tl.start_ns[idx], w.s, w.e)]
        if not idx.size or not whole.sum():
            continue
        dur = tl.end_ns[idx] - tl.start_ns[idx]
        names, totals = np.unique(tl.name[idx], return_inverse=True)
        by_name = np.bincount(totals, weights=dur.astype(np.float64))
        longest = int(np.argmax(dur))
        k_step = int(np.searchsorted(w.s, tl.start_ns[idx[longest]], side="right") - 1)
        entry: HostApiEntry = {
            "ns": int(per.sum()),
            "ns_per_step": [int(x) for x in per],
            "gpu_busy_ns": int(whole.sum() - per.sum()),
            "gpu_busy_ns_per_step": [int(x) for x in whole - per],
            "steps": [int(x) for x in w.numbers],
            "calls": int(idx.size),
            "api": tl.names[int(names[int(np.argmax(by_name))])],
            "apis": [tl.names[int(names[j])] for j in np.argsort(-by_name)[:2].tolist()],
            "longest_ns": int(dur[longest]),
            "longest_step": int(w.numbers[k_step]) if k_step >= 0 else None,
        }
        op = _enclosing_op(tl, host, int(idx[longest]))
        if op:
            entry["longest_op"] = op
        if cls in ("sync", "copy"):
            entry["waits_for"] = _waits_for(calls, sets)
        if cls == "copy":
            entry["bytes_median"] = _bytes_median(tl, tl.start_ns[idx])
        api[cls] = entry
    return api


def _bytes_median(tl: RankTimeline, launches: npt.NDArray[np.int64]) -> int:
    """The median size of the GPU copies these calls launched (-1 when none tells)."""
    gpu = tl.gpu_lane_mask()[tl.lane]
    mine = gpu & (tl.kind == Kind.MEMCPY) & (tl.nbytes >= 0) & np.isin(tl.launch_ns, launches)
    return int(np.median(tl.nbytes[mine])) if mine.any() else -1


def _kernels(tl: RankTimeline, gpu: npt.NDArray[np.bool_], w: _Window) -> EvidenceParts:
    """Kernels a step, their median duration, the half-precision share of compute time."""
    kern = np.flatnonzero(gpu & np.isin(tl.kind, [Kind.COMPUTE, Kind.COMM]))
    kern = kern[_inside(tl.start_ns[kern], w.s, w.e)]
    if not kern.size:
        return {}
    dur = tl.end_ns[kern] - tl.start_ns[kern]
    out: EvidenceParts = {
        "kernels_per_step": round(kern.size / w.s.size, 1),
        "kernel_ns_median": int(nputil.median(dur)),
    }
    comp = kern[tl.kind[kern] == Kind.COMPUTE]
    cdur = (tl.end_ns[comp] - tl.start_ns[comp]).astype(np.float64)
    if cdur.sum() > 0:
        low = _per_event(tl.names, tl.name[comp], _found(LOW_PRECISION_KERNEL)).astype(bool)
        out["low_precision_share"] = round(float(cdur[low].sum() / cdur.sum()), 4)
    return out


def _copies(
    tl: RankTimeline, gpu: npt.NDArray[np.bool_], w: _Window, sets: RankSets
) -> EvidenceParts:
    """GPU copy time, from pageable memory, and host-device copies with nothing beside them."""
    out: EvidenceParts = {}
    cp = np.flatnonzero(gpu & (tl.kind == Kind.MEMCPY))
    if not cp.size:
        return out
    hd = cp[_per_event(tl.names, tl.name[cp], _found(HOST_DEVICE_COPY)).astype(bool)]
    alone = iv.subtract(
        iv.union(tl.start_ns[hd], tl.end_ns[hd]),
        iv.join(iv.join(sets.compute, sets.comm), sets.data),
    )
    per_alone = iv.measure(alone, w.s, w.e)
    if per_alone.sum():
        out["copies_alone"] = CopiesAlone(steps=_ints(w.numbers), ns_per_step=_ints(per_alone))
    page = cp[_per_event(tl.names, tl.name[cp], _found(PAGEABLE_COPY)).astype(bool)]
    out["copy_ns"] = int(iv.measure(iv.union(tl.start_ns[cp], tl.end_ns[cp]), w.s, w.e).sum())
    pdur = iv.measure(iv.union(tl.start_ns[page], tl.end_ns[page]), w.s, w.e)
    out["pageable_copy_ns"] = int(pdur.sum())
    return out


def _enclosing_op(tl: RankTimeline, host: npt.NDArray[np.bool_], i: int) -> str:
    """The innermost operator on the call's thread that contains call ``i`` (``aten::copy_``)."""
    around = (tl.start_ns <= tl.start_ns[i]) & (tl.end_ns >= tl.end_ns[i])
    ops = np.flatnonzero(host & (tl.kind == Kind.CPU_OP) & (tl.lane == tl.lane[i]) & around)
    if not ops.size:
        return ""
    j = ops[int(np.argmin(tl.end_ns[ops] - tl.start_ns[ops]))]
    return tl.names[int(tl.name[j])]


@functools.lru_cache(maxsize=1 << 15)
def _class_of(name: str) -> int:
    """The index of the name's class in :data:`API_CLASSES`, else -1."""
    return next((k for k, pat in enumerate(API_CLASSES.values()) if pat.search(name)), -1)


def _per_event(
    names: Sequence[str], name_ids: npt.NDArray[Any], judge: Callable[[str], Any]
) -> npt.NDArray[np.int64]:
    """``judge`` of each event's name, each distinct name judged once."""
    if not name_ids.size:
        return np.zeros(0, np.int64)
    distinct, inverse = unique_inverse(name_ids)
    return np.array([judge(names[i]) for i in distinct.tolist()], np.int64)[inverse]


@functools.cache
def _found(pat: re.Pattern[str]) -> Callable[[str], int]:
    """1 where the pattern occurs in the name, else 0.

    Ranks of one job share their names: each name is searched once per process (a long
    kernel name takes ~25 us a search).
    """

    @functools.lru_cache(maxsize=1 << 15)
    def found(name: str) -> int:
        return int(pat.search(name) is not None)

    return found


def _inside(t: npt.NDArray[np.int64], s: npt.NDArray[np.int64], e: npt.NDArray[np.int64]) -> Any:
    """Which times lie inside one of the (sorted, disjoint) windows [s, e)."""
    k = np.searchsorted(s, t, side="right") - 1
    return (k >= 0) & (t < e[np.maximum(k, 0)])


def _waits_for(calls: iv.IntervalSet, sets: RankSets) -> dict[str, float]:
    """Shares of the synchronising calls' time with compute, a collective, a copy, nothing."""
    total = iv.total(calls)
    if not total:
        return {}
    comp = iv.intersect(calls, sets.compute)
    comm = iv.subtract(iv.intersect(calls, sets.comm), sets.compute)
    copy = iv.subtract(iv.intersect(calls, sets.copy), iv.join(sets.compute, sets.comm))
    c, m, p = iv.total(comp), iv.total(comm), iv.total(copy)
    return {
        "compute": round(c / total, 4),
        "communication": round(m / total, 4),
        "copy": round(p / total, 4),
        "nothing": round(max(0, total - c - m - p) / total, 4),
    }
