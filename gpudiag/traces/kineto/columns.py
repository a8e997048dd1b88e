"""Decoded events → numpy columns, slice by slice, with a named record of the per-event arrays.

Each slice of events is reduced at once with C-level iteration (``map``/``attrgetter`` and
dict interning) to compact arrays; no per-event Python code runs, except over the few
events that need it (metadata, first events of lanes, copies and collectives).
"""

import copy
import math
import re
import zlib
from collections import Counter
from collections.abc import Iterable
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from gpudiag._support.nputil import unique, unique_index
from gpudiag.config import SHAPED_OP_RE
from gpudiag.traces.core.common import TIME_MAX_NS, TIME_MIN_NS, NamePatterns, refine_kinds
from gpudiag.traces.kineto.events import SKIPPED_PHASES, Args
from gpudiag.traces.schema import Kind

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
Mask = npt.NDArray[np.bool_]
SHAPED_OP = re.compile(SHAPED_OP_RE)

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
# Python functions: with --step-marker only the ranges it matches are kept (as steps); else
# every one is kept as a candidate iteration range (build_rank keeps only the chosen ones)
PYTHON_CATEGORIES = {"python_function", "python"}

_STREAM_NUM = re.compile(r"(\d+)")
_NBYTES_MAX = 2**62
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "int": 4,
    "int32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "short": 2,
    "int16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# Kineto writes µs; these bound ts and dur before scaling (base_ns is checked on its own).
TS_MAX_US = TIME_MAX_NS / 1000.0
_TS_MIN_US = TIME_MIN_NS / 1000.0
BAD_TIME = (
    "events with invalid timestamps ignored (ts or dur not a finite number, dur < 0, "
    "or beyond ±146 years)"
)
_NO_TIME = "events without ts or dur ignored"
_NO_ID = "events without pid or tid ignored"
_NO_NAME = "events without a name kept, named ''"
_NO_PH = "events without ph ignored"
_ODD_PH = "events of an unknown phase (ph) ignored"


class Interner(dict[Any, int]):
    """Value → dense id in first-seen order; ``map(interner.__getitem__, values)`` runs in C."""

    def __missing__(self, key: Any) -> int:
        v = self[key] = len(self)
        return v


# Every phase of the Chrome trace format, then "" (an event without ph); other values
# are unknown phases. Both are counted.
PH_IDS = Interner({ph: i for i, ph in enumerate(("X", "M", *SKIPPED_PHASES, ""))})
_N_PHASES = len(PH_IDS) - 1
_PH_X, _PH_M, _PH_NONE = PH_IDS["X"], PH_IDS["M"], PH_IDS[""]

GET_PH = attrgetter("ph")
_GET_CAT = attrgetter("cat")
_GET_NAME = attrgetter("name")
_GET_PID = attrgetter("pid")
_GET_TID = attrgetter("tid")
_GET_TS = attrgetter("ts")
_GET_DUR = attrgetter("dur")
_GET_ARGS = attrgetter("args")
_GET_EXT = attrgetter("external_id")
_GET_EXT_LEGACY = attrgetter("external_id_legacy")
_GET_CORR = attrgetter("correlation")


class EventColumns(NamedTuple):
    """The kept ``X`` events of a trace (or of one slice of it): one array per field.

    A record of arrays, not of events: a slice costs one of these, whatever its size.
    """

    ts_us: F64  # start, µs as written (checked finite and in range)
    dur_us: F64
    kind: I8  # Kind, refined by name
    name: I32  # id in Columns.names
    lane_key: I64  # (pid id << 32) | tid id, pid and tid interned as text (Columns.ids)
    corr: I64  # args.correlation, -1 when absent
    nbytes: I64  # bytes of copies and collectives, -1 when unknown
    is_gpu: Mask  # a GPU category (kernel, memcpy, memset)
    coll_id: I64  # an id equal on every rank for one collective, -1 when none
    coll_name: I32  # id in Columns.names of args."Collective name", -1 when none
    coll_dtype: I32  # id in Columns.names of a collective's args."dtype", -1 when none
    shape: I32  # id in Columns.shapes of a modelled operator's inputs, -1 when none

    def where(self, ok: Mask) -> "EventColumns":
        """The events where ``ok``."""
        kept: list[Any] = [c[ok] for c in self]
        return EventColumns(*kept)

    @staticmethod
    def empty(n: int) -> "EventColumns":
        """Uninitialised columns for ``n`` events, of the record's dtypes."""
        return EventColumns(
            ts_us=np.empty(n, np.float64),
            dur_us=np.empty(n, np.float64),
            kind=np.empty(n, np.int8),
            name=np.empty(n, np.int32),
            lane_key=np.empty(n, np.int64),
            corr=np.empty(n, np.int64),
            nbytes=np.empty(n, np.int64),
            is_gpu=np.empty(n, np.bool_),
            coll_id=np.empty(n, np.int64),
            coll_name=np.empty(n, np.int32),
            coll_dtype=np.empty(n, np.int32),
            shape=np.empty(n, np.int32),
        )


