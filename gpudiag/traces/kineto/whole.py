"""A whole trace file read and decoded at once, and the repair of events that fail the typed decode.

This is the fallback path (the streaming reader handles well-formed files): it holds the
whole JSON text, and it produces the precise error messages for files that are not traces.
Events that fail the typed decode are converted one by one; a bad ``args`` field is left
out, any other bad field drops its event, and both are counted.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import IO, Any

import msgspec

from gpudiag._support.fileio import open_input
from gpudiag.errors import InputError
from gpudiag.traces.kineto.events import (
    DECODER,
    EVENT_DECODER,
    RAW_DECODER,
    RAW_LIST_DECODER,
    Event,
    Trace,
)

# isal (a dependency) gunzips ~1.6x faster than zlib, but importing it costs ~1.3 ms: about
# what it saves on 1 MB of JSON, 70-130 KB of Kineto's gzip. Smaller files go through gzip
# (imported anyway), and so does every file where isal cannot import. The bytes are the same.
SMALL_GZIP_BYTES = 64 << 10
_isal_gzip: Any = None


def _gzip_for(size: int) -> Any:
    global _isal_gzip
    if size < SMALL_GZIP_BYTES:
        return gzip
    if _isal_gzip is None:
        try:
            from isal import igzip
        except ImportError:  # pragma: no cover - depends on the environment
            igzip = gzip  # type: ignore[misc, unused-ignore]
        _isal_gzip = igzip
    return _isal_gzip


# The whole-file path (odd layouts, malformed files) holds the whole JSON text in memory;
# past this size a trace must be streamable (a gzip bomb stops here, not in the OOM killer).
MAX_WHOLE_FILE_BYTES = 4 << 30
NOT_A_TRACE_HINT = (
    "expected the output of torch.profiler export_chrome_trace / tensorboard_trace_handler"
)
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def opened(f: IO[bytes]) -> IO[bytes]:
    """The text stream of an open trace file: gunzipped when it starts with the gzip magic."""
    gz = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    if not gz:
        return f
    try:
        size = os.fstat(f.fileno()).st_size
    except (OSError, AttributeError, io.UnsupportedOperation):  # not a file: a stream
        size = SMALL_GZIP_BYTES
    return _gzip_for(size).open(f, "rb")  # type: ignore[no-any-return]


def _too_large(path: Path) -> InputError:
    return InputError(
        path,
        f"more than {MAX_WHOLE_FILE_BYTES >> 30} GiB of JSON that cannot be read event by event",
        "the file is damaged (or not a PyTorch Profiler trace); re-capture or copy it again",
    )


def too_deep(path: Path) -> InputError:
    """The error for JSON nested too deep for the decoder (a RecursionError)."""
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
            with opened(raw) as f:
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


def decode(path: Path, data: bytes) -> Trace:
    """Decode the needed fields of a Kineto trace; InputError on anything that is not one.

    Events that fail the typed decode (a field of the wrong type, a number out of range)
    are converted one by one (:func:`lenient_events`): the bad ones are dropped and
    counted in ``trace.dropped``, the rest is used.
    """
    try:
        trace = DECODER.decode(data)
        trace.dropped = Counter()
    except RecursionError as e:
        raise too_deep(path) from e
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
    arrays = sum(1 for _ in zip(range(3), EVENTS_KEY.finditer(data), strict=False))
    if arrays > 1:
        trace.dropped["`traceEvents` arrays besides the last one (a duplicated key?)"] += arrays - 1
    return trace


def _malformed(path: Path, e: Exception) -> InputError:
    return InputError(
        path,
        f"malformed or truncated JSON ({e})",
        "the trace was probably cut off while being written; re-capture or copy it again",
    )


def _decode_lenient(path: Path, data: bytes) -> Trace:
    """The slow path for a trace whose events fail the typed decode: event by event."""
    try:
        raw = RAW_DECODER.decode(data)
    except RecursionError as e:
        raise too_deep(path) from e
    except msgspec.ValidationError as e:  # the top level itself is not a trace object
        raise InputError(
            path, f"JSON does not look like a PyTorch Profiler trace ({e})", NOT_A_TRACE_HINT
        ) from e
    except msgspec.DecodeError as e:
        raise _malformed(path, e) from e
    trace = Trace(
        distributedInfo=raw.distributedInfo,
        deviceProperties=raw.deviceProperties,
        baseTimeNanoseconds=raw.baseTimeNanoseconds,
        schemaVersion=raw.schemaVersion,
    )
    trace.dropped = Counter()
    if bytes(raw.traceEvents) == b"null":
        return trace
    try:
        items = RAW_LIST_DECODER.decode(raw.traceEvents)
    except RecursionError as e:
        raise too_deep(path) from e
    except msgspec.DecodeError as e:
        raise InputError(
            path,
            "JSON does not look like a PyTorch Profiler trace (`traceEvents` is not a list)",
            NOT_A_TRACE_HINT,
        ) from e
    trace.traceEvents = lenient_events(path, items, trace.dropped)
    return trace


# "Expected `int`, got `str` - at `$.args.External id`" → ".args.External id"
_ERROR_AT = re.compile(r" - at `\$(?:\[\d+\])?\.?([^`]*)`$")
_MAX_FIXES = 8


def lenient_events(path: Path, items: list[msgspec.Raw], dropped: Counter[str]) -> list[Event]:
    """Events decoded one by one; what could not be read is counted in ``dropped``.

    A bad ``args`` field is left out of its event; any other bad field drops the event.
    """
    out: list[Event] = []
    for item in items:
        try:
            out.append(EVENT_DECODER.decode(item))
            continue
        except RecursionError as e:
            raise too_deep(path) from e
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


def _convert(obj: dict[str, Any], dropped: Counter[str]) -> Event | None:
    """One event from a dict, leaving out ``args`` fields of the wrong type."""
    left_out: list[str] = []
    for _ in range(_MAX_FIXES):
        try:
            ev = msgspec.convert(obj, Event)
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
