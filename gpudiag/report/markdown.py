"""Diagnosis, GateResult and RunDiff → GitHub-flavoured Markdown (job summaries, PR comments)."""

from __future__ import annotations

from typing import TextIO

from gpudiag.analysis.compare.diff import DiffRow, RunDiff
from gpudiag.analysis.compare.gate import GateResult
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.analysis.model.words import duration
from gpudiag.analysis.run import modes
from gpudiag.report.format import (
    NOT_MEASURED,
    efficiency_lines,
    kernel_base,
    mode_label,
    pct,
    recommendation_title,
    split_withheld,
    spread_and_what_if,
    step_time_scope,
    whole_run_line,
    window_label,
    withheld_ranks,
)

_ICON = {"pass": "✅", "fail": "❌", "warn": "⚠️", "inconclusive": "❔", "off": "⚪"}
_VERDICT = {"passed": "✅ passed", "failed": "❌ failed", "inconclusive": "❔ inconclusive"}
MAX_ROWS = 200  # keeps a $GITHUB_STEP_SUMMARY far below its 1 MiB limit


def cell(text: object) -> str:
    """Text safe inside a Markdown table cell (pipes, newlines, HTML)."""
    s = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    return s.replace("<", "&lt;").replace(">", "&gt;")


def fmt_value(name: str, v: float | None) -> str:
    """A check's value or limit as text: ratios as percentages, regressions signed."""
    if v is None:
        return "-"
    if name in ("step_time_regression", "cpu_time_regression"):
        return _signed(f"{v:+.1%}")
    if name == "baseline_run":  # a run's median step time
        return duration(v)
    return f"{v:.1%}"


METRIC_LABELS = {
    "step_time_median": "step time (median)",
    "step_time_p90": "step time (p90)",
    "compute_share": "compute",
    "comm_wait_share": "comm-wait",
    "data_wait_share": "data-wait",
    "other_share": "other",
    "idle_ratio": "non-compute idle",
}


def metric_label(name: str) -> str:
    """A diff metric as the tables say it (``comm_wait_share`` → ``comm-wait``)."""
    return METRIC_LABELS.get(name, name.replace("_", " "))


def _signed(text: str) -> str:
    """``+1.2%`` stays; ``+0.0%`` and ``-0.0%`` read ``0.0%``."""
    return text[1:] if text[0] in "+-" and not any(c in "123456789" for c in text) else text


def diff_cells(row: DiffRow) -> tuple[str, str, str]:
    """A, B and the change of a diff row as text."""
    show = duration if row.unit == "ns" else pct
    if row.change is None:
        change = "n/a"
    elif row.unit == "ns":
        change = _signed(f"{row.change:+.1%}")
    else:
        change = _signed(f"{row.change * 100:+.1f}") + " pt"
    return show(row.a), show(row.b), change


def _table(out: TextIO, head: list[str], rows: list[list[str]], align: str) -> None:
    """``align``: one letter per column, ``l`` or ``r``."""
    out.write("| " + " | ".join(head) + " |\n")
    out.write("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|\n")
    for r in rows[:MAX_ROWS]:
        out.write("| " + " | ".join(cell(c) for c in r) + " |\n")
    if len(rows) > MAX_ROWS:
        out.write(f"\n_{len(rows) - MAX_ROWS} more rows not shown._\n")


def render(d: Diagnosis, out: TextIO, **_: object) -> None:
    """A Diagnosis: run summary, per-rank table, findings and recommendations."""
    _summary(d, out)
    _rank_table(d, out)
    if d.run.steps:
        for label, text in spread_and_what_if(d):
            out.write(f"\n**{cell(_upper_first(label))}:** {cell(text)}\n")
    whole = whole_run_line(d)
    if whole is not None:
        out.write(f"\n{cell(_upper_first(whole))}\n")
    _kernels(d, out)
    if d.efficiency is not None:
        out.write(
            "\n"
            + "  \n".join(
                cell(_upper_first((a.strip() + " " + b).strip()))
                for a, b in efficiency_lines(d.efficiency)
            )
            + "\n"
        )
    if d.findings:
        out.write("\n### Findings\n\n")
        for f in d.findings[:MAX_ROWS]:
            out.write(f"- **{cell(f.severity)}** {cell(f.message)}\n")
    if d.recommendations:
        out.write("\n### Recommendations\n\n")
        for rec in d.recommendations[:MAX_ROWS]:
            out.write(f"- **{cell(recommendation_title(d, rec))}**: {cell(rec.detail)}\n")
    out.write("\n")


def _summary(d: Diagnosis, out: TextIO) -> None:
    """The heading, the verdict, the window's step time and shares, and two kinds of step."""
    r = d.run
    world = f" of {r.world_size}" if r.world_size and r.world_size != r.ranks else ""
    out.write(f"## gpudiag: {words.plural(r.ranks, 'rank')}{world} · {mode_label(r.mode)}\n\n")
    v = d.verdict
    if v:
        out.write(f"**{cell(v.headline)}** (from the {v.basis})\n\n")
    out.write(
        f"{window_label(r.mode).capitalize()}: {words.plural(r.steps, 'step')}, step "
        f"time median **{duration(r.step_time_ns_median)}**, p90 "
        f"{duration(r.step_time_ns_p90)}{step_time_scope(d)} · {_shares(d)}\n\n"
    )
    kinds = modes.describe([s.duration_ns for s in d.steps], duration, d.thresholds)
    if kinds:  # a median that describes neither kind of step: say both
        out.write(f"{cell(kinds.capitalize())}\n\n")


