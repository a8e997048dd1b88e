"""How numbers read in every renderer (durations, percentages), and which cells the findings flag.

Renderers never re-judge a threshold: a table cell is highlighted because a finding of
the Diagnosis names that rank and that quantity, with the finding's severity.
"""

from __future__ import annotations

from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Diagnosis,
    FindingKind,
    KernelBreakdown,
    RankSync,
    Recommendation,
    Severity,
    WhatIfFigures,
)
from gpudiag.analysis.model.efficiency import ComputeEfficiency, FamilyEfficiency
from gpudiag.analysis.model.metrics import LimitedEvidenceMetrics, ShareMetrics
from gpudiag.analysis.model.words import duration
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


NO_SHAPES = (
    "not measured: the trace records no operator input shapes (PyTorch Profiler: "
    "record_shapes=True; Nsight Systems traces carry none)"
)
NO_EFFICIENCY: dict[str, str] = {  # a GPU rank's evidence.efficiency_gap → the line
    "no_shapes": NO_SHAPES,
    "no_device": "not measured: the trace names no GPU model (no deviceProperties), so no "
    "peak to compare with",
    "unmodelled": "not measured: no kernel of the analysed steps is tied to an operator "
    "whose shapes gpudiag models (GEMM, convolution, attention, normalisation, elementwise)",
}


def no_efficiency(d: Diagnosis) -> str | None:
    """Why a GPU run has no efficiency line, worded; None when it has one or is no GPU run."""
    if d.efficiency is not None or str(d.run.mode) != "gpu":
        return None
    gaps = [r.evidence.efficiency_gap for r in d.ranks if r.evidence.efficiency_gap]
    return NO_EFFICIENCY[gaps[0]] if gaps else NO_SHAPES


def _rate(v: float, unit: str) -> str:
    return f"{v:.3g} {unit}" if v < 100 else f"{v:,.0f} {unit}"


EFFICIENCY_TEXT = 80 - len("efficiency: ")


def _families_text(fams: list[FamilyEfficiency], eq: str, rated: bool) -> str:
    """The families' rates, each with its share of peak after ``eq``."""
    parts = []
    for f in fams:
        if f.tflops is not None:
            rate = f"{f.family} {f.path or '?'} {_rate(f.tflops, 'TFLOP/s')}"
        elif f.gbps is not None:
            rate = f"{f.family} {_rate(f.gbps, 'GB/s')}"
        else:
            continue
        if f.peak_share is not None:
            rate += f"{eq}{f.peak_share:.0%}"
        elif f.above_peak:
            rate += " (above the peak table)"
        parts.append(rate)
    if not parts:
        return ""
    rated = rated and any(f.peak_share is not None for f in fams)
    return " · ".join(parts) + (" of peak" if rated else "")


def efficiency_lines(e: ComputeEfficiency) -> list[tuple[str, str]]:
    """The run's compute efficiency in two lines of at most 80 columns: families, then MFU.

    Each line is (label, text): the two families with the most kernel time (a stray family
    under 5% of it is left out; their shares written "= 4%", else "4%", else the first family
    alone, whichever fits), then the model-level figure. A share of peak is printed
    only when the device's peak is known and the figure is within it.
    """
    total = sum(f.kernel_ns for f in e.families)
    shown = [f for f in e.families if f.kernel_ns >= 0.05 * total]  # not a stray scalar op
    top = sorted(shown, key=lambda f: -f.kernel_ns)[:2]
    rated = any(f.peak_share is not None for f in top)
    # the first that fits 80 columns after its label: "= 4%", then "4%", then one family
    texts = [_families_text(top, " = ", rated), _families_text(top, " ", rated)]
    texts.append(_families_text(top[:1], " = ", rated))
    text = next((t for t in texts if len(t) <= EFFICIENCY_TEXT), texts[-1])
    lines = [("efficiency: ", text)] if text else []
    where = e.peak_model or f"{e.device}: no peak known"
    if e.model_tflops is not None:
        mfu = f"MFU {e.mfu:.1%} ({where}, {e.mfu_path})" if e.mfu is not None else where
        model = f"{mfu} · model {_rate(e.model_tflops, 'TFLOP/s')} · {e.coverage:.0%}"
        long = f"{model} of kernel time modelled"
        lines.append(("  ", long if len(long) <= 78 else f"{model} modelled"))
    elif lines:
        lines.append(("  ", where))
    return lines


# ---- lines every renderer shows alike (console, Markdown, HTML) ----


def kernel_base(k: KernelBreakdown) -> str:
    """What the top kernels' (operators') shares and the families' are shares of."""
    if k.unit == "operator":
        return (
            f"shares of all {duration(k.total_ns)} of operator self CPU time, "
            "communication and copies included"
        )
    return (
        f"shares of all {duration(k.total_ns)} of GPU time in kernels, copies and memsets, "
        "communication included"
    )


