"""rich tables for the gate's checks and for a run diff, on a terminal or at a fixed width."""

from __future__ import annotations

from typing import TextIO

from rich.table import Table
from rich.text import Text

from gpudiag.analysis.compare.diff import RunDiff
from gpudiag.analysis.compare.gate import GateResult
from gpudiag.report.console import make_console, wrap
from gpudiag.report.markdown import diff_cells, fmt_value, metric_label

_STATUS_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "warn": "yellow",
    "inconclusive": "magenta",
    "off": "dim",
}
_VERDICT_STYLE = {"passed": "bold green", "failed": "bold red", "inconclusive": "bold magenta"}


def render_gate(
    res: GateResult, out: TextIO, *, width: int | None = None, color: bool | None = None
) -> None:
    """Print one row per check, then the verdict and its exit code."""
    con = make_console(out, width=width, color=color)
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, just in (
        ("check", "left"),
        ("rank", "right"),
        ("status", "left"),
        ("value", "right"),
        ("limit", "right"),
        ("p", "right"),
        ("detail", "left"),
    ):
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for c in res.checks:
        t.add_row(
            c.name,
            "all" if c.rank is None else str(c.rank),
            Text(c.status, style=_STATUS_STYLE.get(c.status, "")),
            fmt_value(c.name, c.value),
            fmt_value(c.name, c.limit),
            "-" if c.p_value is None else f"{c.p_value:.2g}",
            c.message,
        )
    con.print(t)
    n = res.counts()
    line = Text("gate ")
    line.append(res.status, style=_VERDICT_STYLE.get(res.status, ""))
    line.append(
        f" (exit {res.exit_code}): {n['pass']} passed, {n['fail']} failed, "
        f"{n['warn']} warnings, {n['inconclusive']} inconclusive, "
        f"{n['off']} not applied"
    )
    if res.baseline:
        line.append(f" · baseline {res.baseline}")
    con.print(line)


def render_diff(
    diff: RunDiff, out: TextIO, *, width: int | None = None, color: bool | None = None
) -> None:
    """Print A, B and the change of every compared metric, run-wide then per rank."""
    con = make_console(out, width=width, color=color)
    con.print(Text(f"A: {diff.a}\nB: {diff.b}"))
    for note in diff.notes:  # wrapped under their text, never back to column 0
        for line in wrap(f"note: {note}", con.width, "", " " * 6):
            con.print(Text(line, style="yellow"))
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, just in (
        ("scope", "left"),
        ("metric", "left"),
        ("A", "right"),
        ("B", "right"),
        ("change", "right"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in diff.rows:
        style = {"worse": "red", "better": "green"}.get(row.direction, "")
        a, b, change = diff_cells(row)
        t.add_row(row.scope, metric_label(row.metric), a, b, Text(change, style=style))
    con.print(t)
    for title, items in (("communication", diff.comm), ("findings", diff.findings)):
        if items:
            con.print(Text(title, style="bold"))
            for item in items:
                for line in wrap(f" {item}", con.width, "", " " * 3):
                    con.print(Text(line))