# the per-rank table: its columns, each with its alignment ("r": right, "l": left)
_RANK_COLUMNS = (
    ("rank", "r"),
    ("steps", "r"),
    ("median", "r"),
    ("p90", "r"),
    ("compute", "r"),
    ("comm-wait", "r"),
    ("data-wait", "r"),
    ("other", "r"),
    ("non-compute idle", "r"),
    ("GPU idle", "r"),
)


def _rank_table(d: Diagnosis, out: TextIO) -> None:
    """One row a rank; a rank whose split is withheld shows dashes for its shares."""
    gone = withheld_ranks(d)
    rows = []
    for x in d.ranks:
        head = [
            str(x.rank),
            str(x.steps),
            duration(x.step_time_ns_median),
            duration(x.step_time_ns_p90),
        ]
        shares = [
            pct(x.shares.compute),
            pct(x.shares.comm_wait_shown),
            pct(x.shares.data_wait),
            pct(x.shares.other),
            pct(x.idle_ratio),
            pct(x.gpu_idle_ratio) if x.gpu_idle_ratio is not None else "-",
        ]
        rows.append(head + (["-"] * len(shares) if x.rank in gone else shares))
    names = [name for name, _ in _RANK_COLUMNS]
    _table(out, names, rows, "".join(a for _, a in _RANK_COLUMNS))
    if gone:
        out.write(f"\n_A dash: {NOT_MEASURED}, the split of step time is withheld._\n")


def _kernels(d: Diagnosis, out: TextIO) -> None:
    """The top five kernels (or operators) of all ranks."""
    k = d.kernels
    if not (k and k.top):
        return
    unit = "operator" if k.unit == "operator" else "kernel"
    out.write(f"\n### Top {unit}s, all ranks\n\n_{cell(_upper_first(kernel_base(k)))}._\n\n")
    rows = [[e.name, e.family, duration(e.time_ns), pct(e.share)] for e in k.top[:5]]
    _table(out, [unit, "family", "time", "share"], rows, "llrr")


def _upper_first(text: str) -> str:
    """A line's first letter upper case, the rest as it is (``CPU`` stays ``CPU``)."""
    return text[:1].upper() + text[1:]


def _shares(d: Diagnosis) -> str:
    """The run's shares and idle ratios; not measured when the split is withheld."""
    r = d.run
    if split_withheld(d):
        return f"shares {NOT_MEASURED}: the split of step time is withheld"
    comm = pct(r.shares.comm_wait) if r.shares.comm_measured else NOT_MEASURED
    gpu = f" · GPU idle {pct(r.gpu_idle_ratio)}" if r.gpu_idle_ratio is not None else ""
    return (
        f"compute {pct(r.shares.compute)} · comm-wait {comm} · data-wait "
        f"{pct(r.shares.data_wait)} · other {pct(r.shares.other)} · non-compute idle "
        f"**{pct(r.idle_ratio)}**{gpu}"
    )


def render_gate(res: GateResult, out: TextIO) -> None:
    """The gate verdict and a table of its checks."""
    n = res.counts()
    out.write(f"## gpudiag gate: {_VERDICT.get(res.status, res.status)}\n\n")
    out.write(
        f"{n['pass']} passed, {n['fail']} failed, {n['warn']} warnings, "
        f"{n['inconclusive']} inconclusive, {n['off']} not applied "
        f"(exit {res.exit_code})"
    )
    out.write(f" · subject `{cell(res.subject)}`" if res.subject else "")
    out.write(f" · baseline `{cell(res.baseline)}`" if res.baseline else "")
    out.write("\n\n")
    bad = [c for c in res.checks if c.status not in ("pass", "off")]
    rest = [c for c in res.checks if c.status == "pass"] + [
        c for c in res.checks if c.status == "off"
    ]
    rows = [
        [
            _ICON.get(c.status, "") + " " + c.status,
            c.name,
            "all" if c.rank is None else str(c.rank),
            fmt_value(c.name, c.value),
            fmt_value(c.name, c.limit),
            "" if c.p_value is None else f"{c.p_value:.2g}",
            c.message,
        ]
        for c in bad + rest
    ]
    _table(out, ["status", "check", "rank", "value", "limit", "p", "detail"], rows, "lllrrrl")
    out.write("\n")


def render_diff(diff: RunDiff, out: TextIO) -> None:
    """A diff as a table: one row per scope and metric."""
    out.write(f"## gpudiag diff\n\nA: `{cell(diff.a)}`  \nB: `{cell(diff.b)}`\n\n")
    for note in diff.notes:
        out.write(f"> {cell(note)}\n\n")
    arrow = {"worse": "🔺 ", "better": "🔻 "}
    rows = []
    for row in diff.rows:
        a, b, change = diff_cells(row)
        rows.append(
            [row.scope, metric_label(row.metric), a, b, arrow.get(row.direction, "") + change]
        )
    _table(out, ["scope", "metric", "A", "B", "change"], rows, "llrrr")
    for title, items in (("Communication", diff.comm), ("Findings", diff.findings)):
        if items:
            out.write(f"\n### {title}\n\n")
            for item in items[:MAX_ROWS]:
                out.write(f"- {cell(item)}\n")
    out.write("\n")