class TimedColumns(NamedTuple):
    """The kept events of a trace with their times in ns and their launch times."""

    start_ns: I64
    end_ns: I64
    kind: I8
    name: I32
    lane_key: I64  # as in EventColumns
    nbytes: I64
    is_gpu: Mask
    coll_id: I64
    coll_name: I32
    coll_dtype: I32
    shape: I32
    launch_ns: I64  # start of the runtime call that launched GPU work, -1 otherwise

    def take(self, idx: Any) -> "TimedColumns":
        """The events at ``idx`` (indices or a mask)."""
        kept: list[Any] = [c[idx] for c in self]
        return TimedColumns(*kept)


def name_str(name: Any) -> str:
    """An interned name as text: an event without a name is named ''."""
    return "" if name is msgspec.UNSET else str(name)


def _take(events: list[Any], idx: npt.NDArray[np.intp]) -> list[Any]:
    return [events[i] for i in idx.tolist()]


class Columns:
    """Accumulates the columns of a trace from successive slices of its event list.

    Each slice is reduced at once to an :class:`EventColumns` (and its structs dropped by
    the caller), so memory holds one slice of structs at a time. Ids are assigned in
    first-seen order over the whole trace, so the result does not depend on how it was
    sliced.
    """

    def __init__(self, patterns: NamePatterns) -> None:
        self.patterns = patterns
        self.cats = Interner()
        self.kind_of_cat = np.zeros(0, np.int8)  # per cat id; -1 unknown, -2 known & dropped
        self.gpu_cat = np.zeros(0, bool)
        self.python_cat = np.zeros(0, bool)
        self.names = Interner()
        self.python_name = np.zeros(0, bool)  # per name id: a Python function's name
        self.name_flags = np.zeros((0, 4), bool)  # comm kernel, comm host, data, step
        self.name_shaped = np.zeros(0, bool)  # an operator whose inputs are kept (SHAPED_OP)
        self.shapes = Interner()  # dims, types, concrete, strides (raw JSON lines) → id
        self._raw_shapes: dict[bytes, int] = {}  # the same four raw JSON values → that id
        self.ids = Interner()  # str(pid) / str(tid) → id
        self.raw_ids = Interner()  # raw pid/tid value (int or str) → raw id
        self.raw_to_id = np.zeros(0, np.int64)
        self.lanes: dict[int, str] = {}  # lane key → lane name, from the lane's first event
        self.thread_names: dict[tuple[str, str], list[str]] = {}
        self.process_names: dict[str, list[str]] = {}  # str(pid) → process_name / labels
        self.lane_rank: dict[int, int] = {}  # lane key → args.rank of its first event
        self.lane_pid_raw: dict[int, str] = {}  # lane key → args.pid_raw (merged files)
        self.unknown_cats: set[str] = set()
        self.skipped = 0
        self.dropped: Counter[str] = Counter()  # reason → events dropped (notes)
        self.first_cat: str | None = None
        self._parts: list[EventColumns] = []
        self._ext_ids: list[I64] = []  # External ids of host operators (sampling holes)

    def _grow(self) -> None:
        """Extend the per-id lookup tables to ids seen for the first time."""
        for c in list(self.cats)[len(self.kind_of_cat) :]:
            k = CATEGORY_KINDS.get(str(c).lower(), -1)
            if k == -1:
                self.unknown_cats.add(str(c).lower())
            kk = -2 if k is None else int(k)
            self.kind_of_cat = np.append(self.kind_of_cat, np.int8(kk))
            self.gpu_cat = np.append(self.gpu_cat, str(c).lower() in GPU_CATEGORIES)
            self.python_cat = np.append(self.python_cat, str(c).lower() in PYTHON_CATEGORIES)
        new = list(self.names)[len(self.name_flags) :]
        if new:
            texts = [name_str(s) for s in new]
            flags = self.patterns.flags(texts)
            self.name_flags = np.concatenate([self.name_flags, flags])
            shaped = np.fromiter((bool(SHAPED_OP.match(t)) for t in texts), bool, len(texts))
            self.name_shaped = np.concatenate([self.name_shaped, shaped])
            self.python_name = np.concatenate([self.python_name, np.zeros(len(new), bool)])
        raw_new = list(self.raw_ids)[len(self.raw_to_id) :]
        if raw_new:
            ext = np.fromiter((self.ids[str(v)] for v in raw_new), np.int64, len(raw_new))
            self.raw_to_id = np.concatenate([self.raw_to_id, ext])

    def add(self, events: list[Any], phs: Iterable[str]) -> None:
        """Reduce one slice of events (with an iterator over their ``ph``) to columns."""
        events = self._complete_events(events, phs)
        if not events:
            return
        n = len(events)
        cat = np.fromiter(map(self.cats.__getitem__, map(_GET_CAT, events)), np.int64, n)
        self._grow()
        kind = self.kind_of_cat[cat]
        python = np.zeros(n, bool)
        if self.patterns.explicit_step:
            kind, python = self._python_steps(events, kind, cat)
        else:  # candidate iteration ranges (RawColumns.python_names)
            python = (kind == -2) & self.python_cat[cat]
            if python.any():
                kind = np.where(python, np.int8(Kind.ANNOTATION), kind)
        self.skipped += int(np.count_nonzero(kind == -1))
        known = np.flatnonzero(kind >= 0)
        if len(known) != n:
            events, kind, cat = _take(events, known), kind[known], cat[known]
            python = python[known]
            if not events:
                return
        if self.first_cat is None:
            self.first_cat = events[0].cat
        self._add_known(events, kind, self.gpu_cat[cat], python)

    def _python_steps(self, events: list[Any], kind: I8, cat: I64) -> tuple[I8, Mask]:
        """Python-function events an explicit ``--step-marker`` matches, kept as ranges.

        The others are kept as Python frames (the mask), never as candidate steps: the
        step marker makes the matched ones steps.
        """
        python = (kind == -2) & self.python_cat[cat]
        py = np.flatnonzero(python)
        if not py.size:
            return kind, python
        ids = np.fromiter(
            map(self.names.__getitem__, map(_GET_NAME, _take(events, py))), np.int64, py.size
        )
        self._grow()
        hit = self.name_flags[ids, NamePatterns.STEP]
        kind = np.where(python, np.int8(Kind.ANNOTATION), kind)
        python[py[hit]] = False
        return kind, python

    def _complete_events(self, events: list[Any], phs: Iterable[str]) -> list[Any]:
        """The slice's ``X`` events; names read from its ``M`` events, odd phases counted."""
        if not events:
            return events
        n = len(events)
        ph = np.fromiter(map(PH_IDS.__getitem__, phs), np.int64, n)
        if ph.max() >= _N_PHASES:
            self.dropped[_NO_PH] += int(np.count_nonzero(ph == _PH_NONE))
            self.dropped[_ODD_PH] += int(np.count_nonzero(ph > _PH_NONE))
        for i in np.flatnonzero(ph == _PH_M).tolist():
            e = events[i]
            if e.name == "thread_name" and msgspec.UNSET not in (e.pid, e.tid):
                self.thread_names.setdefault((str(e.pid), str(e.tid)), []).append(e.args.name)
            elif e.name in ("process_name", "process_labels"):
                label = e.args.name or e.args.labels
                self.process_names.setdefault(str(e.pid), []).append(label)
        x = np.flatnonzero(ph == _PH_X)
        return events if len(x) == n else _take(events, x)

    def _add_known(self, events: list[Any], kind: I8, is_gpu: Mask, python: Mask) -> None:
        """The columns of ``X`` events of known categories; untimed or unplaced ones dropped.

        ``python``: the Python-function events, kept as plain ranges whatever their name.
        """
        n = len(events)
        ts = np.fromiter(map(_GET_TS, events), np.float64, n)
        dur = np.fromiter(map(_GET_DUR, events), np.float64, n)
        name = np.fromiter(map(self.names.__getitem__, map(_GET_NAME, events)), np.int64, n)
        pid = np.fromiter(map(self.raw_ids.__getitem__, map(_GET_PID, events)), np.int64, n)
        tid = np.fromiter(map(self.raw_ids.__getitem__, map(_GET_TID, events)), np.int64, n)
        self._grow()
        ok = self._usable(ts, dur, pid, tid)
        if ok is not None:
            keep = np.flatnonzero(ok)
            events = _take(events, keep)
            ts, dur, name, pid, tid = ts[keep], dur[keep], name[keep], pid[keep], tid[keep]
            kind, is_gpu, python = kind[keep], is_gpu[keep], python[keep]
            if not events:
                return
        unnamed = self.names.get(msgspec.UNSET)
        if unnamed is not None:
            self.dropped[_NO_NAME] += int(np.count_nonzero(name == unnamed))
        key = (self.raw_to_id[pid] << 32) | self.raw_to_id[tid]
        self._name_lanes(events, key, is_gpu)
        # kinds refined by name (here, per slice: copies and collectives need their args)
        kind = refine_kinds(kind.astype(np.int64), self.name_flags[name]).astype(np.int8)
        if python.any():
            kind[python] = Kind.ANNOTATION
            self.python_name[name[python]] = True
        args = list(map(_GET_ARGS, events))
        nbytes, coll_id, coll_name, coll_dtype = self._sizes(args, kind)
        _host_collective_sizes(events, args, kind, is_gpu, nbytes)
        self._host_ids(args, kind, is_gpu)
        shape = self._shapes(args, name, is_gpu)
        corr = np.fromiter(map(_GET_CORR, args), np.int64, len(args))
        self._parts.append(
            EventColumns(
                ts_us=ts,
                dur_us=dur,
                kind=kind,
                name=name.astype(np.int32),
                lane_key=key,
                corr=corr,
                nbytes=nbytes,
                is_gpu=is_gpu,
                coll_id=coll_id,
                coll_name=coll_name,
                coll_dtype=coll_dtype,
                shape=shape,
            )
        )

    def _usable(self, ts: F64, dur: F64, pid: I64, tid: I64) -> Mask | None:
        """``None`` when every event has a usable time and lane, else the mask of those that do.

        The others are counted by reason. The checks are on whole columns; the comparisons
        are false for NaN, so ``~ok`` catches NaN and ±inf too.
        """
        ok = (ts >= _TS_MIN_US) & (ts <= TS_MAX_US) & (dur >= 0.0) & (dur <= TS_MAX_US)
        unset = self.raw_ids.get(msgspec.UNSET)
        if unset is not None:
            ok &= (pid != unset) & (tid != unset)
        if ok.all():
            return None
        missing = np.isnan(ts) | np.isnan(dur)
        no_id = ~missing & ((pid == unset) | (tid == unset))
        self.dropped[_NO_TIME] += int(np.count_nonzero(missing))
        self.dropped[_NO_ID] += int(np.count_nonzero(no_id))
        self.dropped[BAD_TIME] += int(np.count_nonzero(~ok & ~missing & ~no_id))
        return ok

    def _name_lanes(self, events: list[Any], key: I64, is_gpu: Mask) -> None:
        """Name each lane (a ``(str(pid), str(tid))`` pair) after its first event."""
        ukeys, first = unique_index(key)
        for k, j in zip(ukeys.tolist(), first.tolist(), strict=True):
            if k not in self.lanes:
                e = events[j]
                a = e.args
                raw_pid = str(a.pid_raw) if a.pid_raw not in (-1, "") else str(e.pid)
                self.lanes[k] = _lane_name(raw_pid, str(e.tid), bool(is_gpu[j]), a.stream)
                if isinstance(a.rank, int) and a.rank >= 0:
                    self.lane_rank[k] = a.rank
                if a.pid_raw not in (-1, ""):
                    self.lane_pid_raw[k] = str(a.pid_raw)

    def _shapes(self, args: list[Args], name: I64, is_gpu: Mask) -> I32:
        """The id of each modelled host operator's recorded inputs, -1 for every other event."""
        shape = np.full(len(args), -1, dtype=np.int32)
        seen = self._raw_shapes
        for i in np.flatnonzero(self.name_shaped[name] & ~is_gpu).tolist():
            a = args[i]
            if len(a.input_dims):
                # a step repeats its operators' inputs: the raw bytes find them again
                raw = b"\0".join((a.input_dims, a.input_type, a.concrete, a.input_strides))
                known = seen.get(raw)
                if known is not None:
                    shape[i] = known
                    continue
                text = bytes(a.input_dims).decode("utf-8", "replace")
                types = (
                    bytes(a.input_type).decode("utf-8", "replace") if len(a.input_type) else "[]"
                )
                conc = bytes(a.concrete).decode("utf-8", "replace") if len(a.concrete) else ""
                strides = (
                    bytes(a.input_strides).decode("utf-8", "replace")
                    if len(a.input_strides)
                    else ""
                )
                # one line each: the loader keeps the JSON as written, newlines removed
                text, types, conc, strides = (
                    t.replace("\n", " ") for t in (text, types, conc, strides)
                )
                shape[i] = seen[raw] = self.shapes[f"{text}\n{types}\n{conc}\n{strides}"]
        return shape

    def _sizes(self, args: list[Args], kind: I8) -> tuple[I64, I64, I32, I32]:
        """``nbytes``, ``coll_id``, ``coll_name`` and ``coll_dtype`` (-1: none) of a slice.

        Only copies and collectives have them: hundreds of events, not the event count.
        """
        n = len(args)
        nbytes = np.full(n, -1, dtype=np.int64)
        coll_id = np.full(n, -1, dtype=np.int64)
        coll_name = np.full(n, -1, dtype=np.int32)
        coll_dtype = np.full(n, -1, dtype=np.int32)
        sized = (kind == Kind.MEMCPY) | (kind == Kind.MEMSET) | (kind == Kind.COMM)
        for i in np.flatnonzero(sized).tolist():
            a = args[i]
            nbytes[i] = _nbytes(a)
            if a.coll_name:
                coll_name[i] = self.names[a.coll_name]
                coll_id[i] = _coll_key(a)
                if a.dtype:
                    coll_dtype[i] = self.names[a.dtype]
        return nbytes, coll_id, coll_name, coll_dtype

    def _host_ids(self, args: list[Args], kind: I8, is_gpu: Mask) -> None:
        """Keep the External ids of host operators: holes in them mean a sampled trace."""
        ops = np.flatnonzero(((kind == Kind.CPU_OP) | (kind == Kind.COMM)) & ~is_gpu)
        if ops.size:
            sel = list(map(args.__getitem__, ops.tolist()))
            ext = np.fromiter(map(_GET_EXT, sel), np.int64, ops.size)
            legacy = np.fromiter(map(_GET_EXT_LEGACY, sel), np.int64, ops.size)
            self._ext_ids.append(np.maximum(ext, legacy))

    def coverage(self) -> dict[str, int]:
        """Host-operator External ids present, their span and the holes between them."""
        ids = unique(np.concatenate(self._ext_ids)) if self._ext_ids else np.zeros(0, np.int64)
        ids = ids[ids >= 0]
        if ids.size < 2:
            return {}
        holes = int(np.count_nonzero(np.diff(ids) > 1))
        return {
            "host_op_ids": int(ids.size),
            "host_op_id_span": int(ids[-1] - ids[0] + 1),
            "host_op_id_holes": holes,
        }

    def columns(self) -> EventColumns:
        """Every slice's columns joined; each slice is freed once copied (peak memory)."""
        n = sum(len(p.ts_us) for p in self._parts)
        out = EventColumns.empty(n)
        targets: tuple[npt.NDArray[Any], ...] = out
        self._parts.reverse()
        at = 0
        while self._parts:
            part = self._parts.pop()
            m = len(part.ts_us)
            for dst, src in zip(targets, part, strict=True):
                dst[at : at + m] = src
            at += m
        return out

    def for_lanes(self, lanes: dict[int, str]) -> "Columns":
        """What one rank of a merged file sees: its own lanes, the shared names and ids."""
        sub = copy.copy(self)
        sub.lanes, sub.skipped, sub.unknown_cats, sub._parts = lanes, 0, set(), []
        return sub