def recommendation_title(d: Diagnosis, rec: Recommendation) -> str:
    """A remedy's title with its gain per step and the remedies it is not additive with."""
    title = rec.title
    if rec.estimated_gain_ns:
        # a gain on the mean step: the median step does not pay what the remedy acts on
        on = (
            " on the mean step; the median step does not wait"
            if rec.evidence.get("gain_statistic") == "mean"
            else ""
        )
        title += f" (could recover ~{duration(rec.estimated_gain_ns)} per step{on})"
    if rec.overlaps_with:
        by_id = {r.id: r.title.split(":")[0].split(" (")[0] for r in d.recommendations}
        title += "; not additive with " + ", ".join(
            f"“{by_id.get(i, i)}”" for i in rec.overlaps_with
        )
    return title


def whole_run_line(d: Diagnosis) -> str | None:
    """The whole run's step time, and why it differs from the profiled window's."""
    whole = whole_run_steps(d)
    if whole is None:
        return None
    n, med = whole
    line = (
        f"whole run (telemetry): {words.plural(n, 'steady step')} per rank · step time "
        f"median {duration(med)}"
    )
    window = d.run.step_time_ns_median
    if not d.steps or not window or str(d.run.mode) == "telemetry":
        return line
    rel = med / window - 1
    how = (
        f"{abs(rel):.0%} {'below' if rel < 0 else 'above'} the profiled window's"
        if round(rel, 2)
        else "as in the profiled window's"
    )
    steps = words.fold(sorted({s.step for s in d.steps}))
    return (
        f"{line} ({how} {duration(window)}: the window is steps {steps}, under the profiler; "
        "the whole run leaves out the warm-up and the steps the profiler slowed: the window "
        "and the step after it)"
    )


def spread_and_what_if(d: Diagnosis) -> list[tuple[str, str]]:
    """(label, text): min/max across ranks, Nsight's GPU metrics, the what-if step times."""
    lines = []
    sp = d.spread
    if sp:
        parts = []
        # a withheld split's shares are not measured: only the step times spread
        shares = (
            ()
            if withheld_ranks(d)
            else (
                ("compute_ratio", "compute", pct),
                ("comm_wait_ratio", "comm-wait", pct),
                ("data_wait_ratio", "data-wait", pct),
            )
        )
        for key, label, fmt in (("step_time_ns_median", "step", duration), *shares):
            v = sp.get(key)
            if not v:
                continue
            lo, hi = fmt(v.min), fmt(v.max)
            if lo == hi:
                parts.append(f"{label} {lo} (every rank)")
            else:
                parts.append(f"{label} {lo} (r{v.min_rank})–{hi} (r{v.max_rank})")
        lines.append(("across ranks", " · ".join(parts)))
    gm = [(r.rank, m) for r in d.ranks if (m := r.evidence.gpu_metrics)]
    if gm:
        labels = {
            "sm_active": "SM active",
            "sm_issue": "SM issue",
            "tensor_active": "tensor active",
        }
        per = [
            f"r{rank} " + ", ".join(f"{labels.get(k, k)} {pct(v)}" for k, v in sorted(m.items()))
            for rank, m in gm
        ]
        lines.append(("GPU metrics over the steps (Nsight)", " · ".join(per)))
    what = what_if_line(d)
    if what is not None:
        lines.append(what)
    return lines


def what_if_line(d: Diagnosis) -> tuple[str, str] | None:
    """(label, text) of the what-if step times, naming the step statistic they change."""
    w = d.what_if
    if not w or not w.step_time_ns:
        return None
    # a pipeline's communication wait is its bubble, which no overlap removes
    pipe = (
        " (its waits are the pipeline's bubble)"
        if (d.collectives is not None and d.collectives.pipeline is not None)
        else ""
    )
    median = d.run.step_time_ns_median
    now = duration(w.step_time_ns)
    if w.statistic == "median":
        # the headline's median is over every (rank, step); said when it reads differently
        other = f"; the headline's, over all ranks' steps: {duration(median)}"
        base = (
            f"on the median step ({now} now, each step's slowest rank"
            + (other if median and duration(median) != now else "")
            + ")"
        )
    else:  # a file written when the what-if was on the mean step
        base = (
            f"on the mean step ({now} now: the slowest rank's, averaged over the profiled "
            "steps" + (f"; the median above is {duration(median)}" if median else "") + ")"
        )
    text = f"{base}, {_what_if_changes(w, pipe)}"
    m = w.on_mean
    if m is not None and m.step_time_ns:
        text += (
            f"; on the mean step ({duration(m.step_time_ns)} now, that of the verdict's shares), "
            f"{_what_if_changes(m, pipe)}"
        )
    return "what if", text


