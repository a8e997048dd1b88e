"""Kineto JSON(.gz) → Intervals for one rank, with a versioned table of known categories and args.

Decoding is the expensive part of reading a trace, so the file is decoded once by msgspec
into typed structs holding only the fields gpudiag uses (unknown keys are skipped in C),
then turned into numpy columns with C-level iteration (``map``/``attrgetter`` and dict
interning); no per-event Python code runs. The file is streamed: each block of gunzipped
text is decoded and reduced to columns before the next one is read. Format eras are
described in ``docs/formats.md`` and in the shared Kineto reference.
"""

from __future__ import annotations

import functools
import gzip
import operator
import re
import zlib
from collections import Counter
from collections.abc import Iterable
from operator import attrgetter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import msgspec
import numpy as np

from gpudiag.errors import InputError
from gpudiag.fileio import open_input
from gpudiag.traces.common import (
    TIME_MAX_NS,
    TIME_MIN_NS,
    LoadOptions,
    NamePatterns,
    RawColumns,
    build_rank,
    check_rank,
    dropped_notes,
    json_words,
    rank_from_filename,
    refine_kinds,
)
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

try:  # isal's gzip is ~2x faster than zlib's; optional.
    from isal import igzip as _gzip_impl
except ImportError:  # pragma: no cover - depends on the environment
    _gzip_impl = gzip  # type: ignore[misc, unused-ignore]


# Integers are checked against int64 in C while decoding (msgspec accepts any size): a value
# outside fails the event's type check, and the slow path drops that one field or event.
_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_NAN = float("nan")  # a missing ts / dur: counted, and the event dropped


class _Args(msgspec.Struct, frozen=True, gc=False):
    correlation: _I64 = -1
    external_id: _I64 = msgspec.field(default=-1, name="External id")
    external_id_legacy: _I64 = msgspec.field(default=-1, name="external id")
    device: _I64 | str = -1
    stream: _I64 | str = -1
    nbytes: _I64 | str = msgspec.field(default=-1, name="bytes")
    coll_name: str = msgspec.field(default="", name="Collective name")
    in_nelems: _I64 = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: _I64 = msgspec.field(default=-1, name="Out msg nelems")
    dtype: str = ""
    group_size: _I64 = msgspec.field(default=-1, name="Group size")
    seq: _I64 | str = msgspec.field(default=-1, name="Seq")
    comms_id: _I64 | str = msgspec.field(default=-1, name="Comms Id")
    pg_name: str = msgspec.field(default="", name="Process Group Name")
    name: str = ""  # metadata events: thread_name / process_name
    labels: str = ""  # metadata events: process_labels
    rank: _I64 | str = -1  # merged multi-rank files (TraceFusion): the event's rank
    pid_raw: _I64 | str = -1  # merged files: the pid before the per-rank offset


_NO_ARGS = _Args()


class _EventFields(msgspec.Struct, frozen=True, gc=False):
    """The fields of an event that gpudiag reads (unknown keys are skipped in C).

    Missing fields get sentinels (UNSET, NaN), never plausible values, so that events
    without a time, a process or a name are counted rather than placed at 0.
    """

    cat: str = ""
    name: str | msgspec.UnsetType = msgspec.UNSET
    pid: _I64 | str | msgspec.UnsetType = msgspec.UNSET
    tid: _I64 | str | msgspec.UnsetType = msgspec.UNSET
    ts: float = _NAN
    dur: float = _NAN
    args: _Args = _NO_ARGS


class _Event(_EventFields, frozen=True, gc=False):
    ph: str = ""


class _XEvent(_EventFields, frozen=True, gc=False, tag_field="ph", tag="X"):
    """An ``X`` (complete) event on the streaming path, where ``ph`` selects the type."""


class _MEvent(_XEvent, frozen=True, gc=False, tag="M"):
    """A metadata event (thread and process names)."""


# Every other Chrome-trace phase decodes to an empty struct: its values are parsed but no
# objects are made for them (flow events alone are a third of a Kineto trace). A phase not
# listed here, or an event without ``ph``, fails the block and the file is decoded whole.
_SKIPPED_PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D",
                   "V", "v", "R", "c", "(", ")")  # fmt: skip
_SKIP_TYPES = tuple(
    msgspec.defstruct(f"_Skip{i}", [], tag_field="ph", tag=ph, frozen=True, gc=False)
    for i, ph in enumerate(_SKIPPED_PHASES)
)
_TYPE_PH: dict[type, str] = {_XEvent: "X", _MEvent: "M"}
_TYPE_PH.update(zip(_SKIP_TYPES, _SKIPPED_PHASES, strict=True))
if TYPE_CHECKING:
    _AnyEvent = _XEvent
else:
    _AnyEvent = functools.reduce(operator.or_, (_XEvent, _MEvent, *_SKIP_TYPES))


class _TraceKeys(msgspec.Struct, dict=True):
    """The top-level keys gpudiag reads besides the event list.

    They are decoded as whatever they hold and checked in :func:`_rank_meta` and
    :func:`_base_ns`, so that a key of the wrong type is named in a note or an error
    instead of failing the whole decode. (``dict=True``: the loader attaches what it
    dropped while decoding to the trace.)
    """

    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    if TYPE_CHECKING:  # not a field: set by the loader (reason → events dropped)
        dropped: Counter[str] = Counter()


class _Trace(_TraceKeys, dict=True):
    traceEvents: list[_Event] | None = None


_DECODER = msgspec.json.Decoder(_Trace)


