"""Megatron-style spread: the min and max of each rank metric across ranks, and who holds them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpudiag.analysis.model.diagnosis import RankSummary, SpreadEntry


def rank_spread(ranks: Sequence[RankSummary]) -> dict[str, SpreadEntry]:
    """Megatron-style min and max across ranks, with the rank that holds each."""
    if len(ranks) < 2:
        return {}
    metrics: dict[str, Callable[[RankSummary], float]] = {
        "step_time_ns_median": lambda r: r.step_time_ns_median,
        "compute_ratio": lambda r: r.shares.compute,
        "comm_wait_ratio": lambda r: r.shares.comm_wait,
        "data_wait_ratio": lambda r: r.shares.data_wait,
        "idle_ratio": lambda r: r.idle_ratio,
    }
    out: dict[str, SpreadEntry] = {}
    for name, get in metrics.items():
        if name == "comm_wait_ratio" and not all(r.shares.comm_measured for r in ranks):
            continue  # not measured (telemetry only): no spread to show
        lo = min(ranks, key=get)
        hi = max(ranks, key=get)
        out[name] = SpreadEntry(get(lo), lo.rank, get(hi), hi.rank)
    return out
