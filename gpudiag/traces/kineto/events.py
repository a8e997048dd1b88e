"""The typed msgspec schema of the Kineto fields gpudiag reads, and the decoders built on it.

Only the fields gpudiag uses are declared; msgspec skips every other key in C. Missing
fields get sentinels (UNSET, NaN, -1), never plausible values, so that events without a
time, a process or a name are counted rather than placed at 0.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

# Integers are checked against int64 in C while decoding (msgspec accepts any size): a value
# outside fails the event's type check, and the slow path drops that one field or event.
_I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_NAN = float("nan")  # a missing ts / dur: counted, and the event dropped


class Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of an event: ids, sizes, collective fields, metadata names."""

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
    # record_shapes: the inputs of an operator, kept raw (decoded for host collectives only)
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    input_strides: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Strides")


_NO_ARGS = Args()


class EventFields(msgspec.Struct, frozen=True, gc=False):
    """The fields of an event that gpudiag reads (unknown keys are skipped in C)."""

    cat: str = ""
    name: str | msgspec.UnsetType = msgspec.UNSET
    pid: _I64 | str | msgspec.UnsetType = msgspec.UNSET
    tid: _I64 | str | msgspec.UnsetType = msgspec.UNSET
    ts: float = _NAN
    dur: float = _NAN
    args: Args = _NO_ARGS


class Event(EventFields, frozen=True, gc=False):
    """An event of any phase, ``ph`` a plain field (whole-file and lenient paths)."""

    ph: str = ""


class XEvent(EventFields, frozen=True, gc=False, tag_field="ph", tag="X"):
    """An ``X`` (complete) event on the streaming path, where ``ph`` selects the type."""


class MEvent(XEvent, frozen=True, gc=False, tag="M"):
    """A metadata event (thread and process names)."""


# Every other Chrome-trace phase decodes to an empty struct: its values are parsed but no
# objects are made for them (flow events alone are a third of a Kineto trace). A phase not
# listed here, or an event without ``ph``, fails the block and the file is decoded whole.
SKIPPED_PHASES = (
    "B",
    "E",
    "i",
    "I",
    "C",
    "b",
    "n",
    "e",
    "s",
    "t",
    "f",
    "P",
    "N",
    "O",
    "D",
    "V",
    "v",
    "R",
    "c",
    "(",
    ")",
)
_SKIP_TYPES = tuple(
    msgspec.defstruct(f"_Skip{i}", [], tag_field="ph", tag=ph, frozen=True, gc=False)
    for i, ph in enumerate(SKIPPED_PHASES)
)
TYPE_PH: dict[type, str] = {XEvent: "X", MEvent: "M"}
TYPE_PH.update(zip(_SKIP_TYPES, SKIPPED_PHASES, strict=True))
if TYPE_CHECKING:
    AnyEvent = XEvent
else:
    AnyEvent = functools.reduce(operator.or_, (XEvent, MEvent, *_SKIP_TYPES))


class TraceKeys(msgspec.Struct, dict=True):
    """The top-level keys gpudiag reads besides the event list.

    They are decoded as whatever they hold and checked where they are used (the rank's
    metadata, the base time), so that a key of the wrong type is named in a note or an
    error instead of failing the whole decode. (``dict=True``: the loader attaches what it
    dropped while decoding to the trace.)
    """

    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    if TYPE_CHECKING:  # not a field: set by the loader (reason → events dropped)
        dropped: Counter[str] = Counter()


class Trace(TraceKeys, dict=True):
    """A decoded trace: its top-level keys and its events."""

    traceEvents: list[Event] | None = None


DECODER = msgspec.json.Decoder(Trace)


class RawTrace(TraceKeys, dict=True):
    """A trace whose events failed the typed decode: the event list kept as raw JSON."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"null")  # msgspec takes no Raw in a union


RAW_DECODER = msgspec.json.Decoder(RawTrace)


class TailTrace(TraceKeys, dict=True):
    """The end of a streamed trace: its last events and the keys after the event array."""

    traceEvents: list[AnyEvent] | None = None


TAIL_DECODER = msgspec.json.Decoder(TailTrace)


class RawTailTrace(TraceKeys, dict=True):
    """The end of a streamed trace whose events failed the typed decode."""

    traceEvents: list[msgspec.Raw] | None = None


RAW_TAIL_DECODER = msgspec.json.Decoder(RawTailTrace)
RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
EVENT_DECODER = msgspec.json.Decoder(Event)
EVENTS_DECODER = msgspec.json.Decoder(list[AnyEvent])  # a streamed block of events
