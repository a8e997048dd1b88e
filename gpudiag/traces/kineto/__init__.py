"""Kineto JSON(.gz) → Intervals for one rank, with a versioned table of known categories and args.

Decoding is the expensive part of reading a trace, so the file is decoded once by msgspec
into typed structs holding only the fields gpudiag uses (unknown keys are skipped in C),
then turned into numpy columns with C-level iteration (``map``/``attrgetter`` and dict
interning); no per-event Python code runs. The file is streamed: each block of gunzipped
text is decoded and reduced to columns before the next one is read. Format eras are
described in ``docs/formats.md`` and in the shared Kineto reference.

The modules, in the order a file goes through them:

- :mod:`.events`: the typed msgspec schema of the fields read, and its decoders;
- :mod:`.stream`: the streaming reader (gunzip, cut at event boundaries, decode);
- :mod:`.whole`: the whole-file fallback, and the repair of events that fail the typed
  decode;
- :mod:`.columns`: decoded events → :class:`~.columns.EventColumns`, a named record of
  per-event arrays, slice by slice;
- :mod:`.finish`: whole-trace time checks, µs → ns, launch links;
- :mod:`.ranks`: the rank and its metadata; merged multi-rank files split per rank.
"""

from __future__ import annotations

from pathlib import Path

from gpudiag.errors import InputError
from gpudiag.traces.core.common import LoadOptions, NamePatterns, rank_from_filename
from gpudiag.traces.kineto.columns import CATEGORY_KINDS, GET_PH, GPU_CATEGORIES, Columns
from gpudiag.traces.kineto.events import Event, Trace
from gpudiag.traces.kineto.finish import MAX_SPAN_NS, to_timelines
from gpudiag.traces.kineto.ranks import rank_list
from gpudiag.traces.kineto.stream import MAX_EVENT_BYTES, Fallback, stream_trace
from gpudiag.traces.kineto.whole import (
    MAX_WHOLE_FILE_BYTES,
    NOT_A_TRACE_HINT,
    decode,
    read_bytes,
)
from gpudiag.traces.schema import RankTimeline

__all__ = [
    "CATEGORY_KINDS",
    "GPU_CATEGORIES",
    "MAX_EVENT_BYTES",
    "MAX_SPAN_NS",
    "MAX_WHOLE_FILE_BYTES",
    "NOT_A_TRACE_HINT",
    "build_timeline",
    "build_timelines",
    "decode",
    "load_kineto",
    "load_kineto_ranks",
    "rank_from_filename",
    "read_bytes",
]

_SLICE = 20_000  # events reduced at once on the whole-file path


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
            f"holds {len(ranks)} ranks ({rank_list([t.rank for t in ranks])})",
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
    cols = Columns(patterns)
    try:
        trace = stream_trace(path, cols)
    except Fallback:
        return build_timelines(path, decode(path, read_bytes(path)), rank=rank, options=options)
    return to_timelines(path, trace, cols, rank)


def build_timeline(
    path: Path,
    trace: Trace,
    *,
    rank: int | None = None,
    options: LoadOptions | None = None,
) -> RankTimeline:
    """Turn a decoded trace of one rank into a RankTimeline (``path`` names it in messages)."""
    (tl,) = build_timelines(path, trace, rank=rank, options=options)
    return tl


def build_timelines(
    path: Path,
    trace: Trace,
    *,
    rank: int | None = None,
    options: LoadOptions | None = None,
) -> list[RankTimeline]:
    """Turn a decoded trace into its ranks' RankTimelines (one unless it is a merged file)."""
    cols = Columns(NamePatterns(options or LoadOptions()))
    cols.dropped.update(getattr(trace, "dropped", None) or {})
    events: list[Event] = trace.traceEvents or []
    trace.traceEvents = []
    for i in range(0, len(events), _SLICE):
        part = events[i : i + _SLICE]
        cols.add(part, map(GET_PH, part))
    del events
    return to_timelines(path, trace, cols, rank)