class _RawTrace(_TraceKeys, dict=True):
    """A trace whose events failed the typed decode: the event list kept as raw JSON."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"null")  # msgspec takes no Raw in a union


_RAW_DECODER = msgspec.json.Decoder(_RawTrace)


class _TailTrace(_TraceKeys, dict=True):
    """The end of a streamed trace: its last events and the keys after the event array."""

    traceEvents: list[_AnyEvent] | None = None


_TAIL_DECODER = msgspec.json.Decoder(_TailTrace)


class _RawTailTrace(_TraceKeys, dict=True):
    """The end of a streamed trace whose events failed the typed decode."""

    traceEvents: list[msgspec.Raw] | None = None


_RAW_TAIL_DECODER = msgspec.json.Decoder(_RawTailTrace)
_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_EVENT_DECODER = msgspec.json.Decoder(_Event)

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

_STREAM_NUM = re.compile(r"(\d+)")
_NBYTES_MAX = 2**62
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "half": 2, "float16": 2, "bfloat16": 2,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "byte": 1, "char": 1, "bool": 1,
    "int8": 1, "uint8": 1, "short": 2, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip


# The whole-file path (odd layouts, malformed files) holds the whole JSON text in memory;
# past this size a trace must be streamable (a gzip bomb stops here, not in the OOM killer).
MAX_WHOLE_FILE_BYTES = 4 << 30
# While streaming, text without an event boundary for this long is refused: no event of a
# real trace comes near it, and a gzip bomb of one endless string stops here.
MAX_EVENT_BYTES = 1 << 30
NOT_A_TRACE_HINT = ("expected the output of torch.profiler export_chrome_trace / "
                    "tensorboard_trace_handler")  # fmt: skip


def _opened(f: IO[bytes]) -> IO[bytes]:
    """The text stream of an open trace file: gunzipped when it starts with the gzip magic."""
    gz = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    return _gzip_impl.open(f, "rb") if gz else f  # type: ignore[no-any-return, unused-ignore]


def _too_large(path: Path) -> InputError:
    return InputError(
        path,
        f"more than {MAX_WHOLE_FILE_BYTES >> 30} GiB of JSON that cannot be read event by event",
        "the file is damaged (or not a PyTorch Profiler trace); re-capture or copy it again",
    )


def _too_deep(path: Path) -> InputError:
    return InputError(
        path,
        "JSON nested deeper than gpudiag reads (hundreds of levels; a trace has about five)",
        "the file is damaged or not a PyTorch Profiler trace",
    )


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes, gunzipped when needed; InputError on unreadable or truncated files.

    Only regular files are read, at most :data:`MAX_WHOLE_FILE_BYTES` of JSON; a file whose
    first character cannot start JSON is refused after its first block.
    """
    chunks: list[bytes] = []
    size = 0
    with open_input(path) as raw:
        try:
            with _opened(raw) as f:
                while block := f.read(1 << 24):
                    if not chunks and block.lstrip()[:1] not in (b"{", b"[", b""):
                        raise _not_json(path)
                    chunks.append(block)
                    size += len(block)
                    if size > MAX_WHOLE_FILE_BYTES:
                        raise _too_large(path)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(
                path,
                f"truncated or corrupt gzip ({e})",
                "the file was probably cut off while being written or copied; copy it again",
            ) from e
    data = b"".join(chunks)
    if not data.strip():
        raise InputError(path, "empty file", "was the profiler stopped before it wrote the trace?")
    return data


def _not_json(path: Path) -> InputError:
    return InputError(
        path,
        "not JSON",
        "gpudiag analyze reads Kineto .json/.json.gz traces, run "
        "directories, and Nsight .sqlite/.nsys-rep reports",
    )


def decode(path: Path, data: bytes) -> _Trace:
    """Decode the needed fields of a Kineto trace; InputError on anything that is not one.

    Events that fail the typed decode (a field of the wrong type, a number out of range)
    are converted one by one (:func:`_lenient_events`): the bad ones are dropped and
    counted in ``trace.dropped``, the rest is used.
    """
    try:
        trace = _DECODER.decode(data)
        trace.dropped = Counter()
    except RecursionError as e:
        raise _too_deep(path) from e
    except msgspec.ValidationError:
        trace = _decode_lenient(path, data)
    except msgspec.DecodeError as e:
        head = data.lstrip()[:1]
        if head not in (b"{", b"["):
            raise _not_json(path) from e
        raise _malformed(path, e) from e
    if trace.traceEvents is None:
        raise InputError(
            path,
            "JSON without `traceEvents`",
            "this is not a Chrome/Kineto trace; give the *.pt.trace.json(.gz) files",
        )
    arrays = sum(1 for _ in zip(range(3), _EVENTS_KEY.finditer(data), strict=False))
    if arrays > 1:
        trace.dropped["`traceEvents` arrays besides the last one (a duplicated key?)"] += arrays - 1
    return trace


def _malformed(path: Path, e: Exception) -> InputError:
    return InputError(
        path, f"malformed or truncated JSON ({e})",
        "the trace was probably cut off while being written; re-capture or copy it again",
    )  # fmt: skip


def _decode_lenient(path: Path, data: bytes) -> _Trace:
    """The slow path for a trace whose events fail the typed decode: event by event."""
    try:
        raw = _RAW_DECODER.decode(data)
    except RecursionError as e:
        raise _too_deep(path) from e
    except msgspec.ValidationError as e:  # the top level itself is not a trace object
        raise InputError(
            path, f"JSON does not look like a PyTorch Profiler trace ({e})", NOT_A_TRACE_HINT
        ) from e
    except msgspec.DecodeError as e:
        raise _malformed(path, e) from e
    trace = _Trace(
        distributedInfo=raw.distributedInfo, deviceProperties=raw.deviceProperties,
        baseTimeNanoseconds=raw.baseTimeNanoseconds, schemaVersion=raw.schemaVersion,
    )  # fmt: skip
    trace.dropped = Counter()
    if bytes(raw.traceEvents) == b"null":
        return trace
    try:
        items = _RAW_LIST_DECODER.decode(raw.traceEvents)
    except RecursionError as e:
        raise _too_deep(path) from e
    except msgspec.DecodeError as e:
        raise InputError(
            path,
            "JSON does not look like a PyTorch Profiler trace (`traceEvents` is not a list)",
            NOT_A_TRACE_HINT,
        ) from e
    trace.traceEvents = _lenient_events(path, items, trace.dropped)
    return trace


