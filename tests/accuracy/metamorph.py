"""Transformations of raw Kineto traces with a known effect (the metamorphic suite's library).

Each transformation works on the parsed JSON of every rank file of a set — never on what
gpudiag made of it — and says whether it applies to the set (``None``: not applicable,
with the reason). What the effect must be is decided here from the raw events, so the
truth comes from outside gpudiag; :mod:`test_metamorphic` checks gpudiag's answer.
"""

from __future__ import annotations

import copy
import gzip
import itertools
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Doc = dict[str, Any]
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
FLOW_PH = {"s", "f", "t"}
# Host ranges that are collective / point-to-point operators (read here, independently of
# gpudiag's own patterns): the c10d dispatcher ops, the backends' op ranges, the
# profiler's comms record.
COMM_OP = re.compile(r"^(c10d::|nccl:|rccl:|gloo:|record_param_comms$)")
SHORT_US = 10.0
# Signs, left in a CPU-only view, that the job ran on a GPU (read here on the raw names):
# operators that exist only on a GPU backend, NCCL operations.
GPU_ONLY = re.compile(
    r"^aten::_?(cudnn|miopen)_|^aten::_(flash|efficient)_attention_|^(Cudnn|Miopen)\w*Backward|"
    r"^triton_(poi|red|per|tem)_|_lazy_init$|^nccl:"
)


@dataclass
class Transform:
    """One transformation: its name, what it does to the docs, and the relation to check."""

    name: str
    apply: Callable[[list[Doc]], list[Doc] | str]  # the new docs, or why it does not apply
    expect: str  # "same" | "same_shares" | "filtered" | "withheld" | "no_straggler" | ...
    doc: str


