"""A second, deliberately simple implementation of gpudiag's step definitions, to check the product.

It follows docs/definitions.md ("Steps", "The four parts of a step") with plain Python —
``json``, ``gzip``, ``sqlite3``, lists and loops; no numpy and no gpudiag import — so that
an error in the product's vectorised set arithmetic, its loaders or its step logic shows
up as a disagreement. It covers what the accuracy tests compare: per-step period, compute,
communication wait, data wait and GPU idle, for Kineto traces stepped by ``ProfilerStep#N``
and for Nsight exports stepped by a named NVTX range; and, read straight from the raw
events, HTA's GPU idle on HTA's window, sampling holes in host-operator ids, MPI time and
GPU/CPU clock offsets.

Communication is classified here on its own (:func:`is_comm_kernel`, written from the
libraries' naming, not from gpudiag's patterns): NCCL/RCCL/MSCCL and NVSHMEM kernels by
prefix, NVLS/multimem and one-/two-shot all-reduce kernels, DeepEP's dispatch/combine/
notify kernels in its ``deep_ep::intranode``/``internode`` namespaces.
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import math
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

DATA_RANGE = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#|^## data_load ##$")


@dataclass
class Op:
    """One GPU op: kind is "compute", "comm" or "copy"."""

    start: int
    end: int
    kind: str
    launch: int | None  # host time of its launching call, None when unknown


@dataclass
class RefStep:
    """One step as the reference computes it."""

    step: int
    start: int
    duration: int
    compute: int
    comm_wait: int
    data_wait: int
    gpu_ops: int
    gpu_idle: int = 0  # no GPU op of any kind


def is_comm_kernel(name: str) -> bool:
    """A communication kernel, by the naming of the libraries that launch them."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    if n.startswith(("nccl", "rccl", "msccl", "nvshmem")):
        return True
    if "multimem_" in n and any(
        c in n for c in ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter")
    ):
        return True
    if "one_shot_all_reduce" in n or "two_shot_all_reduce" in n or "cross_device_reduce_" in n:
        return True
    for space in ("deep_ep::intranode", "deep_ep::internode"):
        if space in n:
            rest = n[n.index(space) + len(space) :]
            func = rest.split("::", 1)[1] if "::" in rest else ""
            func = func.split("<")[0].split("(")[0]
            if func in ("dispatch", "combine", "clean_low_latency_buffer") or "notify" in func:
                return True
    return False


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort and merge overlapping intervals."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merged intervals ``a`` less merged intervals ``b`` (one sweep over both, in order)."""
    out = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        cur = s
        k = j
        while k < len(b) and b[k][0] < e:
            bs, be = b[k]
            if be > cur:
                if bs > cur:
                    out.append((cur, bs))
                cur = be
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def inside(merged: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of merged intervals within [lo, hi): from the last one starting before ``lo``."""
    k = max(bisect.bisect_left(merged, (lo,)) - 1, 0)
    total = 0
    while k < len(merged) and merged[k][0] < hi:
        s, e = merged[k]
        total += max(0, min(e, hi) - max(s, lo))
        k += 1
    return total


def steps_of(
    host: list[tuple[int, int, int]],
    ops: list[Op],
    data: list[tuple[int, int]],
    truncate: bool,
) -> list[RefStep]:
    """Periods, ownership and parts for host steps (number, start, end) and GPU ops."""
    host = sorted(host, key=lambda h: h[1])
    n = len(host)
    bounds = [host[i + 1][1] for i in range(n - 1)] + [host[-1][2]]
    linked = [o for o in ops if o.launch is not None]
    first_linked = min((o.start for o in linked), default=None)
    use_backlog = len(ops) > 0 and len(linked) >= 0.5 * len(ops)
    owned: list[list[Op]] = [[] for _ in range(n)]
    last_pre = None
    for o in ops:
        key = o.launch if o.launch is not None else o.start
        if use_backlog and o.launch is None and first_linked is not None and o.start < first_linked:
            last_pre = o.end if last_pre is None else max(last_pre, o.end)
            continue
        i = max((j for j in range(n) if host[j][1] <= key), default=None)
        if i is None:
            last_pre = o.end if last_pre is None else max(last_pre, o.end)
        elif key < bounds[i]:
            owned[i].append(o)
    starts: list[int] = []
    prev_end = last_pre
    for i in range(n):
        first = min((o.start for o in owned[i]), default=math.inf)
        before = prev_end if prev_end is not None else -math.inf
        s = max(host[i][1], min(first, before))
        s = int(max(s, starts[-1]) if starts else s)
        starts.append(s)
        prev_end = max((o.end for o in owned[i]), default=None)
    ends = [*starts[1:], max([host[-1][2], starts[-1], *(o.end for o in owned[-1])])]
    compute = merge([(o.start, o.end) for o in ops if o.kind == "compute"])
    comm = minus(merge([(o.start, o.end) for o in ops if o.kind == "comm"]), compute)
    busy = merge([(o.start, o.end) for o in ops])
    data_idle = minus(merge(data), busy)
    out = [
        RefStep(
            host[i][0],
            starts[i],
            ends[i] - starts[i],
            inside(compute, starts[i], ends[i]),
            inside(comm, starts[i], ends[i]),
            inside(data_idle, starts[i], ends[i]),
            len(owned[i]),
            ends[i] - starts[i] - inside(busy, starts[i], ends[i]),
        )
        for i in range(n)
    ]
    if truncate and len(out) > 1 and out[-1].gpu_ops < 0.5 * out[-2].gpu_ops:
        out.pop()
    return out


# ---- Kineto ----------------------------------------------------------------------------


def kineto(path: Path) -> list[RefStep]:
    """Steps of a Kineto trace with ProfilerStep#N ranges (one rank)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    origin = math.floor(min(e["ts"] for e in events if "ts" in e))
    base = int(doc.get("baseTimeNanoseconds") or 0)

    def ns(ts: float) -> int:
        return round((ts - origin) * 1000) + origin * 1000 + base

    runtime: dict[int, int] = {}
    ops: list[Op] = []
    steps: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    data: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for e in events:
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        start = ns(e["ts"])
        end = start + round(max(e.get("dur", 0), 0) * 1000)
        if cat in ("cuda_runtime", "runtime", "cuda_driver", "cuda_sync"):
            corr = args.get("correlation")
            if isinstance(corr, int) and corr >= 0:
                runtime.setdefault(corr, start)
        elif cat in ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset"):
            kind = (
                "copy"
                if cat != "kernel"
                else ("comm" if is_comm_kernel(e.get("name", "")) else "compute")
            )
            ops.append(Op(start, end, kind, args.get("correlation")))
        elif cat in ("cpu_op", "user_annotation", "operator"):
            m = re.match(r"^ProfilerStep#(\d+)$", e.get("name", ""))
            key = (str(e.get("pid")), str(e.get("tid")))
            if m:
                steps.setdefault(key, []).append((int(m.group(1)), start, end))
            elif DATA_RANGE.search(e.get("name", "")):
                data.setdefault(key, []).append((start, end))
    for o in ops:
        corr = o.launch
        o.launch = runtime.get(corr) if isinstance(corr, int) else None
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep ranges")
    main = max(steps, key=lambda k: len(steps[k]))
    host = sorted(steps[main], key=lambda h: h[1])
    seen: set[int] = set()
    host = [h for h in host if not (h[0] in seen or seen.add(h[0]))]  # type: ignore[func-returns-value]
    return steps_of(host, ops, data.get(main, []), truncate=bool(ops))


# ---- Nsight Systems ----------------------------------------------------------------------


def nsys(path: Path, step_range: str) -> list[RefStep]:
    """Steps of a one-process Nsight export from an NVTX range family (``Batch %``).

    ``step_range`` is an SQL LIKE pattern. The gaps between consecutive step ranges in
    which the training thread launches no GPU work count as data (docs/definitions.md),
    as do ``enumerate(DataLoader)`` ranges on that thread.
    """
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    text = "COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId))"
    rows = con.execute(
        f'SELECT n.start, n."end", {text}, n.globalTid FROM NVTX_EVENTS n '
        f"WHERE n.eventType IN (59, 60) AND {text} LIKE ? ORDER BY n.start",
        (step_range,),
    ).fetchall()
    if not rows:
        raise ValueError(f"{path}: no NVTX range like {step_range!r}")
    tid = max({r[3] for r in rows}, key=lambda t: sum(1 for r in rows if r[3] == t))
    host = [(i, s, e) for i, (s, e, _, t) in enumerate(r for r in rows if r[3] == tid)]
    launches = {
        c: s
        for c, s, g in con.execute(
            "SELECT correlationId, start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"
        )
    }
    main_launch = {
        s
        for _, s, g in con.execute(
            "SELECT correlationId, start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"
        )
        if g == tid
    }
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    ops = []
    for s, e, nm, corr in con.execute(
        'SELECT start, "end", shortName, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL'
    ):
        kind = "comm" if is_comm_kernel(names.get(nm, "")) else "compute"
        ops.append(Op(s, e, kind, launches.get(corr)))
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        for s, e, corr in con.execute(f'SELECT start, "end", correlationId FROM {table}'):
            ops.append(Op(s, e, "copy", launches.get(corr)))
    data = [
        (s, e)
        for s, e, nm, t in con.execute(
            f'SELECT n.start, n."end", {text}, n.globalTid FROM NVTX_EVENTS n '
            "WHERE n.eventType IN (59, 60)"
        )
        if t == tid and nm and DATA_RANGE.search(nm)
    ]
    steps = sorted(host, key=lambda h: h[1])
    for (_, _, e0), (_, s1, _) in itertools.pairwise(steps):
        if s1 > e0 and not any(o.launch in main_launch and e0 <= o.launch < s1 for o in ops):
            data.append((e0, s1))
    return steps_of(steps, ops, data, truncate=False)


# ---- Raw readings: GPU idle as HTA reads it, sampling, MPI time, clocks -----------------


def _kineto_events(path: Path) -> tuple[list[dict], int]:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"], int(
        doc.get("baseTimeNanoseconds") or 0
    )