# "Expected `int`, got `str` - at `$.args.External id`" → ".args.External id"
_ERROR_AT = re.compile(r" - at `\$(?:\[\d+\])?\.?([^`]*)`$")
_MAX_FIXES = 8


def _lenient_events(path: Path, items: list[msgspec.Raw], dropped: Counter[str]) -> list[_Event]:
    """Events decoded one by one; what could not be read is counted in ``dropped``.

    A bad ``args`` field is left out of its event; any other bad field drops the event.
    """
    out: list[_Event] = []
    for item in items:
        try:
            out.append(_EVENT_DECODER.decode(item))
            continue
        except RecursionError as e:
            raise _too_deep(path) from e
        except msgspec.ValidationError:
            pass
        try:
            obj = msgspec.json.decode(item)
        except msgspec.DecodeError:
            dropped["events with a number out of range"] += 1
            continue
        if not isinstance(obj, dict):
            dropped["entries of `traceEvents` that are not objects"] += 1
            continue
        ev = _convert(obj, dropped)
        if ev is not None:
            out.append(ev)
    return out


def _convert(obj: dict[str, Any], dropped: Counter[str]) -> _Event | None:
    """One event from a dict, leaving out ``args`` fields of the wrong type."""
    left_out: list[str] = []
    for _ in range(_MAX_FIXES):
        try:
            ev = msgspec.convert(obj, _Event)
        except msgspec.ValidationError as e:
            m = _ERROR_AT.search(str(e))
            where = m.group(1) if m else "?"
            args = obj.get("args")
            if where.startswith("args.") and isinstance(args, dict) and where[5:] in args:
                obj = {**obj, "args": {k: v for k, v in args.items() if k != where[5:]}}
                left_out.append(where)
                continue
            if where == "args":
                obj = {k: v for k, v in obj.items() if k != "args"}
                left_out.append("args")
                continue
            dropped[f"events with `{where.split('.')[0]}` of the wrong type or out of range"] += 1
            return None
        for w in left_out:
            dropped[f"`{w}` values of the wrong type or out of range (left out)"] += 1
        return ev
    dropped["events with too many unreadable fields"] += 1
    return None


def _to_ns(ts_us: np.ndarray[Any, Any], base_ns: int) -> np.ndarray[Any, Any]:
    """µs floats → integer ns without losing precision on 16-digit epoch-µs values.

    The values were checked (:meth:`_Columns.add`, :func:`_finish`): finite and within
    [``TIME_MIN_NS``, ``TIME_MAX_NS``] once scaled, so nothing here can overflow.
    """
    if ts_us.size == 0:
        return ts_us.astype(np.int64)
    origin = np.floor(ts_us.min())
    rel: np.ndarray[Any, Any] = np.rint((ts_us - origin) * 1000.0).astype(np.int64)
    out: np.ndarray[Any, Any] = rel + np.int64(int(origin) * 1000 + base_ns)
    return out


# Kineto writes µs; these bound ts and dur before scaling (base_ns is checked on its own).
_TS_MAX_US = TIME_MAX_NS / 1000.0
_TS_MIN_US = TIME_MIN_NS / 1000.0
# An event this far from the median start of its trace is damaged: a profiled window lasts
# seconds to hours, never a week. (Checked only when the trace spans more than this.)
MAX_SPAN_NS = 7 * 24 * 3600 * 10**9
_BAD_TIME = ("events with invalid timestamps ignored (ts or dur not a finite number, dur < 0, "
             "or beyond ±146 years)")  # fmt: skip
_NO_TIME = "events without ts or dur ignored"
_NO_ID = "events without pid or tid ignored"
_NO_NAME = "events without a name kept, named ''"
_NO_PH = "events without ph ignored"
_ODD_PH = "events of an unknown phase (ph) ignored"
_EMPTY_STEP = "step ranges of zero duration ignored"
_FAR = "events more than 7 days away from the rest of the trace ignored (damaged timestamps)"


class _Interner(dict[Any, int]):
    """Value → dense id in first-seen order; ``map(interner.__getitem__, values)`` runs in C."""

    def __missing__(self, key: Any) -> int:
        v = self[key] = len(self)
        return v


