"""Trial item 13: the docs and the renderers say what the code does.

README's sample is real output (its table header and shares line are the console's own),
docs/json-schema.md has one row per field in each table, the Markdown title keeps
"of <world>", ``-f md`` is markdown, and a diff of telemetry-only runs neither claims a
profiled window nor wraps its findings back to column 0.
"""

from __future__ import annotations

import io
import re

import pandas as pd
from testpaths import ROOT

import gpudiag
from gpudiag.analysis.compare.diff import diff
from gpudiag.analysis.diagnose import build_diagnosis
from gpudiag.analysis.model.diagnosis import Finding, FindingKind, Severity
from gpudiag.analysis.rank.analyse import telemetry_results
from gpudiag.analysis.run.wholerun import whole_run
from gpudiag.config import Thresholds
from gpudiag.report import pick_format, render
from gpudiag.report.console import render as render_console
from gpudiag.report.gate_console import render_diff

MS = 1_000_000


def test_readme_sample_uses_the_console_vocabulary():
    text = (ROOT / "README.md").read_text()
    sample = text.split("$ gpudiag run -- torchrun", 1)[1].split("```", 1)[0]
    d = gpudiag.analyze(ROOT / "tests" / "data" / "saved" / "demo_cpu_ddp2.json")
    buf = io.StringIO()
    render_console(d, buf, width=92, color=False)
    header = next(line for line in buf.getvalue().splitlines() if line.startswith("rank "))
    # the same columns in the same words (their widths follow the sample's own numbers)
    assert " ".join(header.split()) in [" ".join(line.split()) for line in sample.splitlines()]
    assert re.search(r"^\s+non-compute idle \d", sample, re.M)
    assert not re.search(r"(?<!non-compute )\bidle \d", sample.split("verdict:")[1].split("\n")[0])


def test_schema_doc_has_one_row_per_field_in_each_table():
    seen: dict[tuple[str, str], int] = {}
    section = ""
    for line in (ROOT / "docs" / "json-schema.md").read_text().splitlines():
        if line.startswith("#"):
            section = line
        elif line.startswith("| `"):
            key = (section, line.split("|")[1].strip())
            seen[key] = seen.get(key, 0) + 1
    assert not {k: n for k, n in seen.items() if n > 1}


def test_markdown_title_keeps_the_world_size_and_md_is_markdown(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "b200x8_r0_infer", jobs=1)  # rank 0 of 8
    assert pick_format("diagnosis", "md", None) == "markdown"
    assert pick_format("diff", "md", None) == "markdown"
    out = io.StringIO()
    render(d, "md", out)
    assert out.getvalue().startswith("## gpudiag: 1 rank of 8 · ")


def _telemetry_run(step_ms: float, note: str, kind: FindingKind = FindingKind.WARMUP):
    rows = []
    for rank in (0, 1):
        t = 1_000 * MS
        for i in range(12):
            d = int(step_ms * MS)
            rows.append(
                {
                    "rank": rank,
                    "step": i,
                    "start_ns": t,
                    "end_ns": t + d,
                    "duration_ns": d,
                    "data_wait_ns": 0,
                    "comm_wait_ns": 0,
                    "backward_ns": None,
                    "profiled": False,
                    "host": "n0",
                }
            )
            t += d
    df = pd.DataFrame(rows)
    for c in ("data_wait_ns", "comm_wait_ns", "backward_ns"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    th = Thresholds()
    w, extra = whole_run(df, None, None, th.steady)
    long = Finding(kind, Severity.INFO, note)
    return build_diagnosis(telemetry_results(w, th), th, whole_run=w, extra_findings=[*extra, long])


def test_diff_of_telemetry_runs_names_no_profiled_window_and_wraps_findings():
    a = _telemetry_run(100, "short note")
    b = _telemetry_run(120, "a long finding message " * 8, FindingKind.TRUNCATED_STEP)
    res = diff(a, b)
    assert not any("profiled window" in n and "no profiled window" not in n for n in res.notes)
    out = io.StringIO()
    render_diff(res, out, width=80, color=False)
    lines = out.getvalue().splitlines()
    start = lines.index("findings")
    body = lines[start + 1 :]
    assert len(body) > 2 and all(line.startswith(" ") for line in body), body
    assert all(len(line) <= 80 for line in lines)
