"""On-demand profiling through the control file (``attach --run R --profile-next N``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testpaths import ROOT

from gpudiag.collect.rank import bootstrap


def test_control_file_triggers_a_window_and_keeps_one_trace(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = tmp_path / "run"
    code = f"""
import json, os, pathlib, time, torch
import gpudiag.collect.rank.hook as h
h.CONTROL_POLL_NS = 0
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(14):
    if i == 6:
        req = json.dumps({{"id": "a", "profile_next": 3}})
        pathlib.Path({str(run)!r}, "control.json").write_text(req)
    m(torch.ones(1, 2)).sum().backward(); o.step()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDIAG_")}
    env.update(
        PYTHONPATH=str(bootstrap.site_dir()),
        GPUDIAG_RUN_DIR=str(run),
        GPUDIAG_PKG_ROOT=str(ROOT),
        GPUDIAG_PROFILE_STEPS="1:3",
        OMP_NUM_THREADS="1",
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in (run / "ranks" / "rank-0.steps.jsonl").read_text().splitlines()]
    windows = [(x["start_step"], x["end_step"]) for x in recs if x["type"] == "profile"]
    assert windows == [(1, 3), (8, 11)]
    profiled = [x["step"] for x in recs if x["type"] == "step" and x["profiled"]]
    assert profiled == [1, 2, 8, 9, 10]
    # the latest window is the rank's trace; the earlier one moved aside
    assert (run / "ranks" / "rank-0.pt.trace.json.gz").exists()
    assert [p.name for p in (run / "ranks" / "previous").iterdir()] == [
        "rank-0.steps-1-3.pt.trace.json.gz"
    ]