class _Columns:
    """Accumulates the columns of a trace from successive slices of its event list.

    Each slice is reduced at once to compact numpy columns (and its structs dropped by the
    caller), so memory holds one slice of structs at a time. Ids are assigned in first-seen
    order over the whole trace, so the result does not depend on how it was sliced.
    """

    def __init__(self, patterns: NamePatterns) -> None:
        self.patterns = patterns
        self.cats = _Interner()
        self.kind_of_cat = np.zeros(0, np.int8)  # per cat id; -1 unknown, -2 known & dropped
        self.gpu_cat = np.zeros(0, bool)
        self.names = _Interner()
        self.name_flags = np.zeros((0, 4), bool)  # comm kernel, comm host, data, step
        self.ids = _Interner()  # str(pid) / str(tid) → id
        self.raw_ids = _Interner()  # raw pid/tid value (int or str) → raw id
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
        self.parts: list[list[np.ndarray[Any, Any] | None]] = []

    def _grow(self) -> None:
        """Extend the per-id lookup tables to ids seen for the first time."""
        for c in list(self.cats)[len(self.kind_of_cat) :]:
            k = CATEGORY_KINDS.get(str(c).lower(), -1)
            if k == -1:
                self.unknown_cats.add(str(c).lower())
            kk = -2 if k is None else int(k)
            self.kind_of_cat = np.append(self.kind_of_cat, np.int8(kk))
            self.gpu_cat = np.append(self.gpu_cat, str(c).lower() in GPU_CATEGORIES)
        new = list(self.names)[len(self.name_flags) :]
        if new:
            flags = self.patterns.flags([_name_str(s) for s in new])
            self.name_flags = np.concatenate([self.name_flags, flags])
        raw_new = list(self.raw_ids)[len(self.raw_to_id) :]
        if raw_new:
            ext = np.fromiter((self.ids[str(v)] for v in raw_new), np.int64, len(raw_new))
            self.raw_to_id = np.concatenate([self.raw_to_id, ext])

    def add(self, events: list[Any], phs: Iterable[str]) -> None:
        """Reduce one slice of events (with an iterator over their ``ph``) to columns."""
        if not events:
            return
        n = len(events)
        ph = np.fromiter(map(_PH_IDS.__getitem__, phs), np.int64, n)
        if ph.max() >= _N_PHASES:
            self.dropped[_NO_PH] += int(np.count_nonzero(ph == _PH_IDS[""]))
            self.dropped[_ODD_PH] += int(np.count_nonzero(ph > _PH_IDS[""]))
        for i in np.flatnonzero(ph == _PH_IDS["M"]).tolist():
            e = events[i]
            if e.name == "thread_name" and msgspec.UNSET not in (e.pid, e.tid):
                self.thread_names.setdefault((str(e.pid), str(e.tid)), []).append(e.args.name)
            elif e.name in ("process_name", "process_labels"):
                label = e.args.name or e.args.labels
                self.process_names.setdefault(str(e.pid), []).append(label)
        x = np.flatnonzero(ph == _PH_IDS["X"])
        if len(x) != n:
            events = [events[i] for i in x.tolist()]
            n = len(events)
        if not n:
            return
        cat = np.fromiter(map(self.cats.__getitem__, map(_GET_CAT, events)), np.int64, n)
        self._grow()
        kind = self.kind_of_cat[cat]
        self.skipped += int(np.count_nonzero(kind == -1))
        keep = np.flatnonzero(kind >= 0)
        if len(keep) != n:
            events = [events[i] for i in keep.tolist()]
            kind, cat = kind[keep], cat[keep]
            n = len(events)
        if not n:
            return
        if self.first_cat is None:
            self.first_cat = events[0].cat
        is_gpu = self.gpu_cat[cat]
        ts = np.fromiter(map(_GET_TS, events), np.float64, n)
        dur = np.fromiter(map(_GET_DUR, events), np.float64, n)
        name = np.fromiter(map(self.names.__getitem__, map(_GET_NAME, events)), np.int64, n)
        pid = np.fromiter(map(self.raw_ids.__getitem__, map(_GET_PID, events)), np.int64, n)
        tid = np.fromiter(map(self.raw_ids.__getitem__, map(_GET_TID, events)), np.int64, n)
        self._grow()
        # Events with no usable time or lane are dropped and counted (checks on whole columns;
        # the comparisons are false for NaN, so ``~ok`` catches NaN and ±inf too).
        ok = (ts >= _TS_MIN_US) & (ts <= _TS_MAX_US) & (dur >= 0.0) & (dur <= _TS_MAX_US)
        unset = self.raw_ids.get(msgspec.UNSET)
        if unset is not None:
            ok &= (pid != unset) & (tid != unset)
        if not ok.all():
            missing = np.isnan(ts) | np.isnan(dur)
            no_id = ~missing & ((pid == unset) | (tid == unset))
            self.dropped[_NO_TIME] += int(np.count_nonzero(missing))
            self.dropped[_NO_ID] += int(np.count_nonzero(no_id))
            self.dropped[_BAD_TIME] += int(np.count_nonzero(~ok & ~missing & ~no_id))
            keep = np.flatnonzero(ok)
            events = [events[i] for i in keep.tolist()]
            ts, dur, name, pid, tid = ts[keep], dur[keep], name[keep], pid[keep], tid[keep]
            kind, cat, is_gpu = kind[keep], cat[keep], is_gpu[keep]
            n = len(events)
            if not n:
                return
        unnamed = self.names.get(msgspec.UNSET)
        if unnamed is not None:
            self.dropped[_NO_NAME] += int(np.count_nonzero(name == unnamed))
        args = list(map(_GET_ARGS, events))
        corr = np.fromiter(map(_GET_CORR, args), np.int64, n)

        # lanes: a (str(pid), str(tid)) pair; its first event names it
        key = (self.raw_to_id[pid] << 32) | self.raw_to_id[tid]
        ukeys, first = np.unique(key, return_index=True)
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

        # kinds refined by name (here, per slice: copies and collectives need their args)
        kind = refine_kinds(kind.astype(np.int64), self.name_flags[name]).astype(np.int8)

        # bytes for copies and collectives (hundreds of events, not the event count)
        nbytes = np.full(n, -1, dtype=np.int64)
        coll_id = np.full(n, -1, dtype=np.int64)
        coll_name = np.full(n, -1, dtype=np.int32)
        sized = (kind == Kind.MEMCPY) | (kind == Kind.MEMSET) | (kind == Kind.COMM)
        for i in np.flatnonzero(sized).tolist():
            a = args[i]
            nbytes[i] = _nbytes(a)
            if a.coll_name:
                coll_name[i] = self.names[a.coll_name]
                coll_id[i] = _coll_key(a)
        self.parts.append(
            [ts, dur, kind, name.astype(np.int32), key, corr, nbytes, is_gpu, coll_id, coll_name]
        )

    _DTYPES = (np.float64, np.float64, np.int8, np.int32, np.int64, np.int64, np.int64, bool,
               np.int64, np.int32)  # fmt: skip

    def columns(self) -> list[np.ndarray[Any, Any]]:
        """Every column over all slices, each slice's copy freed as it goes (peak memory)."""
        out = []
        for i, dt in enumerate(self._DTYPES):
            parts: list[np.ndarray[Any, Any]] = [p[i] for p in self.parts if p[i] is not None]  # type: ignore[misc]
            out.append(np.concatenate(parts) if parts else np.zeros(0, dt))
            for p in self.parts:
                p[i] = None
        self.parts.clear()
        return out