def _coll_key(a: Args) -> int:
    """An id equal on every rank for one collective: ``Comms Id``, else (group, ``Seq``)."""
    if isinstance(a.comms_id, int) and a.comms_id >= 0:
        return a.comms_id & ((1 << 62) - 1)
    if a.seq not in (-1, ""):
        return zlib.crc32(f"{a.pg_name}\0{a.coll_name}\0{a.seq}".encode()) | (1 << 62)
    return -1


def _nbytes(a: Args) -> int:
    """Bytes moved by a copy or collective, -1 when unknown (or beyond int64: damaged)."""
    if a.coll_name and a.coll_name != "wait":
        nel = a.out_nelems if a.coll_name.lstrip("_").startswith("allgather") else a.in_nelems
        size = _DTYPE_BYTES.get(a.dtype.lower(), 0)
        return nel * size if 0 <= nel <= _NBYTES_MAX // 8 and size else -1
    if isinstance(a.nbytes, int) and a.nbytes >= 0:
        return a.nbytes
    return -1


def _host_collective_sizes(
    events: list[Any], args: list[Args], kind: I8, is_gpu: Mask, nbytes: I64
) -> None:
    """Fill the unknown sizes of host collectives from their recorded inputs, in place."""
    for i in np.flatnonzero((kind == Kind.COMM) & ~is_gpu & (nbytes < 0)).tolist():
        if len(args[i].input_dims):
            nbytes[i] = _input_bytes(args[i], str(events[i].name))


