"""rich tables for terminals, and golden text at a fixed width."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpudiag.analysis.model import Diagnosis, RankSummary, Severity
from gpudiag.report.format import flagged, fmt_ns, idle_threshold, mode_label
from gpudiag.report.format import pct as _pct

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
_SEVERITY_MARK = {"error": "✗", "warning": "!", "info": "·"}
_FLAG_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold red", Severity.INFO: ""}


def make_console(out: TextIO, width: int | None = None, color: bool | None = None) -> Console:
    """A console on ``out``; fixed width and no colour give reproducible (golden) text."""
    if width is None and not (hasattr(out, "isatty") and out.isatty()):
        width = 120  # files and pipes: wide enough for every column, stable for diffs
    return Console(
        file=out,
        width=width,
        force_terminal=color,
        no_color=color is False,
        highlight=False,
        soft_wrap=False,
        emoji=False,
    )


def render(
    d: Diagnosis,
    out: TextIO,
    *,
    show_steps: bool = False,
    width: int | None = None,
    color: bool | None = None,
    max_ranks: int = 64,
) -> None:
    """Print the run summary, the per-rank table, findings and (optionally) every step."""
    con = make_console(out, width=width, color=color)
    r = d.run
    flags = flagged(d)
    idle_flag = (None, "idle") in flags
    head = Text()
    head.append("gpudiag", style="bold")
    head.append(f" · {r.ranks} rank{'s' if r.ranks != 1 else ''}")
    if r.world_size and r.world_size != r.ranks:
        head.append(f" of {r.world_size}")
    head.append(f" · {r.steps} step{'s' if r.steps != 1 else ''} · {mode_label(r.mode)}")
    head.append(
        f" · step time median {fmt_ns(r.step_time_ns_median)}, p90 {fmt_ns(r.step_time_ns_p90)}"
    )
    con.print(head)
    line = Text("run: ")
    line.append(f"compute {_pct(r.shares.compute)} · comm-wait {_pct(r.shares.comm_wait)} · "
                f"data-wait {_pct(r.shares.data_wait)} · "
                f"other {_pct(r.shares.other)}\n     ")  # fmt: skip
    line.append(f"idle {_pct(r.idle_ratio)}", style="bold red" if idle_flag else "green")
    thr = idle_threshold(d)
    if idle_flag and thr is not None:
        line.append(f" (above {thr:.0%})", style="red")
    line.append(f" · comm overlapped by compute {_pct(r.comm_overlapped_ratio)}")
    con.print(line)
    con.print()
    con.print(_rank_table(d, max_ranks))
    for text in _spread_and_what_if(d):
        con.print(Text(text, style="dim"))
    if show_steps:
        con.print(_step_table(d))
    if d.collectives is not None and d.collectives.by_type:
        con.print()
        con.print(_collective_table(d))
    if d.whole_run is not None:
        con.print()
        con.print(_whole_run_table(d))
        if d.whole_run.gpus:
            con.print(_gpu_table(d))
    con.print()
    if d.findings:
        con.print(Text("Findings", style="bold"))
        for f in d.findings:
            t = Text(
                f" {_SEVERITY_MARK.get(f.severity, '-')} ",
                style=_SEVERITY_STYLE.get(f.severity, ""),
            )
            t.append(f.message)
            con.print(t)
    else:
        con.print(Text("No findings: compute dominates every rank's step time.", style="green"))
    if d.recommendations:
        con.print()
        con.print(Text("Recommendations", style="bold"))
        for rec in d.recommendations:
            t = Text(" → ", style="cyan")
            t.append(rec.title, style="bold")
            if rec.estimated_gain_ns:
                t.append(f"  (could recover ~{fmt_ns(rec.estimated_gain_ns)} per step)")
            if rec.overlaps_with:
                t.append(f" · not additive with {', '.join(rec.overlaps_with)}", style="dim")
            con.print(t)
            con.print(Text(f"   {rec.detail}"))
    for note in d.notes:
        con.print(Text(f"note: {note}", style="dim"))


def _rank_table(d: Diagnosis, max_ranks: int) -> Table:
    t = Table(title=None, box=None, header_style="bold", pad_edge=False)
    for col, just in (("rank", "right"), ("steps", "right"), ("median", "right"), ("p90", "right"),
                      ("compute", "right"), ("comm-wait", "right"), ("data-wait", "right"),
                      ("other", "right"), ("overlap", "right"), ("idle", "right")):  # fmt: skip
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    flags = flagged(d)
    ranks: list[RankSummary] = d.ranks
    shown = (
        ranks if len(ranks) <= max_ranks else sorted(ranks, key=lambda r: -r.idle_ratio)[:max_ranks]
    )
    for rs in sorted(shown, key=lambda r: r.rank):
        s = rs.shares

        def cell(value: float, col: str, rank: int = rs.rank) -> Text:
            sev = flags.get((rank, col))
            return Text(_pct(value), style=_FLAG_STYLE[sev] if sev is not None else "")

        t.add_row(str(rs.rank), str(rs.steps), fmt_ns(rs.step_time_ns_median),
                  fmt_ns(rs.step_time_ns_p90), _pct(s.compute), cell(s.comm_wait, "comm_wait"),
                  cell(s.data_wait, "data_wait"), cell(s.other, "other"),
                  _pct(rs.comm_overlapped_ratio), cell(rs.idle_ratio, "idle"))  # fmt: skip
    if len(ranks) > max_ranks:
        t.caption = f"{len(ranks) - max_ranks} more ranks not shown (the {max_ranks} idlest are)"
    return t


def _step_table(d: Diagnosis) -> Table:
    t = Table(title="steps", box=None, header_style="bold", pad_edge=False, title_justify="left")
    for col in (
        "rank",
        "step",
        "duration",
        "compute",
        "comm-wait",
        "data-wait",
        "other",
        "overlap",
        "idle",
    ):
        t.add_column(col, justify="right")
    for s in d.steps:
        dur = s.duration_ns or 1
        t.add_row(str(s.rank), str(s.step), fmt_ns(s.duration_ns), fmt_ns(s.compute_ns),
                  fmt_ns(s.comm_wait_ns), fmt_ns(s.data_wait_ns), fmt_ns(s.other_ns),
                  fmt_ns(s.comm_overlapped_ns), _pct(1 - s.compute_ns / dur))  # fmt: skip
    return t


def _whole_run_table(d: Diagnosis) -> Table:
    w = d.whole_run
    assert w is not None
    t = Table(title="every step (telemetry)", box=None, header_style="bold", pad_edge=False,
              title_justify="left")  # fmt: skip
    for col in ("rank", "steps", "median", "p90", "max", "data-wait"):
        t.add_column(col, justify="right")
    for r in w.ranks:
        t.add_row(str(r.rank), str(r.steps), fmt_ns(r.step_time_ns_median),
                  fmt_ns(r.step_time_ns_p90), fmt_ns(r.step_time_ns_max),
                  _pct(r.data_wait_ratio))  # fmt: skip
    return t


def _gpu_table(d: Diagnosis) -> Table:
    w = d.whole_run
    assert w is not None
    t = Table(title="GPUs (NVML, over the steps)", box=None, header_style="bold",
              pad_edge=False, title_justify="left")  # fmt: skip
    for col in ("rank", "gpu", "util", "mem util", "power", "SM clock", "max temp", "slowdown"):
        t.add_column(col, justify="right")

    def num(v: float | None, unit: str, digits: int = 0) -> str:
        return "n/a" if v is None else f"{v:.{digits}f} {unit}"

    for g in w.gpus:
        slow = _pct(g.slowdown_ratio)
        if g.slowdown_reasons:
            slow += " " + ",".join(g.slowdown_reasons)
        t.add_row("-" if g.rank is None else str(g.rank), g.gpu_uuid[:12], _pct(g.util_ratio),
                  _pct(g.mem_util_ratio), num(g.power_w, "W"), num(g.sm_clock_mhz, "MHz"),
                  num(g.temp_c_max, "°C"), slow)  # fmt: skip
    return t


def _spread_and_what_if(d: Diagnosis) -> list[str]:
    """One line of min/max across ranks, one of what-if step times."""
    lines = []
    sp = d.spread
    if sp:
        parts = []
        for key, label, fmt in (
            ("step_time_ns_median", "step", fmt_ns),
            ("compute_ratio", "compute", _pct),
            ("comm_wait_ratio", "comm-wait", _pct),
            ("data_wait_ratio", "data-wait", _pct),
        ):
            v = sp.get(key)
            if v:
                parts.append(f"{label} {fmt(v.min)} (r{v.min_rank})–{fmt(v.max)} (r{v.max_rank})")
        lines.append("across ranks: " + " · ".join(parts))
    gm = [(r.rank, r.evidence["gpu_metrics"]) for r in d.ranks if r.evidence.get("gpu_metrics")]
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
            return "n/a" if v is None else f"{fmt_ns(v)} ({(v - cur) / cur:+.0%})"

        text = (f"what if: comm fully overlapped → {delta(w.if_comm_overlapped_ns)} · "
                f"no data wait → {delta(w.if_no_data_wait_ns)}")  # fmt: skip
        if w.if_straggler_at_median_speed_ns is not None:
            text += f" · straggler at median speed → {delta(w.if_straggler_at_median_speed_ns)}"
        if w.if_all_ns is not None and w.if_all_ns < min(
            w.if_comm_overlapped_ns, w.if_no_data_wait_ns
        ):
            text += f" · all together → {delta(w.if_all_ns)}"
        lines.append(f"{text}  (step now {fmt_ns(cur)})")
    return lines


def _collective_table(d: Diagnosis) -> Table:
    c = d.collectives
    assert c is not None
    lower = c.bandwidth_is_lower_bound
    title = (f"collectives ({c.matched} matched across ranks by {c.method})"
             if not lower else "collectives (not matched across ranks: durations include waiting; "
             "bandwidths are lower bounds)")  # fmt: skip
    t = Table(title=title, box=None, header_style="bold", pad_edge=False, title_justify="left")
    for col in ("type", "size", "count", "transfer", "algbw", "busbw", "of peak"):
        t.add_column(col, justify="left" if col in ("type", "size") else "right")
    ge = "≥" if lower else ""

    def bw(v: float | None) -> str:
        return "n/a" if v is None else f"{ge}{v:.1f} GB/s"

    for row in c.by_type:
        eff = row.efficiency
        t.add_row(row.type, row.size_bucket, str(row.count),
                  fmt_ns(row.transfer_ns_median), bw(row.algbw_gbps), bw(row.busbw_gbps),
                  "n/a" if eff is None
                  else f"{ge}{eff:.0%} of {row.peak_gbps or 0:.0f}")  # fmt: skip
    per = c.per_rank
    if per:
        waits = ", ".join(f"r{r} {fmt_ns(v.sync_wait_ns)}" for r, v in per.items())
        t.caption = f"synchronisation wait (time waiting for the last rank): {waits}"
        t.caption_justify = "left"
    return t