def _coll_key(a: _Args) -> int:
    """An id equal on every rank for one collective: ``Comms Id``, else (group, ``Seq``)."""
    if isinstance(a.comms_id, int) and a.comms_id >= 0:
        return a.comms_id & ((1 << 62) - 1)
    if a.seq not in (-1, ""):
        return zlib.crc32(f"{a.pg_name}\0{a.coll_name}\0{a.seq}".encode()) | (1 << 62)
    return -1


def _nbytes(a: _Args) -> int:
    """Bytes moved by a copy or collective, -1 when unknown (or beyond int64: damaged)."""
    if a.coll_name and a.coll_name != "wait":
        nel = a.out_nelems if a.coll_name.lstrip("_").startswith("allgather") else a.in_nelems
        size = _DTYPE_BYTES.get(a.dtype.lower(), 0)
        return nel * size if 0 <= nel <= _NBYTES_MAX // 8 and size else -1
    if isinstance(a.nbytes, int) and a.nbytes >= 0:
        return a.nbytes
    return -1


def _lane_name(p: str, t: str, gpu: bool, s: int | str) -> str:
    """``cpu:<tid>`` or ``gpu:<dev>:<stream>`` for a lane, from its first event."""
    if not gpu:
        return f"cpu:{t}"
    if s in (-1, ""):
        s = t
    m = _STREAM_NUM.search(str(s))
    dev = _STREAM_NUM.search(p)
    return f"gpu:{dev.group(1) if dev else p}:{m.group(1) if m else s}"


_GET_PH = attrgetter("ph")
_GET_CAT = attrgetter("cat")
_GET_NAME = attrgetter("name")
_GET_PID = attrgetter("pid")
_GET_TID = attrgetter("tid")
_GET_TS = attrgetter("ts")
_GET_DUR = attrgetter("dur")
_GET_ARGS = attrgetter("args")
_GET_CORR = attrgetter("correlation")
# Every phase of the Chrome trace format, then "" (an event without ph); other values
# are unknown phases. Both are counted.
_PH_IDS = _Interner({ph: i for i, ph in enumerate(("X", "M", *_SKIPPED_PHASES, ""))})
_N_PHASES = len(_PH_IDS) - 1
_SLICE = 20_000  # events reduced at once on the fallback path
_BLOCK = 1 << 20  # decompressed bytes per streaming step
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# ``},{`` between two events, searched backwards: the reversed pattern on the reversed block.
_BOUNDARY_REVERSED = re.compile(rb"\{\s*,\s*\}")
_EVENTS_DECODER = msgspec.json.Decoder(list[_AnyEvent])


def _phs_of_types(events: list[Any]) -> Iterable[str]:
    return map(_TYPE_PH.__getitem__, map(type, events))


class _Fallback(Exception):
    """The streaming reader met something it does not handle; decode the whole file."""


def _stream(path: Path, cols: _Columns) -> _Trace:
    """Gunzip and decode the trace block by block, reducing events to columns as they come.

    The event array is cut at ``},{`` boundaries. A cut inside a string or a nested value
    leaves an unterminated string or unbalanced brackets, so msgspec rejects that block and
    the caller falls back to decoding the whole file: a wrong cut can never be accepted.
    The text before the array and after it is decoded as a trace with those events only.

    Time and memory are linear in the file whatever its shape: the text after the last cut
    grows in place (a bytearray) until the next cut is found, and only the new block is
    searched for a cut, so a 200 MB string is read like 200 MB of events.
    """
    with open_input(path) as raw:
        try:
            with _opened(raw) as f:
                return _stream_events(path, f, cols)
        except RecursionError as e:
            raise _too_deep(path) from e
        except (msgspec.DecodeError, OSError, EOFError, zlib.error) as e:
            raise _Fallback from e


def _stream_events(path: Path, f: IO[bytes], cols: _Columns) -> _Trace:
    buf = b""
    while (m := _EVENTS_KEY.search(buf)) is None:
        block = f.read(_BLOCK)
        if not block or len(buf) > 4 * _BLOCK:
            raise _Fallback
        buf += block  # at most a few blocks before the event array
    head = _DECODER.decode(buf[: m.end()] + b"]}")
    # The text after the last cut, as a JSON array opened by "[": appended to in place
    # (amortised linear), decoded and replaced at each cut.
    text = bytearray(b"[")
    text += memoryview(buf)[m.end() :]
    del buf
    while block := f.read(_BLOCK):
        cut = _BOUNDARY_REVERSED.search(block[::-1])
        if cut is None:
            text += block
            if len(text) > MAX_EVENT_BYTES:
                raise InputError(
                    path,
                    f"more than {MAX_EVENT_BYTES >> 20} MiB of JSON without an event boundary",
                    "the file is damaged (or not a PyTorch Profiler trace); re-capture it",
                )
            continue
        # In the reversed block the match is "{ , }": map it back to just after the "}" that
        # ends the last whole event, and to the "{" that starts the next one.
        end, nxt = len(block) - cut.end() + 1, len(block) - 1 - cut.start()
        text += memoryview(block)[:end]
        text += b"]"
        evs: list[Any]
        try:
            evs = _EVENTS_DECODER.decode(text)
            cols.add(evs, _phs_of_types(evs))
        except msgspec.ValidationError:
            evs = _lenient_events(path, _RAW_LIST_DECODER.decode(text), cols.dropped)
            cols.add(evs, map(_GET_PH, evs))
        del evs
        text = bytearray(b"[")
        text += memoryview(block)[nxt:]
    text[:1] = b'{"traceEvents":['
    if _EVENTS_KEY.search(text, 16):
        raise _Fallback  # a second `traceEvents` array: the whole-file path counts it
    try:
        tail: _TailTrace | _RawTailTrace = _TAIL_DECODER.decode(text)
        events: list[Any] = tail.traceEvents or []
        cols.add(events, _phs_of_types(events))
    except msgspec.ValidationError:
        tail = _RAW_TAIL_DECODER.decode(text)
        events = _lenient_events(path, tail.traceEvents or [], cols.dropped)
        cols.add(events, map(_GET_PH, events))
    if tail.traceEvents is None:
        raise _Fallback
    trace = _Trace(traceEvents=[])
    for f_name in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "schemaVersion"):
        v = getattr(tail, f_name)
        setattr(trace, f_name, getattr(head, f_name) if v is None else v)
    return trace


