"""Which rank a trace is, its metadata; merged multi-rank files split into one timeline per rank.

A file whose events name several ranks (``args.rank``, or ``RANK r`` process names:
TraceLens' TraceFusion and similar merges) is split into one timeline per rank. A file
with several processes that each run their own ``ProfilerStep`` ranges and nothing that
says which rank each is, is refused: analysing them as one rank would mix GPUs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from gpudiag._support import lazyre
from gpudiag._support.nputil import unique
from gpudiag.errors import InputError
from gpudiag.traces.core.common import RawColumns, check_rank, json_words, rank_from_filename
from gpudiag.traces.core.rank_builder import build_rank
from gpudiag.traces.kineto.columns import I8, I64, Columns, TimedColumns, name_str
from gpudiag.traces.kineto.events import Trace
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

_RANK_HINT = (
    "the trace is damaged: fix distributedInfo in the file, or give each rank's "
    "trace a name with its rank (rank-<N>.json.gz) and remove the bad value"
)
_RANK_LABEL = lazyre.compile(r"\brank[\s_:#=-]*(\d+)\b", re.IGNORECASE)
_INT_TEXT = re.compile(r"-?[0-9]{1,18}")


def rank_list(ranks: list[int]) -> str:
    """Ranks for a message: the first eight, then an ellipsis."""
    return ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")


def timelines(
    path: Path,
    trace: Trace,
    cols: Columns,
    timed: TimedColumns,
    rank: int | None,
    notes: list[str],
) -> list[RankTimeline]:
    """One timeline per rank the file holds (one, unless it is a merged file).

    ``rank`` (the caller's) disables the split; ``notes`` go to the first timeline.
    """
    lane_rank, how = _lane_ranks(cols) if rank is None else ({}, "")
    ranks = sorted(set(lane_rank.values()))
    if len(ranks) < 2:
        _refuse_unlabelled(path, timed.lane_key, timed.kind)
        only = ranks[0] if ranks and rank is None and not trace.distributedInfo else rank
        return [_one_rank(path, trace, cols, timed, only, how if only is not None else "", notes)]
    keys = np.fromiter(lane_rank, np.int64, len(lane_rank))
    vals = np.fromiter(lane_rank.values(), np.int64, len(lane_rank))
    order = np.argsort(keys)
    pos = np.minimum(np.searchsorted(keys[order], timed.lane_key), len(keys) - 1)
    ev_rank = np.where(keys[order][pos] == timed.lane_key, vals[order][pos], -1)
    unknown = int(np.count_nonzero(ev_rank < 0))
    if unknown > 0.01 * ev_rank.size:
        raise InputError(
            path,
            f"holds ranks {rank_list(ranks)} (from {how}) but {unknown} of {ev_rank.size} "
            "events belong to processes with no rank",
            "label every event (args.rank) or every process (process_name 'RANK r - GPU'), "
            "or analyse the per-rank files",
        )
    out = []
    for r in ranks:
        part = timed.take(np.flatnonzero(ev_rank == r))
        sub = cols.for_lanes({k: v for k, v in cols.lanes.items() if lane_rank.get(k) == r})
        tl = _one_rank(path, trace, sub, part, r, how, notes if r == ranks[0] else [])
        tl.meta.notes.append(
            f"rank {r} of a file that holds ranks {rank_list(ranks)} (told apart by {how})"
        )
        out.append(tl)
    if unknown:
        out[0].meta.notes.append(f"{unknown} events of processes with no rank left out")
    return out


def _lane_ranks(cols: Columns) -> tuple[dict[int, int], str]:
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


def _refuse_unlabelled(path: Path, key: I64, kind: I8) -> None:
    """Several processes with their own step ranges, and nothing naming their ranks."""
    pids = {int(k) >> 32 for k in unique(key[kind == Kind.STEP]).tolist()}
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
    trace: Trace,
    cols: Columns,
    timed: TimedColumns,
    rank: int | None,
    how: str,
    notes: list[str],
) -> RankTimeline:
    rank, meta = _rank_meta(path, trace, rank)
    if how:  # a merged file: its merge dropped distributedInfo, nothing to say about it
        meta.rank_from = how
        meta.notes = [n for n in meta.notes if not n.startswith("no distributedInfo")]
    meta.skipped_events = cols.skipped
    meta.notes.extend(notes)
    meta.dropped = {why: n for why, n in cols.dropped.items() if n}
    if cols.skipped:
        meta.dropped["events of unknown categories skipped"] = cols.skipped
    if not how:  # merged files interleave several ranks' ids
        meta.coverage.update(cols.coverage())

    # Two raw lanes can map to one name (legacy "stream 7" vs 7): merge them.
    lane_keys = np.fromiter(cols.lanes, np.int64, len(cols.lanes))
    order = np.argsort(lane_keys)
    uniq_names, lane_of_key = np.unique(
        np.asarray(list(cols.lanes.values()), dtype=object), return_inverse=True
    )
    lanes = [str(x) for x in uniq_names]
    lane = lane_of_key.reshape(-1)[order][np.searchsorted(lane_keys[order], timed.lane_key)]

    meta.has_gpu = bool(np.any(timed.is_gpu))
    pid_of = list(cols.ids)
    mine = {pid_of[k >> 32] for k in cols.lanes}
    meta.thread_names = {
        f"cpu:{t}": sorted(set(v))
        for (p, t), v in cols.thread_names.items()
        if f"cpu:{t}" in lanes and p in mine
    }
    # merged files offset the pid: the main thread is the one whose tid is the raw pid
    raw_of = {pid_of[k >> 32]: v for k, v in cols.lane_pid_raw.items() if k in cols.lanes}
    main = next(
        (
            raw_of.get(p, p)
            for p, t in cols.thread_names
            if raw_of.get(p, p) == t and p in mine and f"cpu:{t}" in lanes
        ),
        None,
    )
    meta.pid = int(main) if main is not None and _INT_TEXT.fullmatch(main) else None
    meta.era = _era(trace, cols.first_cat)
    raw = RawColumns(
        start_ns=timed.start_ns,
        end_ns=timed.end_ns,
        kind=timed.kind.astype(np.int64),
        lane=lane.astype(np.int64),
        name=timed.name.astype(np.int64),
        lanes=lanes,
        names=[name_str(x) for x in cols.names],
        launch_ns=timed.launch_ns,
        nbytes=timed.nbytes,
        coll_id=timed.coll_id,
        coll_name=timed.coll_name.astype(np.int64),
        coll_dtype=timed.coll_dtype.astype(np.int64),
        shape=timed.shape.astype(np.int64),
        shapes=list(cols.shapes),
        python_names=cols.python_name if cols.python_name.any() else None,
    )
    return build_rank(
        rank, raw, meta, cols.patterns, path, kinds_final=True, range_label="record_function range"
    )


def _rank_meta(path: Path, trace: Trace, rank: int | None) -> tuple[int, RankMeta]:
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
        meta.world_size = check_rank(
            dist["world_size"], path, "distributedInfo.world_size", _RANK_HINT, low=1
        )
    backend = dist.get("backend")
    if isinstance(backend, str) and backend:
        meta.backend = backend
    elif backend not in (None, ""):
        meta.notes.append(f"distributedInfo.backend is {json_words(backend)}: ignored")
    devices = trace.deviceProperties
    if isinstance(devices, list):
        props = [d for d in devices if isinstance(d, dict)]
        meta.devices = [str(d.get("name", "")) for d in props]
        meta.compute_capability = [_cc(d.get("computeMajor"), d.get("computeMinor")) for d in props]
        meta.multiprocessors = [_count(d.get("numSms")) for d in props]
    elif devices is not None:
        meta.notes.append(f"deviceProperties is {json_words(devices)}, not a list: ignored")
    if not dist:
        meta.notes.append("no distributedInfo in the trace (torch.distributed not initialised?)")
    return rank, meta


def _era(trace: Trace, first_cat: str | None) -> str:
    """A label for the layout generation, reported so users know which rules applied."""
    if isinstance(trace.baseTimeNanoseconds, int):
        return "kineto-2024+"
    if first_cat and first_cat[:1].isupper():
        return "kineto-2021"
    return "kineto-2022"


def _cc(major: Any, minor: Any) -> str:
    """``"8.0"`` from deviceProperties' computeMajor/computeMinor, else ``""``."""
    ok = all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in (major, minor)
    )
    return f"{major}.{minor}" if ok else ""


def _count(v: Any) -> int:
    """A non-negative count from the trace, else 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 20 else 0
