"""What an Nsight export without kernels holds, said exactly: copies, start-up calls, NVTX."""

from __future__ import annotations

from typing import Any

from gpudiag.traces.nsys.database import Export, quoted

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