def load_kineto(
    path: Path,
    *,
    rank: int | None = None,
    options: LoadOptions | None = None,
) -> RankTimeline:
    """Load one Kineto trace file of one rank (:func:`load_kineto_ranks` for merged files)."""
    ranks = load_kineto_ranks(path, rank=rank, options=options)
    if len(ranks) > 1:
        raise InputError(
            path,
            f"holds {len(ranks)} ranks ({_rank_list([t.rank for t in ranks])})",
            "use load_kineto_ranks, gpudiag.analyze or `gpudiag analyze`, which split it",
        )
    return ranks[0]


def load_kineto_ranks(
    path: Path,
    *,
    rank: int | None = None,
    options: LoadOptions | None = None,
) -> list[RankTimeline]:
    """Load one Kineto trace file into a RankTimeline.

    ``rank`` overrides what the file says (used when the caller maps files to ranks).
    The file is streamed (gunzip, decode and reduce block by block), so neither the whole
    JSON text nor one struct per event is ever held; anything unusual falls back to decoding
    the whole file, which also produces the precise error messages. Only regular files are
    read (a FIFO or a device is refused before it is opened).
    """
    patterns = NamePatterns(options or LoadOptions())
    path = Path(path)
    cols = _Columns(patterns)
    try:
        trace = _stream(path, cols)
    except _Fallback:
        return build_timelines(path, decode(path, read_bytes(path)), rank=rank, options=options)
    return _finish_all(path, trace, cols, rank)


def build_timeline(
    path: Path,
    trace: _Trace,
    *,
    rank: int | None = None,
    options: LoadOptions | None = None,
) -> RankTimeline:
    """Turn a decoded trace of one rank into a RankTimeline (``path`` names it in messages)."""
    (tl,) = build_timelines(path, trace, rank=rank, options=options)
    return tl


def build_timelines(
    path: Path,
    trace: _Trace,
    *,
    rank: int | None = None,
    options: LoadOptions | None = None,
) -> list[RankTimeline]:
    """Turn a decoded trace into its ranks' RankTimelines (one unless it is a merged file)."""
    cols = _Columns(NamePatterns(options or LoadOptions()))
    cols.dropped.update(getattr(trace, "dropped", None) or {})
    events: list[_Event] = trace.traceEvents or []
    trace.traceEvents = []
    for i in range(0, len(events), _SLICE):
        part = events[i : i + _SLICE]
        cols.add(part, map(_GET_PH, part))
    del events
    return _finish_all(path, trace, cols, rank)


_RANK_HINT = ("the trace is damaged: fix distributedInfo in the file, or give each rank's "
              "trace a name with its rank (rank-<N>.json.gz) and remove the bad value")  # fmt: skip


def _rank_meta(path: Path, trace: _Trace, rank: int | None) -> tuple[int, RankMeta]:
    """The rank (caller, distributedInfo, file name, else 0), world size, backend, devices.

    An impossible rank or world size (negative, beyond int32, not an integer) is refused;
    a top-level key of the wrong type is noted and ignored.
    """
    meta = RankMeta(source=str(path), fmt="kineto")
    dist = trace.distributedInfo
    if dist is not None and not isinstance(dist, dict):
        meta.notes.append(f"distributedInfo is {json_words(dist)}, not an object: ignored")
    dist = dist if isinstance(dist, dict) else {}
    file_rank = rank_from_filename(path)
    info_rank = dist.get("rank")
    if info_rank is not None:
        info_rank = check_rank(info_rank, path, "distributedInfo.rank", _RANK_HINT)
    if file_rank is not None:
        file_rank = check_rank(file_rank, path, "the rank in the file name", _RANK_HINT)
    if rank is not None:
        meta.rank_from = "caller"
    elif info_rank is not None:
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
    if dist.get("world_size") is not None:
        meta.world_size = check_rank(dist["world_size"], path, "distributedInfo.world_size",
                                     _RANK_HINT, low=1)  # fmt: skip
    backend = dist.get("backend")
    if isinstance(backend, str) and backend:
        meta.backend = backend
    elif backend not in (None, ""):
        meta.notes.append(f"distributedInfo.backend is {json_words(backend)}: ignored")
    devices = trace.deviceProperties
    if isinstance(devices, list):
        meta.devices = [str(d.get("name", "")) for d in devices if isinstance(d, dict)]
    elif devices is not None:
        meta.notes.append(f"deviceProperties is {json_words(devices)}, not a list: ignored")
    if not dist:
        meta.notes.append("no distributedInfo in the trace (torch.distributed not initialised?)")
    return rank, meta


