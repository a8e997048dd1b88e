"""The annotated timeline as a Chrome / Perfetto trace (Trace Event Format JSON, gzipped).

Open it at https://ui.perfetto.dev (or chrome://tracing). One process per rank
(``rank N``), with these threads (tracks):

==================  ===================================================================
track               slices
==================  ===================================================================
``steps``           one per analysed step (``step N``), its parts in ``args`` (ms)
``compute``         the step's compute intervals as gpudiag classified them
``comm-wait``       communication not hidden behind compute
``data-wait``       waiting for input with the device idle
``other``           the rest of the step (host overhead, launch gaps, copies alone)
``collectives``     each collective (type, bytes); a flow arrow runs from the rank that
                    arrived last to every rank that waited for it
``gpu:…``/``cpu:…`` ``--timeline-full`` only: the raw kernels (or operators) and copies
==================  ===================================================================

Per rank, a counter track ``step shares`` gives each step's four shares (%), and each
finding is an instant event on the ranks it names (global when it names none) with its
message, as is each live alert ``gpudiag run`` raised or cleared (``alert: <kind>``, at the
time the monitor judged it). The part tracks are aggregated
(:mod:`gpudiag.analysis.rank.timeline`): gaps shorter than the recorded resolution
(``otherData.resolution_ns``) are closed so each track holds at most 1,500 slices per rank.
Times are µs from the earliest analysed step; each rank keeps its own clock.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from gpudiag._support.fileio import write_output_bytes
from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.analysis.rank.timeline import PARTS, Timeline

TRACKS = ("steps", *PARTS, "collectives")
_TID = {name: i + 1 for i, name in enumerate(TRACKS)}
_CNAME = {"compute": "good", "comm-wait": "bad", "data-wait": "terrible", "other": "grey"}
MAX_FLOWS = 20_000
_ENC = msgspec.json.Encoder()


def events(d: Diagnosis, tl: Timeline) -> Iterator[dict[str, Any]]:
    """Every trace event of the annotated timeline, metadata first."""
    if not tl.ranks:
        return
    t0 = min(int(r.start.min()) for r in tl.ranks if r.start.size)

    def us(ns: int) -> float:
        return (ns - t0) / 1000.0

    by_step = {(s.rank, s.step): s for s in d.steps}
    for r in tl.ranks:
        yield {
            "ph": "M",
            "name": "process_name",
            "pid": r.rank,
            "tid": 0,
            "args": {"name": f"rank {r.rank}"},
        }
        yield {
            "ph": "M",
            "name": "process_sort_index",
            "pid": r.rank,
            "tid": 0,
            "args": {"sort_index": r.rank},
        }
        for name, tid in _TID.items():
            yield {
                "ph": "M",
                "name": "thread_name",
                "pid": r.rank,
                "tid": tid,
                "args": {"name": name},
            }
            yield {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": r.rank,
                "tid": tid,
                "args": {"sort_index": tid},
            }
    for r in tl.ranks:
        yield from _rank_events(r, by_step, us)
    yield from _collectives(tl, us)
    yield from _findings(d, tl, us)
    yield from _alerts(d, us)


def _alerts(d: Diagnosis, us: Any) -> Iterator[dict[str, Any]]:
    """Each live alert raised or cleared, an instant on the ranks it names (global if none)."""
    for a in d.alerts:
        name = f"alert: {a.kind}" if a.state == "raised" else f"alert cleared: {a.kind}"
        args = {"step": a.step, "message": a.message}
        targets: list[int | None] = list(a.ranks) or [None]
        for rank in targets:
            ev: dict[str, Any] = {
                "ph": "i",
                "name": name,
                "cat": "alert",
                "ts": us(a.time_ns),
                "args": args,
            }
            if rank is None:
                ev.update({"s": "g", "pid": 0, "tid": 0})
            else:
                ev.update({"s": "p", "pid": rank, "tid": _TID["steps"]})
            yield ev


def _rank_events(r: Any, by_step: dict[tuple[int, int], Any], us: Any) -> Iterator[dict[str, Any]]:
    for n, s, e in zip(r.step.tolist(), r.start.tolist(), r.end.tolist(), strict=True):
        sb = by_step.get((r.rank, n))
        args = {}
        if sb is not None:
            args = {
                "duration_ms": sb.duration_ns / 1e6,
                "compute_ms": sb.compute_ns / 1e6,
                "comm_wait_ms": sb.comm_wait_ns / 1e6,
                "data_wait_ms": sb.data_wait_ns / 1e6,
                "other_ms": sb.other_ns / 1e6,
            }
            dur = max(sb.duration_ns, 1)
            yield {
                "ph": "C",
                "name": "step shares (%)",
                "pid": r.rank,
                "ts": us(s),
                "args": {
                    "compute": 100 * sb.compute_ns / dur,
                    "comm-wait": 100 * sb.comm_wait_ns / dur,
                    "data-wait": 100 * sb.data_wait_ns / dur,
                    "other": 100 * sb.other_ns / dur,
                },
            }
        yield {
            "ph": "X",
            "name": f"step {n}",
            "cat": "step",
            "pid": r.rank,
            "args": args,
            "tid": _TID["steps"],
            "ts": us(s),
            "dur": (e - s) / 1000.0,
        }
    for part in PARTS:
        ps, pe = r.parts[part]
        tid, cname = _TID[part], _CNAME[part]
        for s, e in zip(ps.tolist(), pe.tolist(), strict=True):
            yield {
                "ph": "X",
                "name": part,
                "cat": "part",
                "pid": r.rank,
                "tid": tid,
                "ts": us(s),
                "dur": (e - s) / 1000.0,
                "cname": cname,
            }
    lanes: dict[str, int] = {}
    for name, lane, s, e in r.kernels:
        if lane not in lanes:
            lanes[lane] = 100 + len(lanes)
            yield {
                "ph": "M",
                "name": "thread_name",
                "pid": r.rank,
                "tid": lanes[lane],
                "args": {"name": lane},
            }
        yield {
            "ph": "X",
            "name": name,
            "cat": "kernel",
            "pid": r.rank,
            "tid": lanes[lane],
            "ts": us(s),
            "dur": (e - s) / 1000.0,
        }


def _collectives(tl: Timeline, us: Any) -> Iterator[dict[str, Any]]:
    tid = _TID["collectives"]
    for rank, c in tl.collectives.items():
        for i, t in enumerate(c.type):
            s, du = int(c.start[i]), int(c.dur[i])
            args: dict[str, Any] = {"type": t}
            if int(c.nbytes[i]) >= 0:
                args["bytes"] = int(c.nbytes[i])
            yield {
                "ph": "X",
                "name": t,
                "cat": "collective",
                "pid": rank,
                "tid": tid,
                "ts": us(s),
                "dur": du / 1000.0,
                "args": args,
            }
    # the arrows: from the last rank to arrive to each rank that waited for it, the
    # collectives with the longest waits first
    waits = []
    for m in tl.matched:
        durs = {r: int(tl.collectives[r].dur[i]) for r, i in m.items()}
        if len(durs) < 2:
            continue
        last = min(durs, key=lambda r: durs[r])
        waits.append((sum(durs.values()) - len(durs) * durs[last], last, m))
    waits.sort(key=lambda w: -w[0])
    flow = 0
    for waited, last, m in waits:
        if waited <= 0 or flow >= MAX_FLOWS:
            break
        lc = tl.collectives[last]
        at = int(lc.start[m[last]])
        for r, i in m.items():
            if r == last or flow >= MAX_FLOWS:
                continue
            c = tl.collectives[r]
            end = int(c.start[i] + c.dur[i])
            flow += 1
            yield {
                "ph": "s",
                "id": flow,
                "name": "waited for the last rank",
                "cat": "late",
                "pid": last,
                "tid": tid,
                "ts": us(at) + 0.001,
            }
            yield {
                "ph": "f",
                "bp": "e",
                "id": flow,
                "name": "waited for the last rank",
                "cat": "late",
                "pid": r,
                "tid": tid,
                "ts": us(end) - 0.001,
            }


def _findings(d: Diagnosis, tl: Timeline, us: Any) -> Iterator[dict[str, Any]]:
    first = {r.rank: (r.step.tolist(), r.start.tolist()) for r in tl.ranks}
    for f in d.findings:
        args = {"severity": str(f.severity), "message": f.message}
        targets: list[int | None] = list(f.ranks) or [None]
        for rank in targets:
            steps, starts = first.get(rank, ([], [])) if rank is not None else ([], [])
            at = starts[0] if starts else min(int(r.start.min()) for r in tl.ranks)
            if f.steps and steps:
                at = next((s for n, s in zip(steps, starts, strict=True) if n == f.steps[0]), at)
            ev: dict[str, Any] = {
                "ph": "i",
                "name": str(f.kind),
                "cat": "finding",
                "ts": us(int(at)),
                "args": args,
            }
            if rank is None:
                ev.update({"s": "g", "pid": 0, "tid": 0})
            else:
                ev.update({"s": "p", "pid": rank, "tid": _TID["steps"]})
            yield ev


def write(d: Diagnosis, tl: Timeline, path: Path) -> Path:
    """Write the timeline to ``path`` (gzip when it ends in ``.gz``); returns the path."""
    path = Path(path)
    with write_output_bytes(path) as raw:  # -o's rules: never replaces a device, FIFO or link
        if path.name.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
                _write_to(f, d, tl)
        else:
            _write_to(raw, d, tl)
    return path


def _write_to(f: IO[bytes] | gzip.GzipFile, d: Diagnosis, tl: Timeline) -> None:
    other = {
        "tool": "gpudiag",
        "gpudiag_version": d.gpudiag_version,
        "resolution_ns": {str(r.rank): r.resolution_ns for r in tl.ranks},
        "inputs": d.inputs,
    }
    f.write(b'{"displayTimeUnit":"ms","otherData":' + _ENC.encode(other) + b',"traceEvents":[')
    batch: list[bytes] = []
    first = True
    for ev in events(d, tl):
        batch.append(_ENC.encode(ev))
        if len(batch) >= 4096:
            f.write((b"" if first else b",") + b",".join(batch))
            first, batch = False, []
    if batch:
        f.write((b"" if first else b",") + b",".join(batch))
    f.write(b"]}\n")
