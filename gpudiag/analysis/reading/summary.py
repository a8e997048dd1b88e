"""The run's reading (one line, docs/definitions.md "Reading") and what it adds to the verdict."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import RankSummary, Reading, StepBreakdown, Verdict
from gpudiag.analysis.model.evidence import RankReading
from gpudiag.config import ReadingRules

_SOURCE = {
    "ProfilerStep": "ProfilerStep markers",
    "marker": "--step-marker",
    "user_range": "ranges found",
    "optimizer": "Optimizer.step ends",
    "kernels": "a repeating kernel sequence",
    "whole": "no iterations: one window",
}


def run_reading(
    ranks: Sequence[RankSummary], steps: Sequence[StepBreakdown], rules: ReadingRules
) -> Reading | None:
    """The reading of the rank with the largest start-up share (else the first rank)."""
    read = [(r.rank, r.evidence.reading) for r in ranks if r.evidence.reading]
    if not read:
        return None
    rank, rd = max(read, key=lambda x: (_share(x[1]), -x[0]))
    analysed = sum(1 for s in steps if s.rank == rank)
    dominant = _share(rd) >= rules.startup_dominant_ratio
    r = Reading(
        line="",
        rank=rank,
        window_ns=rd.window_ns,
        startup_ns=rd.startup_ns,
        startup_calls=dict(rd.startup_calls or {}),
        idle_head_ns=rd.idle_head_ns or 0,
        idle_tail_ns=rd.idle_tail_ns or 0,
        steps_found=rd.steps_found,
        steps_analysed=analysed,
        source=rd.source,
        holds=dict(rd.holds),
        startup_dominant=dominant,
        startup_kinds=dict(rd.startup_kinds or {}),
        teardown_ns=rd.teardown_ns or 0,
        teardown_calls=dict(rd.teardown_calls or {}),
        ranges=dict(rd.ranges_by_name or {}),
        ranges_span_ns=rd.ranges_span_ns or 0,
    )
    return dataclasses.replace(r, line=_line(r, rd, len(ranks)))


def _share(rd: RankReading) -> float:
    return rd.startup_ns / max(rd.window_ns, 1)


def _calls(calls: dict[str, int]) -> str:
    return ", ".join(f"{n} {words.duration(ns, 'brief')}" for n, ns in list(calls.items())[:2])


def _line(r: Reading, rd: RankReading, ranks: int) -> str:
    """``rank 0: window 9.8 s · start-up 6.2 s (63%: cudaFree 6.2 s) · 10 steps …``."""
    parts = [f"window {words.duration(r.window_ns, 'brief')}"]
    if r.startup_ns:
        kinds = [k for k in r.startup_kinds if k != "calls"]
        how = "; " + ", ".join(f"{k} {words.duration(r.startup_kinds[k], 'brief')}" for k in kinds)
        parts.append(
            f"start-up {words.duration(r.startup_ns, 'brief')} "
            f"({words.percent(_share(rd))}: {_calls(r.startup_calls)}{how if kinds else ''})"
        )
    else:
        parts.append("no start-up")
    if r.source == "whole":
        parts.append("found ranges refused: one window" if rd.refused else _SOURCE["whole"])
    else:
        what = _SOURCE.get(r.source, r.source)
        if rd.range:
            what += f" '{rd.range}'"
        parts.append(
            f"{words.plural(r.steps_found, 'step')} from {what}, {r.steps_analysed} analysed"
        )
        if rd.steps_in_startup:
            parts[-1] += f" ({rd.steps_in_startup} in start-up left out)"
    # edges under 1% of the window are not worth a word (they are left out all the same)
    edges = [
        f"{w} {words.duration(ns, 'brief')}"
        for w, ns in (("idle head", r.idle_head_ns), ("idle tail", r.idle_tail_ns))
        if ns >= 0.01 * r.window_ns
    ]
    if edges:
        parts.append(", ".join(edges) + " left out")
    if r.teardown_ns:
        parts.append(
            f"teardown {words.duration(r.teardown_ns, 'brief')} ({_calls(r.teardown_calls)}) "
            "left out"
        )
    who = f"rank {r.rank}" + (f" (one of {ranks} ranks)" if ranks > 1 else "")
    return f"{who}: " + " · ".join(parts)


def with_reading(v: Verdict, r: Reading | None) -> Verdict:
    """The verdict when start-up dominates the window, or the trace holds ranges alone."""
    if r is None or v.bottleneck in ("hang", "failure", "mismatch"):
        return v
    if r.ranges:
        return dataclasses.replace(v, headline=ranges_only(r))
    if not r.startup_dominant:
        return v
    share = words.percent(r.startup_ns / max(r.window_ns, 1))
    what = f"this window is {share} start-up ({_calls(r.startup_calls)})"
    if not r.holds.get("kernels"):
        return dataclasses.replace(
            v,
            headline=(
                f"start-up only: the capture ended during start-up ({what}, no kernel ran): "
                "profile past start-up, after the first iterations"
            ),
        )
    n = r.steps_found - r.steps_analysed
    after = f"after {n + 1} warm-up iterations" if n > 0 else "after a few warm-up iterations"
    return dataclasses.replace(v, headline=f"{v.headline} — {what}: profile {after}")


def ranges_only(r: Reading) -> str:
    """``ranges only: … by range: find_centers 67.7 ms of 130.0 ms (52%), …``."""
    span = max(r.ranges_span_ns, 1)
    by = ", ".join(
        f"{n} {words.duration(ns, 'brief')} of {words.duration(span, 'brief')} "
        f"({words.percent(ns / span)})"
        for n, ns in r.ranges.items()
    )
    n = r.holds.get("ranges", 0)
    return (
        f"ranges only: the trace holds {words.plural(n, 'host range')} and no GPU activity, "
        f"runtime call or operator; by range: {by} — that breakdown is what it can show; "
        "for a diagnosis, profile with CUDA tracing on"
    )
