"""rich tables for terminals, and golden text at a fixed width."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Diagnosis,
    KernelBreakdown,
    RankSummary,
    Severity,
    Verdict,
)
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.run import modes
from gpudiag.report.format import (
    NOT_MEASURED,
    flagged,
    idle_threshold,
    mode_label,
    split_withheld,
    step_time_scope,
    whole_run_steps,
    window_label,
    withheld_ranks,
)
from gpudiag.report.format import pct as _pct

MAX_LISTED = 8  # per-rank values listed in one line at most
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
_SEVERITY_MARK = {"error": "✗", "warning": "!", "info": "·"}
_FLAG_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold red", Severity.INFO: ""}


def make_console(out: TextIO, width: int | None = None, color: bool | None = None) -> Console:
    """A console on ``out``; fixed width and no colour give reproducible (golden) text.

    ``color=None`` follows the environment: ``NO_COLOR`` (``--no-color``) gives plain text,
    ``FORCE_COLOR`` colour even on a pipe, ``TERM=dumb`` and pipes get none. Pipes and
    files are 120 columns wide unless ``COLUMNS`` says otherwise.
    """
    if color is None and os.environ.get("NO_COLOR"):
        color = False  # plain text: no colour and no bold either
    if width is None and not (hasattr(out, "isatty") and out.isatty()):
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else 120
    return Console(
        file=out,
        width=width,
        force_terminal=color,
        no_color=True if color is False else None,
        highlight=False,
        soft_wrap=False,
        emoji=False,
    )


# A number and its unit ("368.1 ms", "12 %", "r0 1.2 ms") never break across lines.
_KEEP = re.compile(
    r"(?<=\d) (?=(?:ns|µs|ms|s|GB/s|MHz|W|°C|MiB|GiB|%)(?![\w/]))|(?<=\br\d) "
    r"|(?<=\br\d\d) |(?<=\br\d\d\d) "
)
_NBSP = "\u00a0"


def wrap(text: str, width: int, first: str = "", indent: str | None = None) -> list[str]:
    """``text`` wrapped to ``width`` after ``first``, later lines hanging at its width.

    Words are never broken, nor a number from its unit.
    """
    indent = " " * len(first) if indent is None else indent
    kept = _KEEP.sub(_NBSP, text).replace(" · ", _NBSP + "· ")  # "·" ends a line, never starts one
    lines = textwrap.wrap(
        kept,
        width=max(20, width),
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first]
    return [line.replace(_NBSP, " ") for line in lines]


def _print_wrapped(
    con: Console, first: Text, text: str, indent: str | None = None, style: str = ""
) -> None:
    """``first`` (styled) then ``text`` wrapped with a hanging indent."""
    lines = wrap(text, con.width, " " * len(first.plain), indent)
    head = first.copy()
    head.append(lines[0][len(first.plain) :], style=style)
    con.print(head)
    for line in lines[1:]:
        con.print(Text(line, style=style))


def _fit(con: Console, build: Callable[[tuple[int, int, int, int]], Table]) -> Table:
    """The table with two spaces between columns, or one when that does not fit."""
    t = build((0, 1, 0, 1))
    if _too_wide(con, t):
        t = build((0, 1, 0, 0))
    return t


# verdicts about how the run ended: they rest on the ranks' ends, not on step time
ENDED = ("hang", "mismatch", "failure", "interrupted")


def _too_wide(con: Console, t: Table) -> bool:
    return con.measure(t, options=con.options.update_width(10_000)).maximum > con.width


def _rank_table_fit(con: Console, d: Diagnosis, max_ranks: int) -> Table:
    """The rank table; on a narrow terminal without its GPU idle (the shares line has it)."""
    t = _fit(con, lambda pad: _rank_table(d, max_ranks, pad))
    if _too_wide(con, t):
        t = _fit(con, lambda pad: _rank_table(d, max_ranks, pad, gpu_idle=False))
    return t


def render(
    d: Diagnosis,
    out: TextIO,
    *,
    show_steps: bool = False,
    width: int | None = None,
    color: bool | None = None,
    max_ranks: int = 64,
) -> None:
    """Print the verdict, the run summary, the per-rank table, findings and (optionally) steps."""
    con = make_console(out, width=width, color=color)
    _summary(con, d)
    if d.run.steps:  # a diagnosis of flight-recorder dumps or stacks alone has no step
        con.print()
        con.print(_rank_table_fit(con, d, max_ranks))
        for text in _spread_and_what_if(d):
            label, _, rest = text.partition(": ")
            _print_wrapped(con, Text(f"{label}: ", style="dim"), rest, style="dim")
        _detail_tables(con, d, show_steps)
    con.print()
    _findings(con, d)
    _recommendations(con, d)
    for note in d.notes:
        _print_wrapped(con, Text("note: ", style="dim"), note, style="dim")


def _summary(con: Console, d: Diagnosis) -> None:
    """The verdict, the run's head line, its step times and shares."""
    r = d.run
    v = d.verdict
    if v:
        style = "bold green" if v.bottleneck == "none" else "bold"
        basis = "" if v.bottleneck in ENDED else f" ({_basis(v)})"
        _print_wrapped(con, Text("verdict: ", style="bold"), f"{v.headline}{basis}", style=style)
    if not r.steps:
        con.print(
            Text(f"gpudiag · {words.plural(r.ranks, 'rank')} · no step measured", style="bold")
        )
        return
    head = Text()
    head.append("gpudiag", style="bold")
    head.append(f" · {words.plural(r.ranks, 'rank')}")
    if r.world_size and r.world_size != r.ranks:
        head.append(f" of {r.world_size}")
    head.append(f" · {mode_label(r.mode)}")
    con.print(head)
    label = f"{window_label(r.mode)}: "
    _print_wrapped(
        con,
        Text(label),
        f"{words.plural(r.steps, 'step')} · step time "
        f"median {duration(r.step_time_ns_median)}, p90 "
        f"{duration(r.step_time_ns_p90)}{step_time_scope(d)}",
    )
    kinds = modes.describe([s.duration_ns for s in d.steps], duration, d.thresholds)
    if kinds:  # a median that describes neither kind of step: say both
        _print_wrapped(con, Text("  "), kinds)
    whole = whole_run_steps(d)
    if whole is not None:
        n, med = whole
        con.print(
            Text(
                f"whole run (telemetry): {words.plural(n, 'steady step')} per rank · "
                f"step time median {duration(med)}"
            )
        )
    con.print(_shares_line(d))


