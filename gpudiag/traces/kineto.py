"""Kineto JSON(.gz) → Intervals for one rank, with a versioned table of known categories and args.

Decoding is the expensive part of reading a trace, so the file is decoded once by msgspec
into typed structs holding only the fields gpudiag uses (unknown keys are skipped in C),
then turned into numpy columns with C-level iteration (``map``/``attrgetter``,
``pandas.factorize``); no per-event Python code runs. Format eras are described in
``docs/formats.md`` and in the shared Kineto reference.
"""

from __future__ import annotations

import gzip
import re
import zlib
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

try:  # isal's gzip is ~2x faster than zlib's; optional.
    from isal import igzip as _gzip_impl
except ImportError:  # pragma: no cover - depends on the environment
    _gzip_impl = gzip  # type: ignore[misc, unused-ignore]


class _Args(msgspec.Struct, frozen=True, gc=False):
    correlation: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    external_id_legacy: int = msgspec.field(default=-1, name="external id")
    device: int | str = -1
    stream: int | str = -1
    nbytes: int | str = msgspec.field(default=-1, name="bytes")
    coll_name: str = msgspec.field(default="", name="Collective name")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    dtype: str = ""
    group_size: int = msgspec.field(default=-1, name="Group size")
    seq: int | str = msgspec.field(default=-1, name="Seq")
    name: str = ""  # metadata events: thread_name / process_name
    labels: str = ""  # metadata events: process_labels


_NO_ARGS = _Args()


class _Event(msgspec.Struct, frozen=True, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _NO_ARGS


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: int | None = None
    schemaVersion: int | None = None


_DECODER = msgspec.json.Decoder(_Trace)

# Category (lower-cased) → kind. Legacy (2021) capitalised names lower-case to the same keys.
# ``None`` means "known, dropped". Anything else is counted in meta.skipped_events.
CATEGORY_KINDS: dict[str, Kind | None] = {
    "kernel": Kind.COMPUTE,  # split into COMPUTE / COMM by name below
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "cuda_runtime": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
    "cuda_sync": Kind.RUNTIME,
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "gpu_user_annotation": None,  # projections of host ranges onto streams: not GPU work
    "python_function": None,
    "python": None,
    "trace": None,
    "overhead": None,
    "cpu_instant_event": None,
}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset"}

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)
_STREAM_NUM = re.compile(r"(\d+)")
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "half": 2, "float16": 2, "bfloat16": 2,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "byte": 1, "char": 1, "bool": 1,
    "int8": 1, "uint8": 1, "short": 2, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip


def rank_from_filename(path: Path) -> int | None:
    """The rank number in a file name (``rank-3``, ``rank3``, ``worker_3``), if any."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes, gunzipped when needed; InputError on unreadable or truncated files."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from e
    if not raw.strip():
        raise InputError(path, "empty file", "was the profiler stopped before it wrote the trace?")
    if raw[:2] == b"\x1f\x8b":
        try:
            return bytes(_gzip_impl.decompress(raw))  # type: ignore[no-untyped-call, unused-ignore]
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(
                path,
                f"truncated or corrupt gzip ({e})",
                "the file was probably cut off while being written or copied; copy it again",
            ) from e
    return raw


def decode(path: Path, data: bytes) -> _Trace:
    """Decode the needed fields of a Kineto trace; InputError on anything that is not one."""
    try:
        trace = _DECODER.decode(data)
    except msgspec.ValidationError as e:
        raise InputError(
            path,
            f"JSON does not look like a PyTorch Profiler trace ({e})",
            "expected the output of torch.profiler export_chrome_trace / tensorboard_trace_handler",
        ) from e
    except msgspec.DecodeError as e:
        head = data.lstrip()[:1]
        if head not in (b"{", b"["):
            raise InputError(
                path,
                "not JSON",
                "gpudiag analyze reads Kineto .json/.json.gz traces, run "
                "directories, and Nsight .sqlite/.nsys-rep reports",
            ) from e
        raise InputError(
            path, f"malformed or truncated JSON ({e})",
            "the trace was probably cut off while being written; re-capture or copy it again",
        ) from e  # fmt: skip
    if trace.traceEvents is None:
        raise InputError(
            path,
            "JSON without `traceEvents`",
            "this is not a Chrome/Kineto trace; give the *.pt.trace.json(.gz) files",
        )
    return trace


def _to_ns(ts_us: np.ndarray[Any, Any], base_ns: int) -> np.ndarray[Any, Any]:
    """µs floats → integer ns without losing precision on 16-digit epoch-µs values."""
    if ts_us.size == 0:
        return ts_us.astype(np.int64)
    origin = np.floor(ts_us.min())
    rel: np.ndarray[Any, Any] = np.rint((ts_us - origin) * 1000.0).astype(np.int64)
    out: np.ndarray[Any, Any] = rel + np.int64(int(origin) * 1000 + base_ns)
    return out


def _lane_ids(
    pid: list[Any], tid: list[Any], is_gpu: np.ndarray[Any, Any], stream: list[Any]
) -> tuple[np.ndarray[Any, Any], list[str]]:
    """Factorise (pid, tid) pairs into lanes named ``cpu:<tid>`` / ``gpu:<dev>:<stream>``."""
    keys = (
        pd.Series([f"{p}\x00{t}" for p, t in zip(pid, tid, strict=True)], dtype=object)
        if pid
        else pd.Series([], dtype=object)
    )
    codes, uniques = pd.factorize(keys)
    first = np.full(len(uniques), -1, dtype=np.int64)
    if len(codes):
        # first event of each lane decides whether it is a GPU lane and its stream label
        order = np.arange(len(codes))[::-1]
        first[codes[order]] = order
    names: list[str] = []
    for i, key in enumerate(uniques):
        p, t = str(key).split("\x00", 1)
        j = int(first[i])
        if j >= 0 and is_gpu[j]:
            s = stream[j]
            if s in (-1, "", None):
                s = t
            m = _STREAM_NUM.search(str(s))
            dev = _STREAM_NUM.search(p)
            names.append(f"gpu:{dev.group(1) if dev else p}:{m.group(1) if m else s}")
        else:
            names.append(f"cpu:{t}")
    # Two raw lanes can map to one name (legacy "stream 7" vs 7): merge them.
    uniq_names, lane_of_code = np.unique(np.asarray(names, dtype=object), return_inverse=True)
    return lane_of_code[codes].astype(np.int32), [str(n) for n in uniq_names]


def load_kineto(
    path: Path,
    *,
    rank: int | None = None,
    thresholds: Thresholds | None = None,
) -> RankTimeline:
    """Load one Kineto trace file into a RankTimeline.

    ``rank`` overrides what the file says (used when the caller maps files to ranks).
    """
    th = thresholds or Thresholds()
    path = Path(path)
    trace = decode(path, read_bytes(path))
    events: list[_Event] = trace.traceEvents or []
    meta = RankMeta(source=str(path), fmt="kineto")

    # ---- metadata records (few): thread names, process labels ----
    thread_names: dict[tuple[str, str], list[str]] = {}
    x_events: list[_Event] = []
    for_ph = list(map(attrgetter("ph"), events))
    ph_codes, ph_uniques = pd.factorize(pd.Series(for_ph, dtype=object))
    ph_list = list(ph_uniques)
    if "M" in ph_list:
        m_idx = np.flatnonzero(ph_codes == ph_list.index("M"))
        for i in m_idx.tolist():
            e = events[i]
            if e.name == "thread_name":
                thread_names.setdefault((str(e.pid), str(e.tid)), []).append(e.args.name)
    if "X" in ph_list:
        x_idx = np.flatnonzero(ph_codes == ph_list.index("X"))
        x_events = [events[i] for i in x_idx.tolist()] if len(x_idx) != len(events) else events
    del events, for_ph, ph_codes

    # ---- rank, world, devices ----
    dist = trace.distributedInfo or {}
    file_rank = rank_from_filename(path)
    info_rank = dist.get("rank")
    if rank is not None:
        meta.rank_from = "caller"
    elif isinstance(info_rank, int):
        rank, meta.rank_from = info_rank, "distributedInfo"
        if file_rank is not None and file_rank != info_rank:
            meta.notes.append(
                f"file name says rank {file_rank} but distributedInfo says {info_rank}; "
                "using distributedInfo"
            )
    elif file_rank is not None:
        rank, meta.rank_from = file_rank, "file name"
    else:
        rank, meta.rank_from = 0, "default"
    if isinstance(dist.get("world_size"), int):
        meta.world_size = int(dist["world_size"])
    if dist.get("backend"):
        meta.backend = str(dist["backend"])
    meta.devices = [str(d.get("name", "")) for d in (trace.deviceProperties or [])]
    if not dist:
        meta.notes.append("no distributedInfo in the trace (torch.distributed not initialised?)")

    n = len(x_events)
    if n == 0:
        raise InputError(
            path, "the trace holds no events", "was the profiler's active window empty?"
        )

    # ---- columns ----
    cats = pd.Series(list(map(attrgetter("cat"), x_events)), dtype=object)
    cat_codes, cat_uniques = pd.factorize(cats.str.lower() if n else cats)
    kind_of_cat = np.full(len(cat_uniques) + 1, -1, dtype=np.int8)
    gpu_cat = np.zeros(len(cat_uniques) + 1, dtype=bool)
    unknown_cats: list[str] = []
    for i, c in enumerate(cat_uniques):
        k = CATEGORY_KINDS.get(str(c), -1)
        if k is None:
            continue
        if k == -1:
            unknown_cats.append(str(c))
            continue
        kind_of_cat[i] = int(k)
        gpu_cat[i] = str(c) in GPU_CATEGORIES
    kind = kind_of_cat[cat_codes]
    keep = kind >= 0
    meta.skipped_events = int(np.count_nonzero(np.isin(cat_codes, [
        i for i, c in enumerate(cat_uniques) if str(c) in unknown_cats
    ])))  # fmt: skip
    if unknown_cats:
        meta.notes.append(f"skipped {meta.skipped_events} events of unknown categories "
                          f"{sorted(unknown_cats)[:5]}")  # fmt: skip

    idx = np.flatnonzero(keep)
    ev = [x_events[i] for i in idx.tolist()] if len(idx) != n else x_events
    kind = kind[idx]
    is_gpu = gpu_cat[cat_codes[idx]]
    del x_events, cats, cat_codes

    ts = np.fromiter(map(attrgetter("ts"), ev), dtype=np.float64, count=len(ev))
    dur = np.fromiter(map(attrgetter("dur"), ev), dtype=np.float64, count=len(ev))
    base = int(trace.baseTimeNanoseconds or 0)
    start = _to_ns(ts, base)
    end = start + np.rint(np.maximum(dur, 0.0) * 1000.0).astype(np.int64)
    del ts, dur

    names_codes, names_uniq = pd.factorize(
        pd.Series(list(map(attrgetter("name"), ev)), dtype=object)
    )
    names = [str(x) for x in names_uniq]
    name_idx = names_codes.astype(np.int32)

    args = list(map(attrgetter("args"), ev))
    corr = np.fromiter(map(attrgetter("correlation"), args), dtype=np.int64, count=len(ev))
    streams = list(map(attrgetter("stream"), args))
    lane, lanes = _lane_ids(
        list(map(attrgetter("pid"), ev)), list(map(attrgetter("tid"), ev)), is_gpu, streams
    )
    del streams

    # ---- kinds refined by name ----
    comm_k = re.compile(th.comm_kernel_re)
    comm_h = re.compile(th.comm_host_re)
    data_r = re.compile(th.data_re)
    step_r = re.compile(th.step_re)
    name_is_comm_kernel = np.fromiter((bool(comm_k.search(s)) for s in names), bool, len(names))
    name_is_comm_host = np.fromiter((bool(comm_h.search(s)) for s in names), bool, len(names))
    name_is_data = np.fromiter((bool(data_r.search(s)) for s in names), bool, len(names))
    name_is_step = np.fromiter((bool(step_r.search(s)) for s in names), bool, len(names))
    kernel = kind == Kind.COMPUTE
    kind[kernel & name_is_comm_kernel[name_idx]] = Kind.COMM
    host_range = (kind == Kind.CPU_OP) | (kind == Kind.ANNOTATION)
    kind[host_range & name_is_comm_host[name_idx]] = Kind.COMM
    kind[host_range & name_is_data[name_idx]] = Kind.DATALOADER
    kind[host_range & name_is_step[name_idx]] = Kind.STEP

    # ---- bytes for copies and collectives ----
    nbytes = np.full(len(ev), -1, dtype=np.int64)
    copy_or_comm = np.flatnonzero(
        (kind == Kind.MEMCPY) | (kind == Kind.MEMSET) | (kind == Kind.COMM)
    )
    for i in copy_or_comm.tolist():  # copies and collectives only: hundreds, not the event count
        a = args[i]
        if a.coll_name and a.coll_name != "wait":
            nel = a.out_nelems if a.coll_name.lstrip("_").startswith("allgather") else a.in_nelems
            size = _DTYPE_BYTES.get(a.dtype.lower(), 0)
            if nel >= 0 and size:
                nbytes[i] = nel * size
        elif isinstance(a.nbytes, int) and a.nbytes >= 0:
            nbytes[i] = a.nbytes
    del args

    # ---- launch time of GPU work through the correlation id of its runtime call ----
    launch = np.full(len(ev), -1, dtype=np.int64)
    gpu_idx = np.flatnonzero(is_gpu & (corr >= 0))
    rt_idx = np.flatnonzero((kind == Kind.RUNTIME) & ~is_gpu & (corr >= 0))
    if len(gpu_idx) and len(rt_idx):
        rc = corr[rt_idx]
        order = np.argsort(rc, kind="stable")
        rc_sorted = rc[order]
        pos = np.searchsorted(rc_sorted, corr[gpu_idx])
        pos_c = np.minimum(pos, len(rc_sorted) - 1)
        hit = rc_sorted[pos_c] == corr[gpu_idx]
        launch[gpu_idx[hit]] = start[rt_idx[order[pos_c[hit]]]]
    meta.has_gpu = bool(np.any(is_gpu))
    if (
        meta.has_gpu
        and len(gpu_idx)
        and np.count_nonzero(launch[is_gpu] >= 0) < 0.5 * np.count_nonzero(is_gpu)
    ):
        meta.notes.append("most GPU ops have no launching runtime call in the trace; "
                          "steps are assigned by time instead")  # fmt: skip

    # ---- the training thread ----
    meta.main_lane = _main_lane(lanes, lane, kind, thread_names, ev)
    meta.era = _era(trace, ev)
    tl = RankTimeline.from_columns(
        rank,
        start_ns=start,
        end_ns=end,
        kind=kind,
        lane=lane,
        name=name_idx,
        lanes=lanes,
        names=names,
        launch_ns=launch,
        nbytes=nbytes,
        meta=meta,
    )
    meta.extra["thread_names"] = {
        f"cpu:{t}": sorted(set(v)) for (p, t), v in thread_names.items() if f"cpu:{t}" in lanes
    }
    return tl


def _main_lane(
    lanes: list[str],
    lane: np.ndarray[Any, Any],
    kind: np.ndarray[Any, Any],
    thread_names: dict[tuple[str, str], list[str]],
    ev: list[_Event],
) -> int:
    """The training thread: the one with step ranges, else tid == pid, else the busiest."""
    steps = np.flatnonzero(kind == Kind.STEP)
    if len(steps):
        return int(np.bincount(lane[steps]).argmax())
    for p, t in thread_names:
        if p == t and f"cpu:{t}" in lanes:
            return lanes.index(f"cpu:{t}")
    cpu = np.flatnonzero(np.isin(kind, [Kind.CPU_OP, Kind.ANNOTATION, Kind.DATALOADER]))
    if len(cpu):
        return int(np.bincount(lane[cpu], minlength=len(lanes)).argmax())
    return -1


def _era(trace: _Trace, ev: list[_Event]) -> str:
    """A label for the layout generation, reported so users know which rules applied."""
    if trace.baseTimeNanoseconds is not None:
        return "kineto-2024+"
    if ev and ev[0].cat[:1].isupper():
        return "kineto-2021"
    return "kineto-2022"