def read_set(path: Path) -> tuple[list[str], list[Doc]]:
    """The file names and parsed documents of a set's rank files."""
    names = sorted(p.name for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    docs = []
    for n in names:
        op = gzip.open if n.endswith(".gz") else open
        with op(path / n, "rt") as fh:
            docs.append(json.load(fh))
    return names, docs


def window(docs: list[Doc], max_events: int = 3_000) -> list[Doc]:
    """A big set cut to its first host events (by time), with the GPU work they launched.

    Host events starting before the cut stay; a GPU event stays when its launch call does
    (same ``args.correlation``), or, unlinked, when it starts before the cut. Small sets
    are kept whole. The cut is the same time on every rank (one host clock).
    """
    timed = sorted(e["ts"] for d in docs for e in _events(d) if _timed(e) and not _is_gpu(e))
    per_rank = max_events * len(docs)
    if len(timed) <= per_rank:
        return docs
    cut = timed[per_rank]
    out = []
    for d in docs:
        ev = _events(d)
        host = [
            e
            for e in ev
            if not _is_gpu(e)
            and (not _timed(e) or e["ts"] < cut)
            and not (e.get("ph") in FLOW_PH and e.get("ts", 0) >= cut)
        ]
        corr = {
            (e.get("args") or {}).get("correlation")
            for e in host
            if e.get("cat") in ("cuda_runtime", "cuda_driver")
        }
        corr.discard(None)
        gpu = []
        for e in ev:
            if _is_gpu(e):
                c = (e.get("args") or {}).get("correlation")
                if (c in corr) if c is not None and c != -1 else e.get("ts", cut) < cut:
                    gpu.append(e)
        out.append(_with_events(d, host + gpu))
    return out


def write_set(out: Path, names: list[str], docs: list[Doc]) -> Path:
    """Each document as plain JSON (``rank-0.json.gz`` → ``rank-0.json``: quicker to write)."""
    out.mkdir(parents=True, exist_ok=True)
    for n, d in zip(names, docs, strict=True):
        (out / n.removesuffix(".gz")).write_text(json.dumps(d))
    return out


def _events(d: Doc) -> list[dict[str, Any]]:
    ev = d.get("traceEvents")
    return ev if isinstance(ev, list) else []


def _is_gpu(e: dict[str, Any]) -> bool:
    return e.get("cat") in GPU_CATS


def _timed(e: dict[str, Any], cats: set[str] | None = None) -> bool:
    ok = e.get("ph") == "X" and isinstance(e.get("ts"), int | float)
    return ok and (cats is None or e.get("cat") in cats)


def _with_events(d: Doc, events: list[dict[str, Any]]) -> Doc:
    out = dict(d)
    out["traceEvents"] = events
    return out


# --- independent readings of the raw events ---------------------------------------------


def comm_launched(d: Doc) -> list[dict[str, Any]]:
    """The kernels whose launching runtime call lies inside a collective operator's range.

    Launch link: the runtime call and the kernel share ``args.correlation``; the call lies
    inside a host range on its own thread (same pid and tid) whose name is a collective.
    """
    ev = _events(d)
    runtime = {}
    for e in ev:
        if _timed(e, {"cuda_runtime", "cuda_driver"}):
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                runtime[c] = e
    ranges: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    for e in ev:
        if _timed(e, {"cpu_op", "user_annotation"}) and COMM_OP.search(str(e.get("name", ""))):
            ranges.setdefault((e.get("pid"), e.get("tid")), []).append(
                (e["ts"], e["ts"] + float(e.get("dur") or 0))
            )
    out = []
    for e in ev:
        if not _timed(e, {"kernel"}):
            continue
        call = runtime.get((e.get("args") or {}).get("correlation"))
        if call is None:
            continue
        t = call["ts"]
        if any(a <= t <= b for a, b in ranges.get((call.get("pid"), call.get("tid")), [])):
            out.append(e)
    return out


_SYNC = re.compile(r"^(cuda|hip)(Device|Stream)Synchronize$")
_COPY_CALL = re.compile(r"^(cuda|hip)Memcpy")


def clock_evidence(docs: list[Doc]) -> tuple[float, bool]:
    """(the least launch latency in µs over linked GPU ops, whether a wait bounds the clock).

    A wait bounds it when the trace holds a device synchronisation after some GPU work, or
    a copy call followed on its thread by a stream synchronisation (the copy ends before it
    returns): then a GPU clock running ahead shows.
    """
    least, bound = float("inf"), False
    for d in docs:
        ev = _events(d)
        calls = [e for e in ev if _timed(e, {"cuda_runtime", "cuda_driver"})]
        by_corr = {(e.get("args") or {}).get("correlation"): e for e in calls}
        for e in ev:
            if _timed(e, GPU_WORK):
                c = by_corr.get((e.get("args") or {}).get("correlation"))
                if c is not None:
                    least = min(least, e["ts"] - c["ts"])
        threads: dict[Any, list[dict[str, Any]]] = {}
        for e in calls:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        for seq in threads.values():
            seq.sort(key=lambda e: e["ts"])
            for a, b in itertools.pairwise(seq):
                if (
                    _COPY_CALL.search(a.get("name", ""))
                    and "Stream" in b.get("name", "")
                    and _SYNC.search(b.get("name", ""))
                ):
                    bound = True
            if any(
                "Device" in e.get("name", "") and _SYNC.search(e.get("name", "")) for e in seq[1:]
            ):
                bound = True
    return least, bound


def gpu_work_count(docs: list[Doc]) -> int:
    return sum(1 for d in docs for e in _events(d) if _timed(e, GPU_WORK))


def runtime_launches(docs: list[Doc]) -> int:
    return sum(
        1
        for d in docs
        for e in _events(d)
        if _timed(e, {"cuda_runtime"}) and "aunch" in str(e.get("name", ""))
    )


# --- the transformations -----------------------------------------------------------------


def rename_comm_kernels(docs: list[Doc]) -> list[Doc] | str:
    out, n = [], 0
    for d in docs:
        hit = {id(e) for e in comm_launched(d)}
        n += len(hit)
        ev = []
        for e in _events(d):
            if id(e) in hit:
                e = dict(e, name=f"custom_exchange_kernel_{len(ev) % 3}")
            ev.append(e)
        out.append(_with_events(d, ev))
    return out if n else "no kernel is launched inside a collective operator"


def drop_short_kernels(docs: list[Doc]) -> list[Doc] | str:
    kernels = [e for d in docs for e in _events(d) if _timed(e, {"kernel"})]
    short = [e for e in kernels if float(e.get("dur") or 0) < SHORT_US]
    if not runtime_launches(docs):
        return "no launch calls: a dropped kernel leaves no trace"
    if len(kernels) < 50:
        return f"only {len(kernels)} kernels: too few to tell a filter from chance"
    if len(short) < 0.2 * len(kernels) or len(kernels) - len(short) < 1:
        return f"{len(short)} of {len(kernels)} kernels are short"
    return [
        _with_events(
            d,
            [
                e
                for e in _events(d)
                if not (_timed(e, {"kernel"}) and float(e.get("dur") or 0) < SHORT_US)
            ],
        )
        for d in docs
    ]


def strip_gpu(docs: list[Doc]) -> list[Doc] | str:
    if not gpu_work_count(docs):
        return "no GPU events"
    return [
        _with_events(d, [e for e in _events(d) if not _is_gpu(e) and e.get("ph") not in FLOW_PH])
        for d in docs
    ]


def cpu_only_view(docs: list[Doc]) -> list[Doc] | str:
    """What a CPU-only profiler would have recorded of a GPU job: no GPU, no runtime calls."""
    if not gpu_work_count(docs):
        return "no GPU events"
    drop = GPU_CATS | {"cuda_runtime", "cuda_driver"}
    signs = any(
        GPU_ONLY.search(str(e.get("name", "")))
        or str((d.get("distributedInfo") or {}).get("backend", "")).lower() == "nccl"
        for d in docs
        for e in _events(d)
        if e.get("cat") not in drop
    )
    if not signs:
        return "nothing left in a CPU-only view says the job used a GPU"
    out = []
    for d in docs:
        n = _with_events(
            d, [e for e in _events(d) if e.get("cat") not in drop and e.get("ph") not in FLOW_PH]
        )
        n.pop("deviceProperties", None)
        out.append(n)
    return out


def shift_gpu(delta_us: float) -> Callable[[list[Doc]], list[Doc] | str]:
    def run(docs: list[Doc]) -> list[Doc] | str:
        if not gpu_work_count(docs):
            return "no GPU events"
        out = []
        for d in docs:
            ev = [
                dict(e, ts=e["ts"] + delta_us) if _is_gpu(e) and _timed(e) else e
                for e in _events(d)
            ]
            out.append(_with_events(d, ev))
        return out

    return run


def shuffle_events(docs: list[Doc]) -> list[Doc] | str:
    rng = random.Random(29)
    out = []
    for d in docs:
        ev = list(_events(d))
        rng.shuffle(ev)
        out.append(_with_events(d, ev))
    return out


def renumber_threads(docs: list[Doc]) -> list[Doc] | str:
    """Every host thread id mapped to another number (metadata and flows too)."""
    out = []
    for d in docs:
        host_tids = {
            e.get("tid") for e in _events(d) if isinstance(e.get("tid"), int) and not _is_gpu(e)
        } - {0}
        gpu_tids = {e.get("tid") for e in _events(d) if _is_gpu(e)}
        remap = {t: 900_000 + i for i, t in enumerate(sorted(host_tids - gpu_tids))}
        ev = [
            dict(e, tid=remap[e["tid"]]) if e.get("tid") in remap and not _is_gpu(e) else e
            for e in _events(d)
        ]
        out.append(_with_events(d, ev))
    return out


def drop_flows(docs: list[Doc]) -> list[Doc] | str:
    """Flow arrows removed: the launch links stay in ``args.correlation``."""
    has = any(e.get("ph") in FLOW_PH for d in docs for e in _events(d))
    linked = all(
        (e.get("args") or {}).get("correlation") is not None
        for d in docs
        for e in _events(d)
        if _timed(e, {"kernel"})
    )
    if not has:
        return "no flow events"
    if not linked:
        return "kernels without a correlation id"
    return [_with_events(d, [e for e in _events(d) if e.get("ph") not in FLOW_PH]) for d in docs]


def strip_python(docs: list[Doc]) -> list[Doc] | str:
    if not any(e.get("cat") == "python_function" for d in docs for e in _events(d)):
        return "no python_function events"
    if not any(
        str(e.get("name", "")).startswith("ProfilerStep#") for d in docs for e in _events(d)
    ):
        return "no step markers: a repeating Python function may be its iterations"
    return [
        _with_events(d, [e for e in _events(d) if e.get("cat") != "python_function"]) for d in docs
    ]


def scale_time(k: float) -> Callable[[list[Doc]], list[Doc] | str]:
    """Every time ×k about the trace's first event: every share stays, every duration ×k."""

    def run(docs: list[Doc]) -> list[Doc] | str:
        t0 = min((e["ts"] for d in docs for e in _events(d) if _timed(e)), default=0)
        out = []
        for d in docs:
            ev = []
            for e in _events(d):
                if isinstance(e.get("ts"), int | float):
                    e = dict(e, ts=t0 + (e["ts"] - t0) * k)
                    if isinstance(e.get("dur"), int | float):
                        e["dur"] = e["dur"] * k
                ev.append(e)
            out.append(_with_events(d, ev))
        return out

    return run


# generation → (deviceProperties name, compute capability)
GENERATIONS = {
    "volta": ("Tesla V100-SXM2-32GB", 7, 0),
    "ampere": ("NVIDIA A100-SXM4-80GB", 8, 0),
    "hopper": ("NVIDIA H100 80GB HBM3", 9, 0),
}


def set_generation(gen: str) -> Callable[[list[Doc]], list[Doc] | str]:
    name, major, minor = GENERATIONS[gen]

    def run(docs: list[Doc]) -> list[Doc] | str:
        out = []
        for d in docs:
            props = d.get("deviceProperties")
            if not isinstance(props, list) or not props:
                return "no deviceProperties"
            if any("AMD" in str(p.get("name", "")) for p in props if isinstance(p, dict)):
                return "an AMD GPU: no NVIDIA generation to swap in"
            n = copy.deepcopy(d)
            for p in n["deviceProperties"]:
                p.update(name=name, computeMajor=major, computeMinor=minor)
            out.append(n)
        return out

    return run


def keep_ranks_without_latest(docs: list[Doc]) -> list[Doc] | str:
    """Of a multi-rank set, drop the rank that reaches its collectives last (read raw)."""
    if len(docs) < 2:
        return "one rank"
    late = []
    for d in docs:
        starts = sorted(
            e["ts"]
            for e in _events(d)
            if _timed(e, {"cpu_op", "user_annotation"}) and COMM_OP.search(str(e.get("name", "")))
        )
        late.append(starts[0] if starts else float("-inf"))
    worst = max(range(len(docs)), key=lambda i: late[i])
    return [d for i, d in enumerate(docs) if i != worst]


TRANSFORMS = [
    Transform(
        "rename_comm_kernels",
        rename_comm_kernels,
        "same",
        "kernels launched inside collective operators get a custom name",
    ),
    Transform(
        "drop_short_kernels",
        drop_short_kernels,
        "filtered",
        f"every kernel under {SHORT_US:g} µs dropped: their launch calls stay",
    ),
    Transform("strip_gpu", strip_gpu, "withheld", "every GPU event and flow removed"),
    Transform(
        "cpu_only_view",
        cpu_only_view,
        "withheld",
        "GPU events, runtime calls and deviceProperties removed",
    ),
    Transform("shift_gpu_plus", shift_gpu(+600_000.0), "clock+", "GPU clock +0.6 s"),
    Transform("shift_gpu_minus", shift_gpu(-300_000.0), "clock-", "GPU clock −0.3 s"),
    Transform("shuffle_events", shuffle_events, "same", "event order shuffled"),
    Transform("renumber_threads", renumber_threads, "same", "host thread ids renumbered"),
    Transform("drop_flows", drop_flows, "same", "flow arrows removed (correlation ids kept)"),
    Transform("strip_python", strip_python, "same_shares", "python_function events removed"),
    Transform("scale_time_x2", scale_time(2.0), "scaled", "every time and duration ×2"),
    Transform("gpu_volta", set_generation("volta"), "precision:volta", "GPU → V100 (sm70)"),
    Transform("gpu_hopper", set_generation("hopper"), "precision:hopper", "GPU → H100 (sm90)"),
    Transform(
        "keep_ranks",
        keep_ranks_without_latest,
        "no_straggler",
        "the rank that reaches its collectives last is not traced",
    ),
]
