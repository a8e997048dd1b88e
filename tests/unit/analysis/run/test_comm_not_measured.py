"""Trial item 4: telemetry alone does not see DDP's C++ reducer, so a telemetry-only run
whose steps recorded no collective wait has comm-wait "not measured" — null in JSON,
"not measured"/"n/a" in the renderers, no "comm fully overlapped" what-if — not 0.0%.

Truth is the telemetry rows themselves: every ``comm_wait_ns`` is 0 (the job's DDP
all-reduce ran in the reducer, invisible to the hook), or some are positive (a collective
called from Python, which the hook times).
"""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from testpaths import SCHEMA

from gpudiag.analysis.diagnose import build_diagnosis
from gpudiag.analysis.rank.analyse import telemetry_results
from gpudiag.analysis.run.wholerun import whole_run
from gpudiag.api.saved import diagnosis_from_json
from gpudiag.config import Thresholds
from gpudiag.report.console import render
from gpudiag.report.markdown import render as render_markdown

MS = 1_000_000


def _telemetry(comm_ms: float) -> pd.DataFrame:
    rows = []
    for rank in (0, 1):
        t = 1_000 * MS
        for i in range(12):
            d = 100 * MS
            rows.append(
                {
                    "rank": rank,
                    "step": i,
                    "start_ns": t,
                    "end_ns": t + d,
                    "duration_ns": d,
                    "data_wait_ns": MS,
                    "comm_wait_ns": int(comm_ms * MS),
                    "backward_ns": 40 * MS,
                    "profiled": False,
                    "host": "n0",
                }
            )
            t += d
    df = pd.DataFrame(rows)
    for c in ("data_wait_ns", "comm_wait_ns", "backward_ns"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    return df


def _diagnose(comm_ms: float):
    th = Thresholds()
    w, extra = whole_run(_telemetry(comm_ms), None, None, th.steady)
    assert w is not None
    return build_diagnosis(telemetry_results(w, th), th, whole_run=w, extra_findings=extra)


def test_no_collective_wait_seen_is_not_measured_not_zero():
    d = _diagnose(0.0)
    doc = json.loads(json.dumps(d.to_json()))
    assert doc["run"]["shares"]["comm_wait"] is None
    assert all(r["shares"]["comm_wait"] is None for r in doc["ranks"])
    assert all(r["comm_wait_ratio"] is None for r in doc["whole_run"]["ranks"])
    assert doc["what_if"]["if_comm_overlapped_ns"] is None
    assert "comm_wait_ratio" not in doc["spread"]
    buf = io.StringIO()
    render(d, buf, width=120, color=False)
    text = buf.getvalue()
    assert "comm-wait not measured" in text
    assert "comm fully overlapped" not in text
    assert "comm-wait 0.0%" not in text
    md = io.StringIO()
    render_markdown(d, md)
    assert "comm-wait not measured" in md.getvalue()
    jsonschema = pytest.importorskip("jsonschema")
    schema = SCHEMA
    jsonschema.validate(doc, json.loads(schema.read_text()))
    back = diagnosis_from_json(doc)
    assert not back.run.shares.comm_measured and back.run.shares.comm_wait_shown is None


def test_collective_wait_the_hook_timed_is_measured():
    d = _diagnose(5.0).to_json()
    assert d["run"]["shares"]["comm_wait"] == pytest.approx(0.05)
    assert d["whole_run"]["ranks"][0]["comm_wait_ratio"] == pytest.approx(0.05)
    assert d["what_if"]["if_comm_overlapped_ns"] is not None