GPU_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset")
RUNTIME_CATS = ("cuda_runtime", "runtime", "cuda_driver")


def hta_gpu_idle(path: Path) -> tuple[int, float, float]:
    """GPU idle on HTA's window: (window ns, HTA's idle ratio, idle ratio of every GPU op).

    HTA drops the last ``ProfilerStep``: it keeps the GPU ops whose launching call starts
    before the last step's start, and its window runs from the first to the last of them.
    Its idle is the window less the union of those ops. The second ratio counts every GPU
    op in the same window, also those the last step launched that run inside it.
    """
    events, _ = _kineto_events(path)
    steps = sorted(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    launch: dict[int, float] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if str(e.get("cat", "")).lower() in RUNTIME_CATS and isinstance(corr, int):
            launch.setdefault(corr, e["ts"])
    ops = []
    for e in events:
        if str(e.get("cat", "")).lower() in GPU_CATS:
            s = round(e["ts"] * 1000)
            ops.append(
                (
                    s,
                    s + round(e.get("dur", 0) * 1000),
                    launch.get((e.get("args") or {}).get("correlation")),
                )
            )
    last = steps[-1]
    kept = [(s, e) for s, e, at in ops if at is not None and at < last]
    lo, hi = min(s for s, _ in kept), max(e for _, e in kept)
    every = merge([(max(s, lo), min(e, hi)) for s, e, _ in ops if e > lo and s < hi])
    window = hi - lo
    return window, 1 - inside(merge(kept), lo, hi) / window, 1 - inside(every, lo, hi) / window


def host_id_holes(path: Path) -> tuple[int, int, int]:
    """Host operators' External ids: (ids present, their span, holes between them)."""
    events, _ = _kineto_events(path)
    ids = set()
    for e in events:
        if str(e.get("cat", "")).lower() in ("cpu_op", "operator"):
            args = e.get("args") or {}
            x = args.get("External id", args.get("external id"))
            if isinstance(x, int) and x >= 0:
                ids.add(x)
    xs = sorted(ids)
    if len(xs) < 2:
        return len(xs), len(xs), 0
    holes = sum(1 for a, b in itertools.pairwise(xs) if b - a > 1)
    return len(xs), xs[-1] - xs[0] + 1, holes


def comm_kernel_time(path: Path) -> int:
    """Union of the communication kernels' time in a Kineto trace (ns)."""
    events, _ = _kineto_events(path)
    spans = []
    for e in events:
        if str(e.get("cat", "")).lower() == "kernel" and is_comm_kernel(e.get("name", "")):
            s = round(e["ts"] * 1000)
            spans.append((s, s + round(e.get("dur", 0) * 1000)))
    return inside(merge(spans), -(2**62), 2**62)


MPI_SETUP = (
    "MPI_Init",
    "MPI_Init_thread",
    "MPI_Initialized",
    "MPI_Finalize",
    "MPI_Finalized",
    "MPI_Wtime",
    "MPI_Wtick",
    "MPI_Comm_rank",
    "MPI_Comm_size",
    "MPI_Abort",
)


def mpi_time(path: Path, lo: int, hi: int) -> int:
    """Union of MPI call time in [lo, hi) of an Nsight export (ns).

    MPI calls: NVTX ranges named ``MPI`` or ``MPI_*``, and the rows of Nsight's MPI trace
    tables, less MPI's set-up and query calls.
    """
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    spans = []
    if "NVTX_EVENTS" in tables:
        for s, e, text, tid in con.execute(
            'SELECT start, "end", text, textId FROM NVTX_EVENTS WHERE eventType IN (59, 60)'
        ):
            nm = text if text is not None else names.get(tid, "")
            if nm == "MPI" or (nm.startswith("MPI_") and nm not in MPI_SETUP):
                spans.append((s, e))
    for t in (
        "MPI_P2P_EVENTS",
        "MPI_COLLECTIVES_EVENTS",
        "MPI_START_WAIT_EVENTS",
        "MPI_OTHER_EVENTS",
    ):
        if t in tables:
            for s, e, tid in con.execute(f'SELECT start, "end", textId FROM {t}'):
                if names.get(tid, "") not in MPI_SETUP:
                    spans.append((s, e))
    con.close()
    return inside(merge(spans), lo, hi)


def clock_bounds(path: Path) -> dict[int, tuple[int, int | None]]:
    """Per device of an Nsight export: bounds on the GPU clock's offset from the host's.

    (min over GPU ops of start − launch call start, max over ops of blocking ``cudaMemcpy``
    calls of end − call end or None): with no offset the first is a few µs and the second
    below zero.
    """
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    calls = {
        c: (s, e, names.get(n, ""))
        for s, e, c, n in con.execute(
            'SELECT start, "end", correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME'
        )
    }
    out: dict[int, tuple[int, int | None]] = {}
    for table in (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
    ):
        for s, e, dev, corr in con.execute(
            f'SELECT start, "end", deviceId, correlationId FROM {table}'
        ):
            if corr not in calls:
                continue
            cs, ce, nm = calls[corr]
            up, low = out.get(dev, (s - cs, None))
            up = min(up, s - cs)
            if nm.split("_v")[0] == "cudaMemcpy":
                low = e - ce if low is None else max(low, e - ce)
            out[dev] = (up, low)
    con.close()
    return out


# ---- host-side calls (issue 20) --------------------------------------------------------

# Runtime/driver calls by class, written from docs/definitions.md ("Host-side causes"), not
# from gpudiag's tables: which call blocks the training thread for what.
HOST_CALLS = {
    "sync": re.compile(
        r"^(cuda|hip)(Stream|Device|Event)Synchronize$|^cu(Stream|Ctx|Event)Synchronize$"
    ),
    "allocator": re.compile(
        r"^(cuda|hip)(Malloc|Free)(Host|Async|Managed)?$|^(cuda|hip)Host(Alloc|Malloc|Free)$|^cuMem(Alloc|Free)"
    ),
    "copy": re.compile(r"^(cuda|hip|cu)Memcpy"),
    "jit": re.compile(r"^(nvrtc|hiprtc)|^cuModuleLoad|^cuLink|^hipModuleLoad"),
    "launch": re.compile(r"^(cuda|hip|cu)(LaunchKernel|ExtModuleLaunchKernel|ModuleLaunchKernel)"),
    "graph": re.compile(r"^(cuda|hip|cu)GraphLaunch$"),
}


def host_calls(path: Path) -> dict[int, dict[str, int]]:
    """Per ProfilerStep of the training thread: ns of each call class inside the step range.

    The training thread is the one with the ProfilerStep ranges; calls are clipped to the
    range (they do not nest, so their durations add).
    """
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    calls: list[tuple[tuple[str, str], str, float, float]] = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        key = (str(e.get("pid")), str(e.get("tid")))
        start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        m = re.match(r"^ProfilerStep#(\d+)$", e.get("name", ""))
        if m and cat in ("cpu_op", "user_annotation", "operator"):
            steps.setdefault(key, []).append((int(m.group(1)), start, end))
        elif cat in ("cuda_runtime", "runtime", "cuda_driver"):
            for cls, rx in HOST_CALLS.items():
                if rx.search(e.get("name", "")):
                    calls.append((key, cls, start, end))
                    break
    main = max(steps, key=lambda k: len(steps[k]))
    out: dict[int, dict[str, int]] = {}
    for n, s, e in steps[main]:
        per = out.setdefault(n, {})
        for key, cls, cs, ce in calls:
            if key == main and ce > s and cs < e:
                per[cls] = per.get(cls, 0) + round((min(ce, e) - max(cs, s)) * 1000)
    return out


# ---- Python frames: where the host's GPU-idle time between operators goes ---------------

AUTOGRAD_THREAD = re.compile(r"autograd|backward", re.IGNORECASE)


def python_self_idle(
    path: Path, periods: dict[int, tuple[int, int]] | None = None
) -> dict[int, dict[str, tuple[int, int]]]:
    """Per ProfilerStep: each Python function's self time with the GPU idle and no operator.

    Written from docs/definitions.md ("Host-side causes"): the time counted is inside the
    step (:func:`kineto`'s periods), with no operator (``cpu_op``) open on the training
    thread or an autograd thread (named so, or running ``autograd::engine::evaluate_function``),
    no kernel running and no data wait; each instant of it goes to the innermost
    ``python_function`` open on the training thread — the open one that started last, the
    shorter of two that started together. ``{step: {name: (ns, calls starting in the step)}}``
    with the key ``""`` for the whole of it (frame or none). Plain loops: one sweep over the
    frames' bounds, one over the time left. ``periods`` (step → start, end) stands in for
    :func:`kineto`'s steps on a trace without ProfilerStep ranges (one whole-window step).
    """
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    names = {
        (str(e.get("pid")), str(e.get("tid"))): str((e.get("args") or {}).get("name", ""))
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    origin = math.floor(min(e["ts"] for e in events))
    base = int(doc.get("baseTimeNanoseconds") or 0)

    def span(e: dict) -> tuple[int, int]:
        start = round((e["ts"] - origin) * 1000) + origin * 1000 + base
        return start, start + round(max(e.get("dur", 0), 0) * 1000)

    if periods is None:
        periods = {s.step: (s.start, s.start + s.duration) for s in kineto(path)}
    main = _step_thread(events)
    threads = {main} | {k for k, n in names.items() if AUTOGRAD_THREAD.search(n)}
    for e in events:
        if str(e.get("cat", "")).lower() == "cpu_op" and str(e.get("name", "")).startswith(
            "autograd::engine::evaluate_function"
        ):
            threads.add((str(e.get("pid")), str(e.get("tid"))))
    busy: list[tuple[int, int]] = []
    frames: list[tuple[int, int, str]] = []
    data: list[tuple[int, int]] = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        key = (str(e.get("pid")), str(e.get("tid")))
        name = str(e.get("name", ""))
        if cat == "kernel":
            busy.append(span(e))
        elif cat in ("cpu_op", "operator") and key in threads:
            (data if DATA_RANGE.search(name) and key == main else busy).append(span(e))
        elif cat == "python_function" and key == main:
            frames.append((*span(e), name))
    gpu = merge([span(e) for e in events if str(e.get("cat", "")).lower() in GPU_CATS])
    busy = merge(busy + minus(merge(data), gpu))
    idle = minus(merge(list(periods.values())), busy)
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for n, (lo, hi) in periods.items():
        per = out.setdefault(n, {"": (inside(idle, lo, hi), 0)})
        for fs, _, name in frames:
            if lo <= fs < hi:
                ns, calls = per.get(name, (0, 0))
                per[name] = (ns, calls + 1)
    for a, b, name in _innermost_pieces(frames):
        for n, (lo, hi) in periods.items():
            t = inside(idle, max(a, lo), min(b, hi)) if a < hi and b > lo else 0
            if t:
                ns, calls = out[n].get(name, (0, 0))
                out[n][name] = (ns + t, calls)
    return out


def _step_thread(events: list[dict]) -> tuple[str, str]:
    """The thread with the most ProfilerStep ranges, else with the most operators."""
    counts: dict[tuple[str, str], int] = {}
    for pattern in (r"^ProfilerStep#\d+$", ""):
        for e in events:
            cat = str(e.get("cat", "")).lower()
            if (pattern and re.match(pattern, str(e.get("name", "")))) or (
                not pattern and cat == "cpu_op"
            ):
                key = (str(e.get("pid")), str(e.get("tid")))
                counts[key] = counts.get(key, 0) + 1
        if counts:
            break
    return max(counts, key=lambda k: counts[k])


def _innermost_pieces(frames: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Between consecutive frame bounds, the open frame that started last (shorter first).

    Of two frames with the same bounds, the one later in the trace.
    """
    bounds = sorted({t for f in frames for t in f[:2]})
    order = sorted(frames, key=lambda f: (f[0], -f[1]))
    pieces: list[tuple[int, int, str]] = []
    open_: list[tuple[int, int, str]] = []
    k = 0
    for a, b in itertools.pairwise(bounds):
        while k < len(order) and order[k][0] <= a:
            open_.append(order[k])
            k += 1
        open_ = [f for f in open_ if f[1] > a]
        if open_:
            # the latest start, then the earliest end, then the later in the trace
            top = max(reversed(open_), key=lambda f: (f[0], -f[1]))
            if pieces and pieces[-1][2] == top[2] and pieces[-1][1] == a:
                pieces[-1] = (pieces[-1][0], b, top[2])
            else:
                pieces.append((a, b, top[2]))
    return pieces
