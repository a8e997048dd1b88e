"""Flags ranks whose idle ratio exceeds the threshold, and names where their time goes.

Metrics are time-weighted over a rank's analysed steps (sum of part ÷ sum of step time):

* ``idle_ratio`` = 1 − compute / step time; flagged above ``idle_ratio_max`` (0.30).
  The busy/idle split is the one users see as "GPU utilisation swings": 30% is where a
  job clearly pays for something other than compute.
* ``data_bound``: data-wait share ≥ ``data_bound_ratio`` (0.10). Above a tenth of the
  step, the input pipeline is worth fixing before anything else (the TensorBoard plugin
  used 5%; gpudiag asks for twice that before it speaks up).
* ``comm_bound``: comm-wait share (communication not hidden behind compute) ≥
  ``comm_bound_ratio`` (0.10), the TensorBoard plugin's communication threshold.
* ``host_bound``: "other" share ≥ ``host_bound_ratio`` (0.30): time with no compute,
  exposed communication or data wait — host overhead, launch gaps, synchronisation,
  copies alone.

A rank is flagged when its time-weighted value crosses the threshold *and* its per-step
value does in at least half of its steps, so that one stalled step (reported by the
straggler analysis as an intermittent stall) does not label the whole rank. One finding
per kind covers every rank flagged; ``metrics.per_rank`` holds each rank's value and
``steps`` the steps in which it was crossed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpudiag.analysis.model import Finding, RankSummary, StepBreakdown, by_rank
from gpudiag.config import Thresholds

_DL = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#(\w+)\.__next__$")


def pretty_range(name: str) -> str:
    """A short readable name for a host range (``DataLoader.__next__`` for the long form)."""
    m = _DL.match(name)
    if m:
        return f"{m.group(1)}.__next__"
    if "(" in name and not name.startswith(("enumerate", "##")):
        name = name.split("(", 1)[0]  # a kernel's signature adds nothing to its name
    return name if len(name) <= 60 else name[:57] + "..."


def _per_rank(values: dict[int, float]) -> dict[str, float]:
    """Per-rank values keyed as JSON keys are: strings."""
    return {str(r): v for r, v in sorted(values.items())}


def _ranks_text(values: dict[int, float]) -> str:
    items = sorted(values.items(), key=lambda kv: -kv[1])
    if len(items) == 1:
        r, v = items[0]
        return f"rank {r}: {v:.0%}"
    lo, hi = min(values.values()), max(values.values())
    ranks = sorted(values)
    shown = ", ".join(map(str, ranks[:6])) + (
        f" and {len(ranks) - 6} more" if len(ranks) > 6 else ""
    )
    span = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}–{hi:.0%}"
    return f"ranks {shown}: {span}"


def _steps_over(
    steps: Sequence[StepBreakdown], ranks: set[int], value: Any, limit: float
) -> list[int]:
    return sorted({s.step for s in steps if s.rank in ranks and s.duration_ns and value(s) > limit})


def _mostly(
    candidates: dict[int, float], steps: Sequence[StepBreakdown], value: Any, limit: float
) -> dict[int, float]:
    """Keep ranks whose per-step value crosses ``limit`` in at least half of their steps.

    A rank is "data-bound" when most of its steps are; one stalled step is an intermittent
    event (the straggler analysis reports those), not the rank's regime.
    """
    out = {}
    grouped = by_rank(s for s in steps if s.duration_ns)
    for rank, v in candidates.items():
        mine = grouped.get(rank, [])
        over = sum(1 for s in mine if value(s) >= limit)
        if not mine or 2 * over >= len(mine):
            out[rank] = v
    return out


def idle_findings(
    ranks: Sequence[RankSummary], steps: Sequence[StepBreakdown], th: Thresholds
) -> list[Finding]:
    """The idle, data, communication and host findings of a run."""
    out: list[Finding] = []

    idle = {r.rank: r.idle_ratio for r in ranks if r.idle_ratio > th.idle_ratio_max}
    idle = _mostly(idle, steps, lambda s: s.idle_ratio, th.idle_ratio_max)
    if idle:
        what = "GPU" if all(r.mode == "gpu" for r in ranks if r.rank in idle) else "compute"
        out.append(Finding(
            kind="idle_ratio",
            severity="warning",
            message=(f"{_ranks_text(idle)} of step time without {what} work "
                     f"(idle ratio above the {th.idle_ratio_max:.0%} threshold)"),
            ranks=sorted(idle),
            steps=_steps_over(steps, set(idle), lambda s: s.idle_ratio, th.idle_ratio_max),
            metrics={"per_rank": _per_rank(idle), "threshold": th.idle_ratio_max},
        ))  # fmt: skip

    data = {r.rank: r.shares.data_wait for r in ranks if r.shares.data_wait >= th.data_bound_ratio}
    data = _mostly(data, steps, lambda s: s.data_wait_ns / s.duration_ns, th.data_bound_ratio)
    if data:
        data_names = sorted(
            {
                str(r.evidence["data_range"])
                for r in ranks
                if r.rank in data and r.evidence.get("data_range")
            }
        )
        where = pretty_range(data_names[0]) if len(data_names) == 1 else "the data loader"
        out.append(Finding(
            kind="data_bound",
            severity="error" if max(data.values()) >= 0.3 else "warning",
            message=f"{_ranks_text(data)} of step time waiting for data in {where}",
            ranks=sorted(data),
            steps=_steps_over(steps, set(data), lambda s: s.data_wait_ns / s.duration_ns,
                              th.data_bound_ratio),
            metrics={"per_rank": _per_rank(data), "threshold": th.data_bound_ratio,
                     "data_range": data_names[0] if data_names else None},
        ))  # fmt: skip

    comm = {r.rank: r.shares.comm_wait for r in ranks if r.shares.comm_wait >= th.comm_bound_ratio}
    comm = _mostly(comm, steps, lambda s: s.comm_wait_ns / s.duration_ns, th.comm_bound_ratio)
    if comm:
        comm_names = [
            str(r.evidence["comm_top"])
            for r in ranks
            if r.rank in comm and r.evidence.get("comm_top")
        ]
        mostly = f" (mostly {pretty_range(comm_names[0])})" if comm_names else ""
        hidden = {r.rank: r.comm_hidden_ratio for r in ranks if r.rank in comm}
        out.append(Finding(
            kind="comm_bound",
            severity="error" if max(comm.values()) >= 0.3 else "warning",
            message=(f"{_ranks_text(comm)} of step time waiting for communication "
                     f"not hidden behind compute{mostly}"),
            ranks=sorted(comm),
            steps=_steps_over(steps, set(comm), lambda s: s.comm_wait_ns / s.duration_ns,
                              th.comm_bound_ratio),
            metrics={"per_rank": _per_rank(comm), "threshold": th.comm_bound_ratio,
                     "comm_hidden_ratio": {str(r): v for r, v in hidden.items()}},
        ))  # fmt: skip

    host = {r.rank: r.shares.other for r in ranks if r.shares.other >= th.host_bound_ratio}
    host = _mostly(host, steps, lambda s: s.other_ns / s.duration_ns, th.host_bound_ratio)
    if host:
        gpu = all(r.mode == "gpu" for r in ranks if r.rank in host)
        why = ("host overhead, kernel-launch gaps, synchronisation or copies with the GPU "
               "otherwise idle") if gpu else "Python/host overhead outside operators"  # fmt: skip
        out.append(Finding(
            kind="host_bound",
            severity="warning",
            message=(f"{_ranks_text(host)} of step time in neither compute, communication "
                     f"nor data: {why}"),
            ranks=sorted(host),
            steps=_steps_over(steps, set(host), lambda s: s.other_ns / s.duration_ns,
                              th.host_bound_ratio),
            metrics={"per_rank": _per_rank(host), "threshold": th.host_bound_ratio},
        ))  # fmt: skip
    return out