def _what_if_changes(w: WhatIfFigures, pipe: str) -> str:
    """The changes of one what-if statistic: 'comm fully overlapped → … · no data wait → …'."""
    cur = w.step_time_ns

    def delta(v: int | None) -> str:
        if v is None:
            return "n/a"
        change = f"{(v - cur) / cur:+.0%}"
        return f"{duration(v)} ({'no change' if change in ('+0%', '-0%') else change})"

    text = (
        f"comm fully overlapped{pipe} → {delta(w.if_comm_overlapped_ns)} · "
        if w.if_comm_overlapped_ns is not None
        else ""  # comm-wait not measured
    ) + f"no data wait → {delta(w.if_no_data_wait_ns)}"
    if w.if_straggler_at_median_speed_ns is not None:
        text += f" · straggler at median speed → {delta(w.if_straggler_at_median_speed_ns)}"
    alone = [v for v in (w.if_comm_overlapped_ns, w.if_no_data_wait_ns) if v is not None]
    if w.if_all_ns is not None and w.if_all_ns < min(alone):
        text += f" · all together → {delta(w.if_all_ns)}"
    return text


def last_rank_waits(d: Diagnosis, max_listed: int) -> tuple[str, str] | None:
    """(label, text): each rank's wait for the last rank, in total and a step, or None."""
    c = d.collectives
    if c is None:
        return None
    gone = withheld_ranks(d)  # their waits rest on time the trace did not see
    per = {r: v for r, v in c.per_rank.items() if int(r) not in gone}
    if not per:
        return None
    steps = {x.rank: x.steps for x in d.ranks}
    items = list(per.items())
    label = "waiting for the last rank"
    head = f"in total over the {c.matched} matched collectives, and a profiled step"
    if len(items) > max_listed:  # the longest waits, not a screenful of ranks
        items = sorted(items, key=lambda kv: -kv[1].sync_wait_ns)[:max_listed]
        label += f", the {max_listed} longest of {len(per)}"

    def one(r: str, v: RankSync) -> str:
        n = steps.get(int(r), 0)
        text = f"r{r} {duration(v.sync_wait_ns)}"
        if not n:
            return text
        text += f" ({duration(v.sync_wait_ns / n)} a step"
        hidden = v.exposed_wait_ns is not None and v.exposed_wait_ns < v.sync_wait_ns
        if hidden and v.exposed_wait_ns is not None:
            # compute ran beside part of it: the part that held the step, within comm-wait
            text += f"; {duration(v.exposed_wait_ns / n)} of it exposed, the rest hidden by compute"
        return text + ")"

    return label, f"{head}: " + ", ".join(one(r, v) for r, v in items)


WHOLE_RUN_TITLE = "whole run (telemetry): steady steps, neither profiled nor warm-up"
WHOLE_RUN_HEAD = ["rank", "steps", "median", "p90", "max", "data-wait"]


def whole_run_rows(d: Diagnosis) -> list[list[str]]:
    """Each rank over the whole run's steady steps, as the console's table shows it."""
    w = d.whole_run
    if w is None:
        return []
    return [
        [
            str(r.rank),
            str(r.steps),
            duration(r.step_time_ns_median),
            duration(r.step_time_ns_p90),
            duration(r.step_time_ns_max),
            pct(r.data_wait_ratio),
        ]
        for r in w.ranks
    ]


COLLECTIVE_HEAD = ["type", "size", "count", "median/call", "algbw", "busbw", "of peak"]


def collective_rows(d: Diagnosis) -> list[list[str]]:
    """The collectives by type and size, as the console's table shows them (text cells)."""
    c = d.collectives
    if c is None:
        return []
    lower = c.bandwidth_is_lower_bound
    ge = "≥" if lower else ""

    def bw(v: float | None) -> str:
        # a lower bound that rounds to nothing says nothing: n/a, not "≥0.0 GB/s"
        return "n/a" if v is None or (lower and round(v, 1) <= 0) else f"{ge}{v:.1f} GB/s"

    return [
        [
            row.type,
            row.size_bucket,
            str(row.count),
            duration(row.transfer_ns_median),
            bw(row.algbw_gbps),
            bw(row.busbw_gbps),
            "n/a"
            if row.efficiency is None or (lower and round(row.efficiency, 2) <= 0)
            else f"{ge}{row.efficiency:.0%} of {row.peak_gbps or 0:.0f}",
        ]
        for row in c.by_type
    ]


def collectives_title(d: Diagnosis) -> str:
    """How the collectives were matched across ranks (or why bandwidths are lower bounds)."""
    c = d.collectives
    assert c is not None
    how = {"comms_id": "by collective id", "order": "in issue order"}.get(c.method, c.method)
    if c.bandwidth_is_lower_bound:
        return (
            "collectives: not matched across ranks, so durations include waiting and "
            "bandwidths are lower bounds"
        )
    return f"collectives: {c.matched} matched across ranks {how}"
