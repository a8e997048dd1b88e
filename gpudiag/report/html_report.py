r"""One self-contained HTML file (template + embedded JSON, no CDN).

Charts are inline SVG drawn here in Python, so the page needs no script to render and works
offline. The Diagnosis is embedded as ``<script type="application/json" id="diagnosis">``
for anyone who wants the numbers, every ``<`` written as ``\u003c`` so that ``</`` cannot
end it. Every value that comes from the Diagnosis is HTML-escaped where it is written —
names and messages, and numbers too (a saved diagnosis is checked on load, but a renderer
does not rely on that: a "rank" that turns out to be ``<script>`` is shown as text).
"""

from __future__ import annotations

import json
from collections import defaultdict
from html import escape
from typing import Any, TextIO

from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    SHARE_KEYS,
    Diagnosis,
    Finding,
    FindingKind,
    StepBreakdown,
)
from gpudiag.analysis.model.metrics import LateArrivalMetrics, StragglerMetrics
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.run import modes
from gpudiag.analysis.run.collectives import collective_type
from gpudiag.report.format import (
    COLLECTIVE_HEAD,
    NOT_MEASURED,
    WHOLE_RUN_HEAD,
    WHOLE_RUN_TITLE,
    collective_rows,
    collectives_title,
    efficiency_lines,
    flagged,
    idle_threshold,
    kernel_base,
    last_rank_waits,
    mode_label,
    no_efficiency,
    pct,
    recommendation_title,
    split_withheld,
    spread_and_what_if,
    step_time_scope,
    whole_run_line,
    whole_run_rows,
    window_label,
    withheld_ranks,
)