_TYPE_WORDS = {
    "long int": "long",
    "short int": "short",
    "unsigned char": "uint8",
    "signed char": "int8",
    "long long": "long",
}


def _input_bytes(a: Args, name: str) -> int:
    """Bytes of a host collective from its inputs (``Input Dims`` × ``Input type``), else -1.

    gloo's ranges (``gloo:all_reduce``) carry no collective args, only the recorded shapes of
    their inputs: the flat bucket ``[[1059850]]`` and ``["float"]``. An all-gather's input is
    one rank's part, not the gathered total its bandwidth needs: left unknown.
    """
    if "gather" in name.lower():
        return -1
    try:
        dims, types = msgspec.json.decode(a.input_dims), msgspec.json.decode(a.input_type)
    except (msgspec.DecodeError, ValueError):
        return -1
    if not isinstance(dims, list) or not isinstance(types, list):
        return -1
    total = 0
    for shape, tp in zip(dims, types, strict=False):
        if not isinstance(shape, list) or not shape or not isinstance(tp, str):
            continue
        word = tp.lower().removeprefix("c10::").strip()
        size = _DTYPE_BYTES.get(_TYPE_WORDS.get(word, word), 0)
        if not size or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape
        ):
            continue
        total += math.prod(shape) * size
    return total if 0 < total <= _NBYTES_MAX else -1


def _lane_name(p: str, t: str, gpu: bool, s: int | str) -> str:
    """``cpu:<tid>`` or ``gpu:<dev>:<stream>`` for a lane, from its first event."""
    if not gpu:
        return f"cpu:{t}"
    if s in (-1, ""):
        s = t
    m = _STREAM_NUM.search(str(s))
    dev = _STREAM_NUM.search(p)
    return f"gpu:{dev.group(1) if dev else p}:{m.group(1) if m else s}"
