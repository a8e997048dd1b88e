"""The streaming reader: a trace gunzipped, decoded and reduced to columns block by block.

Neither the whole JSON text nor one struct per event is ever held. Anything this reader
does not handle raises :class:`Fallback`, and the caller decodes the whole file instead.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import msgspec

from gpudiag._support.fileio import open_input
from gpudiag.errors import InputError
from gpudiag.traces.kineto.columns import GET_PH, Columns
from gpudiag.traces.kineto.events import (
    DECODER,
    EVENTS_DECODER,
    RAW_LIST_DECODER,
    RAW_TAIL_DECODER,
    TAIL_DECODER,
    TYPE_PH,
    RawTailTrace,
    TailTrace,
    Trace,
)
from gpudiag.traces.kineto.whole import EVENTS_KEY, lenient_events, opened, too_deep

# While streaming, text without an event boundary for this long is refused: no event of a
# real trace comes near it, and a gzip bomb of one endless string stops here.
MAX_EVENT_BYTES = 1 << 30
_BLOCK = 1 << 20  # decompressed bytes per streaming step
# ``},{`` between two events, searched backwards: the reversed pattern on the reversed block.
_BOUNDARY_REVERSED = re.compile(rb"\{\s*,\s*\}")


_TAIL = 1 << 16  # the end of a block searched first for the last boundary


def _last_boundary(block: bytes) -> tuple[int, int] | None:
    """Just after the ``}`` that ends the block's last whole event, and its next ``{``.

    The boundary is searched backwards (the reversed pattern on the reversed bytes), in the
    block's last 64 KiB first, then in 8 times as much until the whole block: reversing a
    whole 1 MiB block for each step cost ~1 ms, 10% of reading a trace. The last boundary
    found in a tail is the block's last one.
    """
    n, width = len(block), _TAIL
    while True:
        start = max(0, n - width)
        cut = _BOUNDARY_REVERSED.search(block[start:][::-1])
        if cut is not None:  # reversed index r is the block's n - 1 - r
            return n - cut.end() + 1, n - 1 - cut.start()
        if not start:
            return None
        width *= 8


class Fallback(Exception):
    """The streaming reader met something it does not handle; decode the whole file."""


def _phs_of_types(events: list[Any]) -> Iterable[str]:
    return map(TYPE_PH.__getitem__, map(type, events))


def stream_trace(path: Path, cols: Columns) -> Trace:
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
            with opened(raw) as f:
                return _stream_events(path, f, cols)
        except RecursionError as e:
            raise too_deep(path) from e
        except (msgspec.DecodeError, OSError, EOFError, zlib.error) as e:
            raise Fallback from e


def _stream_events(path: Path, f: IO[bytes], cols: Columns) -> Trace:
    buf = b""
    while (m := EVENTS_KEY.search(buf)) is None:
        block = f.read(_BLOCK)
        if not block or len(buf) > 4 * _BLOCK:
            raise Fallback
        buf += block  # at most a few blocks before the event array
    head = DECODER.decode(buf[: m.end()] + b"]}")
    # The text after the last cut, as a JSON array opened by "[": appended to in place
    # (amortised linear), decoded and replaced at each cut.
    text = bytearray(b"[")
    text += memoryview(buf)[m.end() :]
    del buf
    while block := f.read(_BLOCK):
        cut = _last_boundary(block)
        if cut is None:
            text += block
            if len(text) > MAX_EVENT_BYTES:
                raise InputError(
                    path,
                    f"more than {MAX_EVENT_BYTES >> 20} MiB of JSON without an event boundary",
                    "the file is damaged (or not a PyTorch Profiler trace); re-capture it",
                )
            continue
        end, nxt = cut
        text += memoryview(block)[:end]
        text += b"]"
        evs: list[Any]
        try:
            evs = EVENTS_DECODER.decode(text)
            cols.add(evs, _phs_of_types(evs))
        except msgspec.ValidationError:
            evs = lenient_events(path, RAW_LIST_DECODER.decode(text), cols.dropped)
            cols.add(evs, map(GET_PH, evs))
        del evs
        text = bytearray(b"[")
        text += memoryview(block)[nxt:]
    return _tail(path, head, text, cols)


def _tail(path: Path, head: Trace, text: bytearray, cols: Columns) -> Trace:
    """The last events and the keys after the event array; the trace's keys, either side."""
    text[:1] = b'{"traceEvents":['
    if EVENTS_KEY.search(text, 16):
        raise Fallback  # a second `traceEvents` array: the whole-file path counts it
    try:
        tail: TailTrace | RawTailTrace = TAIL_DECODER.decode(text)
        events: list[Any] = tail.traceEvents or []
        cols.add(events, _phs_of_types(events))
    except msgspec.ValidationError:
        tail = RAW_TAIL_DECODER.decode(text)
        events = lenient_events(path, tail.traceEvents or [], cols.dropped)
        cols.add(events, map(GET_PH, events))
    if tail.traceEvents is None:
        raise Fallback
    trace = Trace(traceEvents=[])
    for f_name in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "schemaVersion"):
        v = getattr(tail, f_name)
        setattr(trace, f_name, getattr(head, f_name) if v is None else v)
    return trace