def _shares_line(d: Diagnosis) -> Text:
    """The run's shares, idle ratios and overlap; not measured when the split is withheld."""
    r = d.run
    idle_flag = (None, "idle") in flagged(d)
    if split_withheld(d):
        return Text(f"shares: {NOT_MEASURED}: the split of step time is withheld (see the verdict)")
    line = Text("shares: ")
    comm = _pct(r.shares.comm_wait) if r.shares.comm_measured else "not measured"
    line.append(
        f"compute {_pct(r.shares.compute)} · comm-wait {comm} · "
        f"data-wait {_pct(r.shares.data_wait)} · "
        f"other {_pct(r.shares.other)}\n        "
    )
    line.append(
        f"non-compute idle {_pct(r.idle_ratio)}", style="bold red" if idle_flag else "green"
    )
    thr = idle_threshold(d)
    if idle_flag and thr is not None:
        line.append(f" (above {thr:.0%})", style="red")
    elif thr is not None:
        over = sorted(k[0] for k in flagged(d) if k[1] == "idle" and k[0] is not None)
        if over:  # the run is below the limit, some ranks above it
            line.append(f" ({words.ranks(over)} above {thr:.0%})", style="red")
    if r.gpu_idle_ratio is not None:
        line.append(f" · GPU idle {_pct(r.gpu_idle_ratio)}")
    line.append(f" · comm overlapped by compute {_pct(r.comm_overlapped_ratio)}")
    return line


def _detail_tables(con: Console, d: Diagnosis, show_steps: bool) -> None:
    """Kernels, the profiled steps (when asked), collectives, the whole run and its GPUs."""
    if d.kernels and d.kernels.top:
        con.print()
        _kernel_block(con, d.kernels)
    if show_steps:
        con.print()
        con.print(Text("profiled steps", style="bold"))
        con.print(_fit(con, lambda pad: _step_table(d, pad)))
    if d.collectives is not None and d.collectives.by_type:
        con.print()
        _collective_block(con, d)
    if d.whole_run is not None:
        con.print()
        _print_wrapped(
            con,
            Text(""),
            "whole run (telemetry): steady steps, neither profiled nor warm-up",
            style="bold",
        )
        con.print(_fit(con, lambda pad: _whole_run_table(d, pad)))
        if d.whole_run.gpus:
            con.print(Text("GPUs (NVML, over the steps)", style="bold"))
            con.print(_fit(con, lambda pad: _gpu_table(d, pad)))


