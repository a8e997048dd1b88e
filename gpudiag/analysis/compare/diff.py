"""What changed between two Diagnoses (A → B): step time, shares, idle ratio, per rank.

Pure. Step times are compared as relative changes (B / A − 1); shares and ratios as
differences in percentage points (B − A). ``direction`` says whether the change is
``worse`` or ``better`` for the run's speed, or ``same`` when it is below
``diff.time_noise_ratio`` (2%, relative, times) or ``diff.ratio_noise`` (1 point, ratios) —
small enough to be noise on most machines; the renderers only colour with it.
Communication is compared by the names of the dominant collectives
(``RankSummary.evidence.comm_names``); the Diagnosis holds no byte counts.
"""

from __future__ import annotations

from dataclasses import field

from gpudiag._support.records import dataclass
from gpudiag.analysis.compare.baseline import (
    describe_fingerprint_difference,
    fingerprint,
    step_samples_and_basis,
    step_time_stats,
)
from gpudiag.analysis.model.diagnosis import Diagnosis, Mode, RankSummary, RunSummary
from gpudiag.config import DiffRules, Thresholds


@dataclass(frozen=True)
class DiffRow:
    """One metric of one scope (``run`` or ``rank N``) in A and B."""

    scope: str
    rank: int | None
    metric: str
    unit: str  # "ns" or "ratio"
    a: float | None
    b: float | None
    change: float | None  # relative for ns, absolute difference for ratios
    direction: str  # worse, better, same, n/a
    lower_is_better: bool = True


@dataclass(frozen=True)
class RunDiff:
    """Every compared row, plus what appeared or vanished (collectives, findings)."""

    a: str
    b: str
    rows: list[DiffRow]
    comm: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# (metric, unit, lower is better)
_METRICS: list[tuple[str, str, bool]] = [
    ("step_time_median", "ns", True),
    ("step_time_p90", "ns", True),
    ("compute_share", "ratio", False),
    ("comm_wait_share", "ratio", True),
    ("data_wait_share", "ratio", True),
    ("other_share", "ratio", True),
    ("idle_ratio", "ratio", True),
]


def _values(
    s: RunSummary | RankSummary, d: Diagnosis | None = None, th: Thresholds | None = None
) -> dict[str, float | None]:
    out = {
        "step_time_median": float(s.step_time_ns_median),
        "step_time_p90": float(s.step_time_ns_p90),
        "compute_share": s.shares.compute,
        "comm_wait_share": s.shares.comm_wait_shown,  # None: not measured
        "data_wait_share": s.shares.data_wait,
        "other_share": s.shares.other,
        "idle_ratio": s.idle_ratio,
    }
    if d is not None:
        # The run's step time is the gate's: per-step job times (slowest rank), steady steps.
        median, p90, _ = step_time_stats(d, None, th)
        if median is not None and p90 is not None:
            out["step_time_median"], out["step_time_p90"] = median, p90
    return out


def _basis_note(a: Diagnosis, b: Diagnosis, th: Thresholds | None) -> str:
    """Which window each step time rests on (the run rows may be telemetry, ranks never)."""
    ba, bb = step_samples_and_basis(a, None, th)[1], step_samples_and_basis(b, None, th)[1]
    run = ba if ba == bb else f"A: {ba}, B: {bb}"
    ra, rb = (_rank_basis(x) for x in (a, b))
    ranks = ra if ra == rb else f"A: {ra}, B: {rb}"
    return (
        f"step times: the run rows are the steady job step (the slowest rank each step) "
        f"over the {run}; the rank rows, each rank's {ranks}"
    )


def _rank_basis(d: Diagnosis) -> str:
    """What a diagnosis's rank rows rest on: the profiled window, or the steady telemetry."""
    return (
        "steady steps (telemetry: no profiled window)"
        if d.run.mode == Mode.TELEMETRY
        else "steps in the profiled window"
    )


def _row(
    scope: str,
    rank: int | None,
    metric: str,
    unit: str,
    lower: bool,
    a: float | None,
    b: float | None,
    rules: DiffRules,
) -> DiffRow:
    if a is None or b is None:
        return DiffRow(scope, rank, metric, unit, a, b, None, "n/a", lower)
    if unit == "ns":
        change = b / a - 1.0 if a > 0 else None
        noise = rules.time_noise_ratio
    else:
        change = b - a
        noise = rules.ratio_noise
    if change is None or abs(change) < noise:
        direction = "same"
    else:
        direction = "worse" if (change > 0) == lower else "better"
    return DiffRow(scope, rank, metric, unit, a, b, change, direction, lower)


def diff(
    a: Diagnosis,
    b: Diagnosis,
    a_name: str = "A",
    b_name: str = "B",
    rules: DiffRules | None = None,
    th: Thresholds | None = None,
) -> RunDiff:
    """Compare run summaries, then each rank present in either run.

    The run's median and p90 step time come from
    :func:`gpudiag.analysis.compare.baseline.step_time_stats` (the gate's numbers); ``th``
    gives its steady-step rule.
    """
    rules = rules or DiffRules()
    notes = []
    fa, fb = fingerprint(a), fingerprint(b)
    if fa != fb:
        notes.append(
            f"different setups (A vs B: {describe_fingerprint_difference(fa, fb)}); "
            "differences may come from that"
        )
    va_run, vb_run = _values(a.run, a, th), _values(b.run, b, th)
    notes.append(_basis_note(a, b, th))
    rows = [_row("run", None, m, u, lo, va_run[m], vb_run[m], rules) for m, u, lo in _METRICS]
    ra = {r.rank: r for r in a.ranks}
    rb = {r.rank: r for r in b.ranks}
    for rank in sorted(set(ra) | set(rb)):
        va = _values(ra[rank]) if rank in ra else {}
        vb = _values(rb[rank]) if rank in rb else {}
        rows += [
            _row(f"rank {rank}", rank, m, u, lo, va.get(m), vb.get(m), rules)
            for m, u, lo in _METRICS
        ]
    comm = []
    for rank in sorted(set(ra) & set(rb)):
        na = list(ra[rank].evidence.comm_names or [])
        nb = list(rb[rank].evidence.comm_names or [])
        if na != nb:
            comm.append(f"rank {rank}: dominant collectives {na or ['none']} → {nb or ['none']}")
    ka = {(f.kind, tuple(f.ranks)): f for f in a.findings}
    kb = {(f.kind, tuple(f.ranks)): f for f in b.findings}
    findings = [f"new in B: {kb[k].message}" for k in kb if k not in ka]
    findings += [f"gone in B: {ka[k].message}" for k in ka if k not in kb]
    return RunDiff(a_name, b_name, rows, comm, findings, notes)