COLORS = {"compute": "#2e7d32", "comm_wait": "#1565c0", "data_wait": "#ef6c00", "other": "#9e9e9e"}
LABELS = {
    "compute": "compute",
    "comm_wait": "comm-wait",
    "data_wait": "data-wait",
    "other": "other",
}
MAX_RANKS = 32  # charts per rank beyond this would make an unreadable page
MAX_STEPS = 300  # per rank, the first ones

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1200px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;text-align:right;
border-bottom:1px solid #eee}th{background:#f5f5f5}td.l,th.l{text-align:left}
.bad{color:#c62828;font-weight:600}
.verdict{font-size:17px;margin:6px 0}.verdict.ok b{color:#2e7d32}
.muted{color:#777}.legend span{display:inline-block;
margin-right:14px}.sw{display:inline-block;width:11px;height:11px;margin-right:4px;
vertical-align:-1px}.sev-error{color:#c62828}.sev-warning{color:#b26a00}.sev-info{color:#666}
svg{display:block;margin:2px 0 10px}svg text{font:11px system-ui,sans-serif;fill:#444}
.chart-title{font-weight:600;margin-top:8px}
table.kernels{table-layout:fixed;width:100%}table.kernels th:first-child{width:auto}
table.kernels th:nth-child(2){width:9em}table.kernels th:nth-child(n+3){width:6.5em}
.kname{display:block;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.kinds{margin:0 0 6px}
"""


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _ms(ns: float | None) -> str:
    return _e(duration(ns))


def _pct(x: float | None) -> str:
    return _e(pct(x))


def _parts(s: StepBreakdown) -> list[tuple[str, int]]:
    return [
        ("compute", s.compute_ns),
        ("comm_wait", s.comm_wait_ns),
        ("data_wait", s.data_wait_ns),
        ("other", s.other_ns),
    ]


def _legend() -> str:
    items = "".join(
        f'<span><i class="sw" style="background:{COLORS[k]}"></i>{LABELS[k]}</span>'
        for k in SHARE_KEYS
    )
    return f'<div class="legend">{items}</div>'


def _stacked_bars(rank: int, steps: list[StepBreakdown], max_ns: int) -> str:
    """One vertical bar per step, stacked compute / comm-wait / data-wait / other."""
    h, w_axis = 140, 60
    bw = max(3, min(24, 900 // max(1, len(steps))))
    width = max(w_axis + bw * len(steps) + 10, 220)
    out = [
        f'<svg class="bars" data-rank="{_e(rank)}" width="{width}" height="{h + 20}" '
        f'role="img" aria-label="rank {_e(rank)} step breakdown">'
    ]
    out.append(f'<text x="0" y="12">{_ms(max_ns)}</text><text x="0" y="{h}">0</text>')
    for i, s in enumerate(steps):
        x = w_axis + i * bw
        y = float(h)
        for key, ns in _parts(s):
            bh = h * ns / max_ns if max_ns else 0.0
            if bh <= 0:
                continue
            y -= bh
            tip = (
                f"rank {rank} step {s.step}: {LABELS[key]} {duration(ns)} of "
                f"{duration(s.duration_ns)}"
            )
            out.append(
                f'<rect x="{x}" y="{y:.2f}" width="{bw - 1}" height="{bh:.2f}" '
                f'fill="{COLORS[key]}"><title>{_e(tip)}</title></rect>'
            )
    first, last = steps[0].step, steps[-1].step
    label = f"step {first}" if first == last else f"steps {first}–{last}"
    out.append(f'<text x="{w_axis}" y="{h + 15}">{_e(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def _timeline(by_rank: dict[int, list[StepBreakdown]]) -> str:
    """Steps placed at their start time, one row per rank, each split by its four parts."""
    starts = [s.start_ns for ss in by_rank.values() for s in ss]
    ends = [s.start_ns + s.duration_ns for ss in by_rank.values() for s in ss]
    t0, t1 = min(starts), max(ends)
    span = max(1, t1 - t0)
    row_h, left, plot_w = 18, 60, 1000
    height = row_h * len(by_rank) + 24
    out = [
        f'<svg class="timeline" width="{left + plot_w + 10}" height="{height}" role="img" '
        'aria-label="steps on a timeline per rank">'
    ]
    for row, (rank, steps) in enumerate(sorted(by_rank.items())):
        y = row * row_h + 2
        out.append(f'<text x="0" y="{y + 12}">rank {_e(rank)}</text>')
        for s in steps:
            x = left + plot_w * (s.start_ns - t0) / span
            total = max(1, s.duration_ns)
            for key, ns in _parts(s):
                w = plot_w * (s.duration_ns / span) * (ns / total)
                if w <= 0:
                    continue
                tip = (
                    f"rank {rank} step {s.step} ({duration(s.duration_ns)}): {LABELS[key]} "
                    f"{duration(ns)}"
                )
                out.append(
                    f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" '
                    f'fill="{COLORS[key]}"><title>{_e(tip)}</title></rect>'
                )
                x += w
    out.append(f'<text x="{left}" y="{height - 4}">0</text>')
    out.append(
        f'<text x="{left + plot_w}" y="{height - 4}" text-anchor="end">{_ms(span)}</text></svg>'
    )
    return "".join(out)


def _rank_medians(d: Diagnosis) -> str:
    """Median step time per rank as horizontal bars: the straggler view."""
    ranks = sorted(d.ranks, key=lambda r: r.rank)[:MAX_RANKS]
    top = max((r.step_time_ns_median for r in ranks), default=0) or 1
    row_h, left, plot_w = 18, 60, 600
    out = [
        f'<svg class="medians" width="{left + plot_w + 90}" height="{row_h * len(ranks) + 4}" '
        'role="img" aria-label="median step time per rank">'
    ]
    for i, r in enumerate(ranks):
        w = plot_w * r.step_time_ns_median / top
        y = i * row_h + 2
        out.append(
            f'<text x="0" y="{y + 12}">rank {_e(r.rank)}</text>'
            f'<rect x="{left}" y="{y}" width="{w:.2f}" height="{row_h - 4}" fill="#5c6bc0">'
            f"<title>rank {_e(r.rank)}: median {_ms(r.step_time_ns_median)}</title></rect>"
            f'<text x="{left + w + 6:.2f}" y="{y + 12}">'
            f"{_ms(r.step_time_ns_median)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _table(head: list[str], rows: list[list[str]], left: int = 1, cls: str = "") -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(head))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><tr>{th}</tr>{body}</table>"


def _verdict(d: Diagnosis) -> str:
    """The verdict line, first on the page, and what it rests on."""
    v = d.verdict
    if not v:
        return ""
    cls = "verdict ok" if v.bottleneck == "none" else "verdict"
    basis = _e(v.basis)
    return (
        f'<p class="{cls}"><b>{_e(v.headline)}</b> '
        f'<span class="muted">(from the {basis})</span></p>'
    )


def _whole_run_line(d: Diagnosis) -> str:
    """The whole run's step time, and why it differs from the profiled window's (as the console)."""
    line = whole_run_line(d)
    return f'<p class="whole-run">{_e(line)}</p>' if line else ""


def _labelled(label: str, text: str, cls: str) -> str:
    return f'<p class="{cls}"><b>{_e(label)}:</b> {_e(text)}</p>'


def _spread_and_what_if(d: Diagnosis) -> str:
    """The console's lines under the rank table: spread across ranks, GPU metrics, what-if."""
    return "".join(
        _labelled(label, text, "what-if" if label == "what if" else "spread")
        for label, text in spread_and_what_if(d)
    )


def _step_kinds(d: Diagnosis) -> str:
    """Both kinds of step when the steps are bimodal (the median describes neither)."""
    kinds = modes.describe([s.duration_ns for s in d.steps], duration, d.thresholds)
    return f'<p class="kinds">{_e(kinds)}</p>' if kinds else ""


def _straggler_steps(f: Finding) -> str:
    """In how many of the compared steps the straggler was slow (its steps when listed)."""
    m = f.metrics
    if isinstance(m, StragglerMetrics):
        listed = f" ({words.fold(f.steps)})" if f.steps else ""
        return f"{m.slow_steps} of {m.steps_compared}{listed}"
    if isinstance(m, LateArrivalMetrics):
        return f"last at {m.last_at} of {m.collectives_matched} collectives"
    return words.fold(f.steps) if f.steps else "-"


def _kernels(d: Diagnosis) -> str:
    """The run's top kernels or operators, with family and share."""
    k = d.kernels
    if not k or not k.top:
        return ""
    unit = "operator" if k.unit == "operator" else "kernel"
    # long (cuDNN, CUTLASS) names are cut with an ellipsis; the full name is the tooltip
    rows = [
        [
            f'<span class="kname" title="{_e(e.name)}">{_e(e.name)}</span>',
            _e(e.family),
            _ms(int(e.time_ns)),
            _e(e.count),
            _pct(float(e.share)),
        ]
        for e in k.top
    ]
    fams = " · ".join(f"{_e(f)} {_pct(float(v))}" for f, v in k.families.items())
    return (
        f"<h2>Top {unit}s by {'CPU' if unit == 'operator' else 'GPU'} time, all ranks</h2>"
        + f'<p class="muted kernel-base">{_e(kernel_base(k))}</p>'
        + _table([unit, "family", "time", "count", "share"], rows, left=2, cls="kernels")
        + (f'<p class="muted">by family: {fams}</p>' if fams else "")
        + _efficiency(d)
    )


def _efficiency(d: Diagnosis) -> str:
    """The compute efficiency lines, as the console words them."""
    if d.efficiency is None:
        why = no_efficiency(d)
        return f'<p class="muted efficiency">efficiency: {_e(why)}</p>' if why else ""
    return "".join(
        f'<p class="muted efficiency">{_e(first.strip() + " " + text)}</p>'
        for first, text in efficiency_lines(d.efficiency)
    )


def _gpu_section(d: Diagnosis) -> str:
    whole = getattr(d, "whole_run", None)
    gpus = list(getattr(whole, "gpus", None) or [])
    if not gpus:
        return (
            '<p class="muted">No NVML samples in this diagnosis (CPU run, NVML unavailable, '
            "or traces analysed without a run directory).</p>"
        )
    rows = [
        [
            _e(g.gpu_uuid),
            _e("" if g.rank is None else g.rank),
            _e(g.samples),
            _pct(g.util_ratio),
            _pct(g.mem_util_ratio),
            "n/a" if g.power_w is None else _e(f"{g.power_w:.0f} W"),
            _pct(g.slowdown_ratio),
        ]
        for g in gpus
    ]
    return _table(["GPU", "rank", "samples", "util", "mem util", "power", "slowdown"], rows) + (
        '<p class="muted">Averages over the run; the diagnosis does not keep the samples as a '
        "time series.</p>"
    )


def _readable(name: str) -> str:
    """A collective as the console's table names it (``allreduce``), the raw name on hover."""
    if not name:
        return ""
    kind = collective_type(name)
    shown = name if kind in ("other", "unknown") else kind
    return f'<span title="{_e(name)}">{_e(shown)}</span>'


def _doc_json(d: Diagnosis) -> str:
    # Every "<" as \u003c: no "</script>" or "<!--" from a trace can end or confuse the
    # element, and JSON.parse / json.loads read the same string back.
    text = json.dumps(d.to_json(), allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c")


def render(d: Diagnosis, out: TextIO, **_: Any) -> None:
    """Write the whole page."""
    shown = _shown_steps(d)
    p = _head(d) + _rank_section(d)
    p.append(_kernels(d))
    p.append("<h2>Where each step's time goes, per rank</h2>" + _legend())
    if withheld_ranks(d):
        p.append(
            f'<p class="muted">{_e(words.ranks(sorted(withheld_ranks(d))).capitalize())}: '
            f"{NOT_MEASURED}, the split of step time is withheld.</p>"
        )
    max_ns = max((s.duration_ns for ss in shown.values() for s in ss), default=0)
    for rank, steps in shown.items():
        p.append(f'<div class="chart-title">rank {_e(rank)}</div>')
        p.append(_stacked_bars(rank, steps, max_ns))
    if shown:
        p.append("<h2>Steps on a timeline</h2>" + _legend())
        p.append(
            '<p class="muted">Each step at its start time; its four parts are drawn in '
            "proportion, not at the instants they happened.</p>"
        )
        p.append(_timeline(shown))
    p += _straggler_section(d)
    rows = whole_run_rows(d)
    if rows:
        p.append(
            f"<h2>Whole run</h2><p><b>{_e(WHOLE_RUN_TITLE)}</b></p>"
            + _table(WHOLE_RUN_HEAD, [[_e(c) for c in r] for r in rows], left=0)
        )
    p.append("<h2>GPU utilisation (NVML)</h2>" + _gpu_section(d))
    p += _findings_section(d)
    p += _tail(d)
    out.write("\n".join(p))


def _shown_steps(d: Diagnosis) -> dict[int, list[StepBreakdown]]:
    """The steps drawn: the first MAX_RANKS ranks, each its first MAX_STEPS steps."""
    by_rank: dict[int, list[StepBreakdown]] = defaultdict(list)
    for s in d.steps:
        by_rank[s.rank].append(s)
    shown = dict(sorted(by_rank.items())[:MAX_RANKS])
    for k in shown:
        shown[k] = sorted(shown[k], key=lambda s: s.step)[:MAX_STEPS]
    gone = withheld_ranks(d)  # their split is not measured: nothing to draw
    return {k: v for k, v in shown.items() if k not in gone}


def _head(d: Diagnosis) -> list[str]:
    """The document head, the verdict and the run's line."""
    r = d.run
    flags = flagged(d)
    thr = idle_threshold(d)
    return [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width">',
        f"<title>gpudiag report: {_e(r.ranks)} ranks, {_e(r.steps)} steps</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>gpudiag report</h1>",
        _verdict(d),
        f"<p>{_e(words.plural(r.ranks, 'rank'))}"
        + (f" of {_e(r.world_size)}" if r.world_size and r.world_size != r.ranks else "")
        + f" · {_e(mode_label(r.mode))} · {_e(window_label(r.mode))}: "
        f"{_e(words.plural(r.steps, 'step'))}, step time median "
        f"<b>{_ms(r.step_time_ns_median)}</b>, p90 {_ms(r.step_time_ns_p90)}"
        f"{_e(step_time_scope(d))} · "
        + (
            _e(f"shares and idle {NOT_MEASURED}: the split of step time is withheld")
            if split_withheld(d)
            else f'non-compute idle <b class="{"bad" if (None, "idle") in flags else ""}">'
            f"{_pct(r.idle_ratio)}</b>"
            + (f" (above {thr:.0%})" if thr is not None and (None, "idle") in flags else "")
            + (f" · GPU idle {_pct(r.gpu_idle_ratio)}" if r.gpu_idle_ratio is not None else "")
        )
        + f" · gpudiag {_e(d.gpudiag_version)}</p>",
        _step_kinds(d),
        _whole_run_line(d),
    ]


def _rank_section(d: Diagnosis) -> list[str]:
    flags = flagged(d)
    gone = withheld_ranks(d)
    rows = [
        [_e(x.rank), _e(x.steps), _ms(x.step_time_ns_median), _ms(x.step_time_ns_p90)]
        + (
            ["-"] * 6
            if x.rank in gone
            else [
                _pct(x.shares.compute),
                _pct(x.shares.comm_wait_shown),
                _pct(x.shares.data_wait),
                _pct(x.shares.other),
                f'<span class="{"bad" if (x.rank, "idle") in flags else ""}">'
                f"{_pct(x.idle_ratio)}</span>",
                _pct(x.gpu_idle_ratio) if x.gpu_idle_ratio is not None else "-",
            ]
        )
        + [_e(", ".join(x.devices) or "-")]
        for x in d.ranks[:MAX_RANKS]
    ]
    p = [
        "<h2>Ranks</h2>"
        + _table(
            [
                "rank",
                "steps",
                "median",
                "p90",
                "compute",
                "comm-wait",
                "data-wait",
                "other",
                "non-compute idle",
                "GPU idle",
                "device",
            ],
            rows,
            left=0,
        )
    ]
    if d.run.steps:
        p.append(_spread_and_what_if(d))
    if gone:
        p.append(
            f'<p class="muted">A dash: {NOT_MEASURED}, the split of step time is withheld.</p>'
        )
    if len(d.ranks) > MAX_RANKS:
        p.append(f'<p class="muted">{len(d.ranks) - MAX_RANKS} more ranks not drawn.</p>')
    return p


def _straggler_section(d: Diagnosis) -> list[str]:
    p = ["<h2>Stragglers</h2>"]
    strag = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    if strag:
        p.append(
            _table(
                ["ranks", "steps", "finding"],
                [[_e(words.fold(f.ranks)), _e(_straggler_steps(f)), _e(f.message)] for f in strag],
                left=3,
            )
        )
    else:
        p.append('<p class="muted">No straggler findings.</p>')
    p.append('<div class="chart-title">median step time per rank</div>' + _rank_medians(d))
    return p


def _findings_section(d: Diagnosis) -> list[str]:
    p = ["<h2>Findings</h2>"]
    if d.findings:
        p.append(
            "<ul>"
            + "".join(
                f'<li class="sev-{_e(f.severity)}"><b>{_e(f.severity)}</b> {_e(f.message)}</li>'
                for f in d.findings
            )
            + "</ul>"
        )
    else:
        p.append("<p>No findings: compute dominates every rank's step time.</p>")
    if d.recommendations:
        p.append(
            "<h2>Recommendations</h2><ul>"
            + "".join(
                f'<li class="remedy"><b>{_e(recommendation_title(d, x))}</b>: {_e(x.detail)}</li>'
                for x in d.recommendations
            )
            + "</ul>"
        )
    return p


def _tail(d: Diagnosis) -> list[str]:
    """Collectives, inputs and notes, and the Diagnosis itself as JSON."""
    p = []
    gone = withheld_ranks(d)
    comm = [
        [
            _e(x.rank),
            _readable(x.evidence.comm_top or ""),
            ", ".join(_readable(n) for n in x.evidence.comm_names or []),
        ]
        + (
            ["-", "-"]
            if x.rank in gone
            else [_pct(x.shares.comm_wait_shown), _pct(x.comm_overlapped_ratio)]
        )
        for x in d.ranks[:MAX_RANKS]
        if x.evidence.comm_names
    ]
    if comm or (d.collectives is not None and d.collectives.by_type):
        p.append("<h2>Collectives</h2>")
    if d.collectives is not None and d.collectives.by_type:
        p.append(f"<p><b>{_e(collectives_title(d))}</b></p>")
        p.append(
            _table(
                COLLECTIVE_HEAD,
                [[_e(c) for c in row] for row in collective_rows(d)],
                left=2,
                cls="collectives",
            )
        )
        waits = last_rank_waits(d, MAX_RANKS)
        if waits is not None:
            p.append(_labelled(*waits, "muted last-rank"))
    if comm:
        p.append(
            _table(["rank", "dominant", "top collectives", "comm-wait", "overlapped"], comm, left=3)
        )
    if d.notes or d.inputs:
        p.append(
            "<h2>Inputs and notes</h2><ul>"
            + "".join(f"<li>{_e(n)}</li>" for n in d.notes)
            + "".join(f'<li class="muted">{_e(i)}</li>' for i in d.inputs[:64])
            + "</ul>"
        )
    p.append(f'<script type="application/json" id="diagnosis">{_doc_json(d)}</script>')
    p.append("</body></html>\n")
    return p