def _base_ns(path: Path, trace: _Trace) -> int:
    """``baseTimeNanoseconds`` (0 when absent); InputError when it is not a plausible time."""
    base = trace.baseTimeNanoseconds
    if base is None:
        return 0
    if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base <= TIME_MAX_NS:
        raise InputError(
            path,
            f"baseTimeNanoseconds is {json_words(base)}: not a time in nanoseconds "
            f"(0 … {TIME_MAX_NS}, about year 2116)",
            "the trace is damaged; re-capture it, or remove the key to read times as they are",
        )
    return base


def _launch_times(
    kind: np.ndarray[Any, Any],
    is_gpu: np.ndarray[Any, Any],
    corr: np.ndarray[Any, Any],
    start: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Launch time of GPU work: the start of the runtime call with its correlation id."""
    launch = np.full(len(kind), -1, dtype=np.int64)
    gpu_idx = np.flatnonzero(is_gpu & (corr >= 0))
    rt_idx = np.flatnonzero((kind == Kind.RUNTIME) & ~is_gpu & (corr >= 0))
    if len(gpu_idx) and len(rt_idx):
        rc = corr[rt_idx]
        rorder = np.argsort(rc, kind="stable")
        rc_sorted = rc[rorder]
        pos = np.searchsorted(rc_sorted, corr[gpu_idx])
        pos_c = np.minimum(pos, len(rc_sorted) - 1)
        hit = rc_sorted[pos_c] == corr[gpu_idx]
        launch[gpu_idx[hit]] = start[rt_idx[rorder[pos_c[hit]]]]
    return launch


_RANK_LABEL = re.compile(r"\brank[\s_:#=-]*(\d+)\b", re.IGNORECASE)


def _rank_list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")


def _lane_ranks(cols: _Columns) -> tuple[dict[int, int], str]:
    """Each lane key's rank in a merged file: ``args.rank``, else a ``RANK r`` process name."""
    pid_names = list(cols.ids)  # id → the str(pid) / str(tid) it was interned from
    by_label: dict[str, int] = {}
    for pid, labels in cols.process_names.items():
        found = {int(m.group(1)) for lb in labels for m in [_RANK_LABEL.search(lb)] if m}
        if len(found) == 1:
            by_label[pid] = found.pop()
    out: dict[int, int] = {}
    how = ""
    for k in cols.lanes:
        if k in cols.lane_rank:
            out[k], how = cols.lane_rank[k], how or "args.rank"
        else:
            pid = pid_names[k >> 32]
            if pid in by_label:
                out[k], how = by_label[pid], how or "process name"
    return out, how


def _finish_all(path: Path, trace: _Trace, cols: _Columns, rank: int | None) -> list[RankTimeline]:
    """Rank, metadata, time conversion and launch links from the accumulated columns.

    A file whose events name several ranks (``args.rank``, or ``RANK r`` process names:
    TraceLens' TraceFusion and similar merges) is split into one timeline per rank. A file
    with several processes that each run their own ``ProfilerStep`` ranges and nothing
    that says which rank each is, is refused: analysing them as one rank would mix GPUs.
    """
    base = _base_ns(path, trace)
    if not cols.cats:  # cats are interned for "X" events only
        raise InputError(
            path, "the trace holds no events", "was the profiler's active window empty?"
        )
    dropped = []
    if cols.unknown_cats:
        dropped.append(f"skipped {cols.skipped} events of unknown categories "
                       f"{sorted(cols.unknown_cats)[:5]}")  # fmt: skip
    columns = cols.columns()
    if base:  # the scaled times must stay in range too
        ts, dur = columns[0], columns[1]
        start_f = ts * 1000.0 + base
        columns = _keep(columns, (start_f <= TIME_MAX_NS) & (start_f + dur * 1000.0 <= TIME_MAX_NS),
                        cols.dropped, _BAD_TIME)  # fmt: skip
    # A step range that lasts no time is damaged (a training step always takes some), and
    # would make the median step of a run zero.
    columns = _keep(columns, (columns[2] != Kind.STEP) | (columns[1] > 0), cols.dropped,
                    _EMPTY_STEP)  # fmt: skip
    ts = columns[0]
    if len(ts) and float(ts.max() - ts.min()) * 1000.0 > MAX_SPAN_NS:
        mid = float(np.median(ts))
        columns = _keep(columns, np.abs(ts - mid) * 1000.0 <= MAX_SPAN_NS / 2, cols.dropped, _FAR)
    dropped += dropped_notes(cols.dropped)
    ts, dur, kind, name_idx, key, corr, nbytes, is_gpu, coll_id, coll_name = columns
    if not len(ts):
        raise InputError(
            path,
            "no usable events (" + "; ".join(dropped or ["none is timed"]) + ")",
            "the trace is damaged; re-capture it or copy it again",
        )
    start = _to_ns(ts, base)
    end = start + np.rint(dur * 1000.0).astype(np.int64)
    del ts, dur, columns
    launch = _launch_times(kind, is_gpu, corr, start)
    full = (start, end, kind, name_idx, key, nbytes, is_gpu, coll_id, coll_name, launch)
    lane_rank, how = _lane_ranks(cols) if rank is None else ({}, "")
    ranks = sorted(set(lane_rank.values()))
    if len(ranks) < 2:
        _refuse_unlabelled(path, cols, key, kind)
        only = ranks[0] if ranks and rank is None and not trace.distributedInfo else rank
        return [_one_rank(path, trace, cols, full, only, how if only is not None else "", dropped)]
    keys = np.fromiter(lane_rank, np.int64, len(lane_rank))
    vals = np.fromiter(lane_rank.values(), np.int64, len(lane_rank))
    order = np.argsort(keys)
    pos = np.minimum(np.searchsorted(keys[order], key), len(keys) - 1)
    ev_rank = np.where(keys[order][pos] == key, vals[order][pos], -1)
    unknown = int(np.count_nonzero(ev_rank < 0))
    if unknown > 0.01 * ev_rank.size:
        raise InputError(
            path,
            f"holds ranks {_rank_list(ranks)} (from {how}) but {unknown} of {ev_rank.size} "
            "events belong to processes with no rank",
            "label every event (args.rank) or every process (process_name 'RANK r - GPU'), "
            "or analyse the per-rank files",
        )
    out = []
    for r in ranks:
        sel = np.flatnonzero(ev_rank == r)
        part = tuple(c[sel] for c in full)
        sub = _Columns(cols.patterns)
        sub.names, sub.ids = cols.names, cols.ids
        sub.lanes = {k: v for k, v in cols.lanes.items() if lane_rank.get(k) == r}
        sub.thread_names, sub.lane_pid_raw = cols.thread_names, cols.lane_pid_raw
        sub.first_cat, sub.skipped, sub.unknown_cats = cols.first_cat, 0, set()
        sub.cats = cols.cats
        tl = _one_rank(path, trace, sub, part, r, how, dropped if r == ranks[0] else [])
        tl.meta.notes.append(f"rank {r} of a file that holds ranks {_rank_list(ranks)} "
                             f"(told apart by {how})")  # fmt: skip
        out.append(tl)
    if unknown:
        out[0].meta.notes.append(f"{unknown} events of processes with no rank left out")
    return out


def _refuse_unlabelled(path: Path, cols: _Columns, key: Any, kind: Any) -> None:
    """Several processes with their own step ranges, and nothing naming their ranks."""
    pids = {int(k) >> 32 for k in np.unique(key[kind == Kind.STEP]).tolist()}
    if len(pids) > 1:
        raise InputError(
            path,
            f"holds {len(pids)} processes that each run their own ProfilerStep ranges, and "
            "nothing says which rank each is (no args.rank, no 'RANK r' process names)",
            "give one trace per rank, or merge them with a tool that labels ranks "
            "(TraceLens TraceFusion)",
        )


def _one_rank(
    path: Path,
    trace: _Trace,
    cols: _Columns,
    full: tuple[Any, ...],
    rank: int | None,
    how: str,
    dropped: list[str],
) -> RankTimeline:
    start, end, kind, name_idx, key, nbytes, is_gpu, coll_id, coll_name, launch = full
    rank, meta = _rank_meta(path, trace, rank)
    if how:  # a merged file: its merge dropped distributedInfo, nothing to say about it
        meta.rank_from = how
        meta.notes = [n for n in meta.notes if not n.startswith("no distributedInfo")]
    meta.skipped_events = cols.skipped
    meta.notes.extend(dropped)

    # Two raw lanes can map to one name (legacy "stream 7" vs 7): merge them.
    lane_keys = np.fromiter(cols.lanes, np.int64, len(cols.lanes))
    order = np.argsort(lane_keys)
    uniq_names, lane_of_key = np.unique(
        np.asarray(list(cols.lanes.values()), dtype=object), return_inverse=True
    )
    lanes = [str(x) for x in uniq_names]
    lane = lane_of_key.reshape(-1)[order][np.searchsorted(lane_keys[order], key)]

    meta.has_gpu = bool(np.any(is_gpu))
    pid_of = list(cols.ids)
    mine = {pid_of[k >> 32] for k in cols.lanes}
    meta.thread_names = {
        f"cpu:{t}": sorted(set(v)) for (p, t), v in cols.thread_names.items()
        if f"cpu:{t}" in lanes and p in mine
    }  # fmt: skip
    # merged files offset the pid: the main thread is the one whose tid is the raw pid
    raw_of = {pid_of[k >> 32]: v for k, v in cols.lane_pid_raw.items() if k in cols.lanes}
    main = next((raw_of.get(p, p) for p, t in cols.thread_names
                 if raw_of.get(p, p) == t and p in mine and f"cpu:{t}" in lanes), None)  # fmt: skip
    meta.pid = int(main) if main is not None and _INT_TEXT.fullmatch(main) else None
    meta.era = _era(trace, cols.first_cat)
    raw = RawColumns(
        start_ns=start, end_ns=end, kind=kind.astype(np.int64), lane=lane.astype(np.int64),
        name=name_idx.astype(np.int64), lanes=lanes, names=[_name_str(x) for x in cols.names],
        launch_ns=launch, nbytes=nbytes, coll_id=coll_id, coll_name=coll_name.astype(np.int64),
    )  # fmt: skip
    return build_rank(rank, raw, meta, cols.patterns, path, kinds_final=True,
                      range_label="record_function range")  # fmt: skip


_INT_TEXT = re.compile(r"-?[0-9]{1,18}")


def _keep(
    columns: list[np.ndarray[Any, Any]], ok: np.ndarray[Any, Any], dropped: Counter[str], why: str
) -> list[np.ndarray[Any, Any]]:
    """The columns where ``ok``; the others counted in ``dropped`` under ``why``."""
    if ok.all():
        return columns
    dropped[why] += int(np.count_nonzero(~ok))
    return [c[ok] for c in columns]


def _name_str(name: Any) -> str:
    """An interned name as text: an event without a name is named ''."""
    return "" if name is msgspec.UNSET else str(name)


def _era(trace: _Trace, first_cat: str | None) -> str:
    """A label for the layout generation, reported so users know which rules applied."""
    if isinstance(trace.baseTimeNanoseconds, int):
        return "kineto-2024+"
    if first_cat and first_cat[:1].isupper():
        return "kineto-2021"
    return "kineto-2022"
