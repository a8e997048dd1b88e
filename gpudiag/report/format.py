"""How numbers read in every renderer (durations, percentages), and which cells the findings flag.

Renderers never re-judge a threshold: a table cell is highlighted because a finding of
the Diagnosis names that rank and that quantity, with the finding's severity.
"""

from __future__ import annotations

from gpudiag.analysis.model.diagnosis import Diagnosis, FindingKind, Severity
from gpudiag.analysis.model.metrics import LimitedEvidenceMetrics, ShareMetrics
from gpudiag.analysis.rank.evidence import WITHHOLD

# The column of the per-rank table that each share finding speaks about.
FLAG_COLUMNS = {
    FindingKind.IDLE_RATIO: "idle",
    FindingKind.DATA_BOUND: "data_wait",
    FindingKind.COMM_BOUND: "comm_wait",
    FindingKind.HOST_BOUND: "other",
}


# A figure of the split of step time that a limit withholds (a sampled trace, no GPU work …)
NOT_MEASURED = "not measured"


def withheld_ranks(d: Diagnosis) -> frozenset[int]:
    """The ranks whose split of step time a limit withholds (``limited_evidence``, withhold).

    Their shares, idle ratios, overlap and waits for the last rank rest on time the trace
    did not see: every renderer shows them as not measured, or leaves them out. The JSON
    keeps its numbers (its contract); ``verdict.limits`` and the findings say why.
    """
    return frozenset(
        r
        for f in d.findings
        if isinstance(f.metrics, LimitedEvidenceMetrics) and f.metrics.effect == WITHHOLD
        for r in f.ranks
    )


def split_withheld(d: Diagnosis) -> bool:
    """Every rank's split is withheld: the run's shares and idle ratios are not measured."""
    gone = withheld_ranks(d)
    return bool(gone) and all(r.rank in gone for r in d.ranks)


def whole_run_steps(d: Diagnosis) -> tuple[int, int] | None:
    """(steady steps per rank, the ranks' middle median step time) from the telemetry, or None.

    The middle of the per-rank medians (the upper one of an even count), as every renderer
    shows it.
    """
    if d.whole_run is None or not d.whole_run.ranks:
        return None
    wr = d.whole_run.ranks
    return max(x.steps for x in wr), sorted(x.step_time_ns_median for x in wr)[len(wr) // 2]


def step_time_scope(d: Diagnosis) -> str:
    """What the header's step-time median and p90 are over, when a table row may differ.

    Both come from one function (``analysis.summary.step_time_stats``): the header's over
    every analysed (rank, step), each row's over its rank's steps. With one rank they are
    the same; with several the header says so (`` over all ranks' steps``).
    """
    return " over all ranks' steps" if sum(1 for r in d.ranks if r.steps) > 1 else ""


def pct(x: float | None, digits: int = 1) -> str:
    """A ratio as a percentage (``n/a`` when unknown); never ``-0.0%``."""
    if x is None:
        return "n/a"
    text = f"{x * 100:.{digits}f}%"
    return text[1:] if text.startswith("-") and float(text[:-1]) == 0 else text


def flagged(d: Diagnosis) -> dict[tuple[int | None, str], Severity]:
    """(rank, column) → the most severe finding about it; rank ``None`` is the run line.

    The run's idle is flagged when an ``idle_ratio`` finding exists and the run's own idle
    is above the finding's threshold (a rank above it does not make the run line say
    "above 30%" beside 28.7%).
    """
    out: dict[tuple[int | None, str], Severity] = {}
    for f in d.findings:
        col = FLAG_COLUMNS.get(f.kind)
        if col is None:
            continue
        keys: list[tuple[int | None, str]] = [(r, col) for r in f.ranks]
        if f.kind == FindingKind.IDLE_RATIO and (
            not isinstance(f.metrics, ShareMetrics) or d.run.idle_ratio > f.metrics.threshold
        ):
            keys.append((None, col))
        sev = Severity(f.severity)
        for k in keys:
            if k not in out or sev.order < out[k].order:
                out[k] = sev
    return out


def idle_threshold(d: Diagnosis) -> float | None:
    """The idle limit the idle finding was judged against, if there is one."""
    for f in d.findings:
        if f.kind == FindingKind.IDLE_RATIO and isinstance(f.metrics, ShareMetrics):
            return f.metrics.threshold
    return None


def mode_label(mode: str) -> str:
    """What the classification was made from, for a report's first line."""
    return {
        "gpu": "GPU trace",
        "cpu": "CPU trace",
        "mixed": "GPU and CPU traces",
        "telemetry": "step telemetry (no trace)",
    }.get(str(mode), str(mode))


def window_label(mode: str) -> str:
    """What the step statistics of the first lines were taken over."""
    return "every step (telemetry)" if str(mode) == "telemetry" else "profiled window"