def _findings(con: Console, d: Diagnosis) -> None:
    if d.findings:
        con.print(Text("Findings", style="bold"))
        for f in d.findings:
            mark = Text(
                f" {_SEVERITY_MARK.get(f.severity, '-')} ",
                style=_SEVERITY_STYLE.get(f.severity, ""),
            )
            _print_wrapped(con, mark, f.message)
    else:
        con.print(Text("No findings: compute dominates every rank's step time.", style="green"))


def _recommendations(con: Console, d: Diagnosis) -> None:
    if not d.recommendations:
        return
    con.print()
    con.print(Text("Recommendations", style="bold"))
    for rec in d.recommendations:
        title = rec.title
        if rec.estimated_gain_ns:
            title += f" (could recover ~{duration(rec.estimated_gain_ns)} per step)"
        if rec.overlaps_with:
            title += "; not additive with " + _titles(d, rec.overlaps_with)
        _print_wrapped(con, Text(" → ", style="cyan"), title, style="bold")
        _print_wrapped(con, Text("   "), rec.detail)


def _titles(d: Diagnosis, ids: list[str]) -> str:
    """Other remedies as a reader knows them: their titles up to a colon, quoted."""
    by_id = {r.id: r.title.split(":")[0].split(" (")[0] for r in d.recommendations}
    return ", ".join(f"“{by_id.get(i, i)}”" for i in ids)


def _basis(v: Verdict) -> str:
    return f"from the {v.basis}"


def _kernel_block(con: Console, k: KernelBreakdown) -> None:
    """The run's top five kernels or operators, with family and share of their time."""
    unit = "operators" if k.unit == "operator" else "kernels"
    where = "CPU" if unit == "operators" else "GPU"
    con.print(Text(f"top {unit} by {where} time, all ranks", style="bold"))
    fixed = 13 + 9 + 6 + 3 * 2
    room = max(20, min(60, con.width - fixed))

    def build(pad: tuple[int, int, int, int]) -> Table:
        t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
        t.add_column(unit[:-1], no_wrap=True, max_width=room, overflow="ellipsis")
        t.add_column("family", no_wrap=True)
        t.add_column("time", justify="right", no_wrap=True)
        t.add_column("share", justify="right", no_wrap=True)
        for e in k.top[:5]:
            t.add_row(e.name, e.family, duration(e.time_ns), _pct(e.share))
        return t

    con.print(_fit(con, build))
    fams = k.families
    if fams:
        text = " · ".join(f"{f} {_pct(v)}" for f, v in list(fams.items())[:6])
        _print_wrapped(con, Text("by family: ", style="dim"), text, style="dim")


Pad = tuple[int, int, int, int]


def _rank_table(d: Diagnosis, max_ranks: int, pad: Pad, gpu_idle: bool = True) -> Table:
    """Per rank: steps, step times, the shares, overlap, non-compute idle and GPU idle."""
    t = Table(title=None, box=None, header_style="bold", pad_edge=False, padding=pad)
    gpu_idle = gpu_idle and d.run.gpu_idle_ratio is not None
    cols = [
        "rank",
        "steps",
        "median",
        "p90",
        "compute",
        "comm-wait",
        "data-wait",
        "other",
        "overlap",
        "nc-idle",
    ] + (["gpu-idle"] if gpu_idle else [])
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    flags = flagged(d)
    gone = withheld_ranks(d)
    ranks: list[RankSummary] = d.ranks
    shown = (
        ranks if len(ranks) <= max_ranks else sorted(ranks, key=lambda r: -r.idle_ratio)[:max_ranks]
    )
    for rs in sorted(shown, key=lambda r: r.rank):
        s = rs.shares

        def cell(value: float | None, col: str, rank: int = rs.rank) -> Text:
            sev = flags.get((rank, col))
            return Text(_pct(value), style=_FLAG_STYLE[sev] if sev is not None else "")

        row: list[Text | str] = [
            str(rs.rank),
            str(rs.steps),
            duration(rs.step_time_ns_median),
            duration(rs.step_time_ns_p90),
            _pct(s.compute),
            cell(s.comm_wait_shown, "comm_wait"),
            cell(s.data_wait, "data_wait"),
            cell(s.other, "other"),
            _pct(rs.comm_overlapped_ratio),
            cell(rs.idle_ratio, "idle"),
        ]
        if gpu_idle:
            row.append(_pct(rs.gpu_idle_ratio) if rs.gpu_idle_ratio is not None else "-")
        if rs.rank in gone:  # the split is withheld: only the step times were measured
            row[4:] = ["-"] * (len(row) - 4)
        t.add_row(*row)
    notes = (
        [f"{len(ranks) - max_ranks} more ranks not shown (the {max_ranks} idlest are)"]
        if len(ranks) > max_ranks
        else []
    )
    if gone & {rs.rank for rs in shown}:
        notes.append(f"-: {NOT_MEASURED}, the split of step time is withheld")
    if notes:
        t.caption = "; ".join(notes)
    return t


