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
    recommendation_title,
    split_withheld,
    spread_and_what_if,
    step_time_scope,
    whole_run_line,
    whole_run_rows,
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
        # text is printed as it is: names and messages come from traces and jobs, where
        # "[/path/pair.cc:553]" or "[bold]" are text, never rich markup (styles are Text's)
        markup=False,
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
        for label, rest in spread_and_what_if(d):
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
    if d.reading is not None and d.reading.line:
        _print_wrapped(con, Text("reading: "), d.reading.line)
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
    whole = whole_run_line(d)
    if whole is not None:
        _print_wrapped(con, Text(""), whole, indent="  ")
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
    if d.efficiency is not None:
        for first, text in efficiency_lines(d.efficiency):
            _print_wrapped(con, Text(first, style="dim"), text, style="dim")
    elif d.kernels and d.kernels.top and (why := no_efficiency(d)) is not None:
        _print_wrapped(con, Text("efficiency: ", style="dim"), why, style="dim")
    if show_steps:
        con.print()
        con.print(Text("profiled steps", style="bold"))
        con.print(_fit(con, lambda pad: _step_table(d, pad)))
    if d.collectives is not None and d.collectives.by_type:
        con.print()
        _collective_block(con, d)
    if d.whole_run is not None:
        con.print()
        _print_wrapped(con, Text(""), WHOLE_RUN_TITLE, style="bold")
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
        title = recommendation_title(d, rec)
        _print_wrapped(con, Text(" → ", style="cyan"), title, style="bold")
        _print_wrapped(con, Text("   "), rec.detail)


def _basis(v: Verdict) -> str:
    return f"from the {v.basis}"


def _kernel_block(con: Console, k: KernelBreakdown) -> None:
    """The run's top five kernels or operators, with family and share of their time."""
    unit = "operators" if k.unit == "operator" else "kernels"
    where = "CPU" if unit == "operators" else "GPU"
    con.print(Text(f"top {unit} by {where} time, all ranks", style="bold"))
    _print_wrapped(con, Text(""), kernel_base(k), indent="  ", style="dim")
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
    t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
    for col in WHOLE_RUN_HEAD:
        t.add_column(col, justify="right", no_wrap=True)
    for row in whole_run_rows(d):
        t.add_row(*row)
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


def _collective_block(con: Console, d: Diagnosis) -> None:
    _print_wrapped(con, Text(""), collectives_title(d), style="bold")
    con.print(_fit(con, lambda pad: _collective_table(d, pad)))
    waits = last_rank_waits(d, MAX_LISTED)
    if waits is not None:
        label, text = waits
        _print_wrapped(con, Text(f"{label}: ", style="dim"), text, indent="  ", style="dim")


def _collective_table(d: Diagnosis, pad: Pad) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False, padding=pad)
    # transfer: the median over the calls of one call's duration (not a total)
    for col in COLLECTIVE_HEAD:
        t.add_column(col, justify="left" if col in ("type", "size") else "right", no_wrap=True)
    for row in collective_rows(d):
        t.add_row(*row)
    return t
