"""What an Nsight export without kernels holds, said exactly: copies, start-up calls, NVTX.

An export of NVTX ranges alone (no kernel, copy, memset or runtime call) is no error: its
ranges are read as host timelines (:func:`range_timelines`), whose per-range breakdown the
reading gives (docs/definitions.md, "Reading").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpudiag.errors import InputError
from gpudiag.traces.core.common import NamePatterns, RawColumns, rank_from_filename
from gpudiag.traces.core.rank_builder import build_rank
from gpudiag.traces.nsys.database import Export, quoted
from gpudiag.traces.schema import Kind, RankMeta, RankTimeline

_NS = 1_000_000


def _ms(ns: int) -> str:
    return f"{ns / _NS:.1f} ms" if ns < 10_000 * _NS else f"{ns / 1e9:.2f} s"


def no_kernels(ex: Export) -> tuple[str, str]:
    """(problem, hint) for an export with no kernel table, from what it does hold.

    Copies or memsets: CUDA tracing was on and the program stopped before its first kernel.
    Runtime calls alone: the capture ended during start-up (the longest calls named).
    NVTX ranges alone: their breakdown (the four longest names by total time, as a share of
    the ranges' span), which is what such an export can answer.
    """
    copies = ex.count("CUPTI_ACTIVITY_KIND_MEMCPY")
    memsets = ex.count("CUPTI_ACTIVITY_KIND_MEMSET")
    if copies or memsets:
        return (
            f"the export holds {copies} copies and {memsets} memsets but no kernel (no CUDA "
            "kernel table, CUPTI_ACTIVITY_KIND_KERNEL): CUDA tracing was on and the program "
            "stopped before its first kernel ran",
            "profile past start-up and data preparation, into the training loop",
        )
    calls = _longest(ex, "CUPTI_ACTIVITY_KIND_RUNTIME", "nameId")
    if calls:
        return (
            "the export holds CUDA runtime calls but no kernel (no CUDA "
            f"kernel table, CUPTI_ACTIVITY_KIND_KERNEL): the capture ended during start-up "
            f"({calls})",
            "profile past start-up, after the first iterations",
        )
    ranges = _longest(ex, "NVTX_EVENTS", "text")
    if ranges:
        return (
            f"the export holds NVTX ranges but no GPU activity (no CUDA kernel table); "
            f"by range: {ranges}",
            "that per-range breakdown is what it can show; for a diagnosis profile with "
            "CUDA tracing on: `nsys profile -t cuda,nvtx …`",
        )
    return (
        "export has no CUDA kernel table (CUPTI_ACTIVITY_KIND_KERNEL): no GPU work was captured",
        "profile with CUDA tracing on: `nsys profile -t cuda,nvtx …`",
    )


def ranges_only(ex: Export) -> bool:
    """The export has no kernel table, and NVTX ranges but no copy, memset or runtime call."""
    return (
        not ex.table("CUPTI_ACTIVITY_KIND_KERNEL")
        and not ex.count("CUPTI_ACTIVITY_KIND_MEMCPY")
        and not ex.count("CUPTI_ACTIVITY_KIND_MEMSET")
        and not ex.count("CUPTI_ACTIVITY_KIND_RUNTIME")
        and ex.count("NVTX_EVENTS") > 0
    )


def range_timelines(
    ex: Export, patterns: NamePatterns, source: str, era: str, notes: list[str]
) -> list[RankTimeline]:
    """One host timeline per process of an NVTX-only export (ranks in process order)."""
    from gpudiag.traces.nsys.sql import nvtx_rows  # sql reads this package's Export

    rows, names = nvtx_rows(ex, True)
    if not len(rows):
        raise InputError(ex.path, *no_kernels(ex))
    pids = sorted(set(rows[:, 0].tolist()))
    file_rank = rank_from_filename(Path(source))
    out = []
    for order, pid in enumerate(pids):
        r = rows[rows[:, 0] == pid]
        tids, lane = np.unique(r[:, 1], return_inverse=True)
        used, name = np.unique(r[:, 4], return_inverse=True)
        none = np.full(len(r), -1, np.int64)
        cols = RawColumns(
            start_ns=r[:, 2].copy(),
            end_ns=r[:, 3].copy(),
            kind=np.where(r[:, 5] != 0, int(Kind.COMM), int(Kind.ANNOTATION)).astype(np.int64),
            lane=lane.reshape(-1).astype(np.int64),
            name=name.reshape(-1).astype(np.int64),
            lanes=[f"cpu:{int(t)}" for t in tids.tolist()],
            names=[names[int(i)] for i in used.tolist()],
            launch_ns=none,
            nbytes=none.copy(),
        )
        meta = RankMeta(source=source, fmt="nsys", era=era, notes=list(notes), pid=int(pid))
        meta.notes.append(
            "the export holds NVTX ranges only (no CUDA kernel, copy or runtime call): read "
            "as host ranges, their breakdown is what it can show"
        )
        rank = file_rank if file_rank is not None and len(pids) == 1 else order
        meta.rank_from = "file name" if rank == file_rank else "process order"
        out.append(build_rank(rank, cols, meta, patterns, ex.path, range_label="NVTX range"))
    return out


def _longest(ex: Export, table: str, name_col: str) -> str:
    """``name 67.7 ms of 130.0 ms (52%), …``: the four longest names by total time."""
    t = ex.table(table)
    cols = ex.cols(table)
    if t is None or not {"start", "end"} <= cols:
        return ""
    if name_col == "text" and "text" in cols and "textId" in cols and ex.table("StringIds"):
        name = (
            f"COALESCE(x.text, (SELECT value FROM {quoted(ex.table('StringIds') or '')} "
            "WHERE id = x.textId))"
        )
    elif name_col in cols and name_col != "text" and ex.table("StringIds"):
        name = f"(SELECT value FROM {quoted(ex.table('StringIds') or '')} WHERE id = x.{name_col})"
    elif name_col in cols:
        name = f"x.{name_col}"
    else:
        return ""
    rows: list[Any] = ex.rows(
        f"SELECT {name} AS nm, SUM(x.end - x.start) AS d FROM {quoted(t)} x "
        "WHERE x.end > x.start GROUP BY nm ORDER BY d DESC LIMIT 4"
    )
    span = ex.rows(f"SELECT MIN(start), MAX(end) FROM {quoted(t)} WHERE end > start")[0]
    if not rows or span[0] is None:
        return ""
    whole = max(int(span[1]) - int(span[0]), 1)
    return ", ".join(
        f"{nm} {_ms(int(d))} of {_ms(whole)} ({int(d) / whole:.0%})"
        for nm, d in rows
        if nm is not None
    )