def _step_table(d: Diagnosis, pad: Pad) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
    for col in (
        "rank",
        "step",
        "duration",
        "compute",
        "comm-wait",
        "data-wait",
        "other",
        "overlap",
        "nc-idle",
        "gpu-idle",
    ):
        t.add_column(col, justify="right", no_wrap=True)
    gone = withheld_ranks(d)
    for s in d.steps:
        dur = s.duration_ns or 1
        if s.rank in gone:  # the split is withheld: the step's duration alone was measured
            t.add_row(str(s.rank), str(s.step), duration(s.duration_ns), *["-"] * 7)
            continue
        t.add_row(
            str(s.rank),
            str(s.step),
            duration(s.duration_ns),
            duration(s.compute_ns),
            duration(s.comm_wait_ns),
            duration(s.data_wait_ns),
            duration(s.other_ns),
            duration(s.comm_overlapped_ns),
            _pct(1 - s.compute_ns / dur),
            _pct(s.gpu_idle_ns / dur) if s.gpu_idle_ns is not None else "-",
        )
    if gone:
        t.caption = f"-: {NOT_MEASURED}, the split of step time is withheld"
    return t


def _whole_run_table(d: Diagnosis, pad: Pad) -> Table:
    w = d.whole_run
    assert w is not None
    t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
    for col in ("rank", "steps", "median", "p90", "max", "data-wait"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in w.ranks:
        t.add_row(
            str(r.rank),
            str(r.steps),
            duration(r.step_time_ns_median),
            duration(r.step_time_ns_p90),
            duration(r.step_time_ns_max),
            _pct(r.data_wait_ratio),
        )
    return t


def _gpu_table(d: Diagnosis, pad: Pad) -> Table:
    w = d.whole_run
    assert w is not None
    t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
    for col in ("rank", "gpu", "util", "mem util", "power", "SM clock", "max temp", "slowdown"):
        t.add_column(col, justify="right", no_wrap=col != "slowdown")

    def num(v: float | None, unit: str, digits: int = 0) -> str:
        return "n/a" if v is None else f"{v:.{digits}f} {unit}"

    for g in w.gpus:
        slow = _pct(g.slowdown_ratio)
        if g.slowdown_reasons:
            slow += " " + ", ".join(g.slowdown_reasons)
        t.add_row(
            "-" if g.rank is None else str(g.rank),
            g.gpu_uuid[:12],
            _pct(g.util_ratio),
            _pct(g.mem_util_ratio),
            num(g.power_w, "W"),
            num(g.sm_clock_mhz, "MHz"),
            num(g.temp_c_max, "°C"),
            slow,
        )
    return t


def _spread_and_what_if(d: Diagnosis) -> list[str]:
    """One line of min/max across ranks, one of what-if step times."""
    lines = []
    sp = d.spread
    if sp:
        parts = []
        # a withheld split's shares are not measured: only the step times spread
        shares = (
            ()
            if withheld_ranks(d)
            else (
                ("compute_ratio", "compute", _pct),
                ("comm_wait_ratio", "comm-wait", _pct),
                ("data_wait_ratio", "data-wait", _pct),
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
        lines.append("across ranks: " + " · ".join(parts))
    gm = [(r.rank, m) for r in d.ranks if (m := r.evidence.gpu_metrics)]
    if gm:
        labels = {
            "sm_active": "SM active",
            "sm_issue": "SM issue",
            "tensor_active": "tensor active",
        }
        per = [
            f"r{rank} " + ", ".join(f"{labels.get(k, k)} {_pct(v)}" for k, v in sorted(m.items()))
            for rank, m in gm
        ]
        lines.append("GPU metrics over the steps (Nsight): " + " · ".join(per))
    w = d.what_if
    if w and w.step_time_ns:
        cur = w.step_time_ns

        def delta(v: int | None) -> str:
            if v is None:
                return "n/a"
            change = f"{(v - cur) / cur:+.0%}"
            return f"{duration(v)} ({'no change' if change in ('+0%', '-0%') else change})"

        # a pipeline's communication wait is its bubble, which no overlap removes
        pipe = (
            " (its waits are the pipeline's bubble)"
            if (d.collectives is not None and d.collectives.pipeline is not None)
            else ""
        )
        text = (
            "what if: "
            + (
                f"comm fully overlapped{pipe} → {delta(w.if_comm_overlapped_ns)} · "
                if w.if_comm_overlapped_ns is not None
                else ""  # comm-wait not measured
            )
            + f"no data wait → {delta(w.if_no_data_wait_ns)}"
        )
        if w.if_straggler_at_median_speed_ns is not None:
            text += f" · straggler at median speed → {delta(w.if_straggler_at_median_speed_ns)}"
        alone = [v for v in (w.if_comm_overlapped_ns, w.if_no_data_wait_ns) if v is not None]
        if w.if_all_ns is not None and w.if_all_ns < min(alone):
            text += f" · all together → {delta(w.if_all_ns)}"
        lines.append(f"{text}  (mean step now {duration(cur)})")
    return lines


def _collective_block(con: Console, d: Diagnosis) -> None:
    c = d.collectives
    assert c is not None
    lower = c.bandwidth_is_lower_bound
    how = {"comms_id": "by collective id", "order": "in issue order"}.get(c.method, c.method)
    title = (
        f"collectives: {c.matched} matched across ranks {how}"
        if not lower
        else "collectives: not matched across ranks, so durations include "
        "waiting and bandwidths are lower bounds"
    )
    _print_wrapped(con, Text(""), title, style="bold")
    con.print(_fit(con, lambda pad: _collective_table(d, pad)))
    gone = withheld_ranks(d)  # their waits rest on time the trace did not see
    per = {r: v for r, v in c.per_rank.items() if int(r) not in gone}
    if per:
        items = list(per.items())
        label = "waiting for the last rank: "
        if len(items) > MAX_LISTED:  # the longest waits, not a screenful of ranks
            items = sorted(items, key=lambda kv: -kv[1].sync_wait_ns)[:MAX_LISTED]
            label = f"waiting for the last rank, the {MAX_LISTED} longest of {len(per)}: "
        waits = ", ".join(f"r{r} {duration(v.sync_wait_ns)}" for r, v in items)
        _print_wrapped(con, Text(label, style="dim"), waits, indent="  ", style="dim")


def _collective_table(d: Diagnosis, pad: Pad) -> Table:
    c = d.collectives
    assert c is not None
    lower = c.bandwidth_is_lower_bound
    t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
    # transfer: the median over the calls of one call's duration (not a total)
    for col in ("type", "size", "count", "median/call", "algbw", "busbw", "of peak"):
        t.add_column(col, justify="left" if col in ("type", "size") else "right", no_wrap=True)
    ge = "≥" if lower else ""

    def bw(v: float | None) -> str:
        # a lower bound that rounds to nothing says nothing: n/a, not "≥0.0 GB/s"
        return "n/a" if v is None or (lower and round(v, 1) <= 0) else f"{ge}{v:.1f} GB/s"

    for row in c.by_type:
        eff = row.efficiency
        t.add_row(
            row.type,
            row.size_bucket,
            str(row.count),
            duration(row.transfer_ns_median),
            bw(row.algbw_gbps),
            bw(row.busbw_gbps),
            "n/a"
            if eff is None or (lower and round(eff, 2) <= 0)
            else f"{ge}{eff:.0%} of {row.peak_gbps or 0:.0f}",
        )
    return t
