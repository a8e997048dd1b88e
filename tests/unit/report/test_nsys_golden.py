"""Golden outputs for the shared Nsight Systems exports (tests/golden/nsys_*).

Refresh after an intended change with ``pytest tests/unit/report/test_nsys_golden.py --update-golden``
and review the diff: these files are what users see.
"""

import io
import json

import pytest
from testpaths import GOLDEN

import gpudiag
from gpudiag.config import Thresholds
from gpudiag.report.console import render

# golden name → (input under ../shared/traces/nsys, step marker or None)
SETS = {
    "nsys_baseline": ("ai-profiler/baseline.sqlite", None),
    "nsys_baseline_nvtx": ("ai-profiler/baseline_nvtx.sqlite", None),
    "nsys_baseline_nvtx_batch": ("ai-profiler/baseline_nvtx.sqlite", r"^Batch (\d+)$"),
    "nsys_jacobi_mpi": ("jacobi-mpi", None),
    "nsys_mfu_before": ("nsys-ai/mfu_2gpu_before.sqlite", None),
    "nsys_mfu_after": ("nsys-ai/mfu_2gpu_after.sqlite", None),
    "nsys_h100_1s": ("nsys-ai/h100_2gpu_1s.sqlite", None),
    "nsys_healthy_1pct": ("nsys-ai/healthy_1pct.sqlite", None),
    "nsys_mock": ("nsys-ai/mock.sqlite", None),
}


@pytest.mark.parametrize("name", sorted(SETS))
def test_nsys_export_matches_golden(name, shared_traces, update_golden):
    rel, marker = SETS[name]
    root = shared_traces / "nsys"
    th = Thresholds(step_re=marker) if marker else None
    d = gpudiag.analyze(root / rel, jobs=1, thresholds=th)
    doc = json.loads(json.dumps(d.to_json()).replace(str(root), "<root>"))
    doc["gpudiag_version"] = "<version>"
    got_json = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    buf = io.StringIO()
    render(d, buf, show_steps=True, width=110, color=False)
    out = GOLDEN / name
    if update_golden:
        out.mkdir(parents=True, exist_ok=True)
        (out / "diagnosis.json").write_text(got_json)
        (out / "console.txt").write_text(buf.getvalue())
        return
    if not (out / "diagnosis.json").exists():
        pytest.fail(f"no golden output for {name}: run pytest --update-golden")
    assert got_json == (out / "diagnosis.json").read_text()
    assert buf.getvalue() == (out / "console.txt").read_text()
