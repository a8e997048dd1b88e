"""Issue 12: a run with no profiler trace still ends with a diagnosis, from the step telemetry.

Real 2-rank gloo jobs under ``gpudiag run`` with effects injected far above host noise:
a loader that sleeps in every batch on both ranks (data-wait known by construction), and
a rank that sleeps 3× its step (the straggler), with profiling off. A window the job never
reaches ends with a telemetry diagnosis too: tests/integration/test_short_job.py.
"""

from __future__ import annotations

import json

import pytest
from run_helpers import run_gpudiag

import gpudiag

pytest.importorskip("torch")

DEMO = [
    "torchrun",
    "--standalone",
    "--nproc-per-node",
    "2",
    "-m",
    "gpudiag.demo.train",
    "--steps",
    "12",
    "--hidden",
    "64",
    "--layers",
    "2",
    "--batch",
    "16",
]


@pytest.mark.slow
def test_profiling_off_ends_with_a_telemetry_diagnosis(tmp_path):
    out = tmp_path / "run"
    # every sample takes 10 ms to load (0.16 s a batch) on both ranks; rank 1 also sleeps
    # 0.5 s a step
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--profile-steps",
            "off",
            "--",
            *DEMO,
            "--slow-data",
            "0.01",
            "--sleep-rank",
            "1",
            "--sleep-s",
            "0.5",
        ]
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "step telemetry (no trace)" in r.stdout
    d = gpudiag.analyze(out, jobs=1)
    assert d.run.mode == "telemetry" and d.run.ranks == 2
    kinds = {f.kind for f in d.findings}
    assert "data_bound" in kinds
    (strag,) = [f for f in d.findings if f.kind == "straggler"]
    assert strag.ranks == [1] and strag.cause == "unknown"  # telemetry cannot split it
    assert not {"idle_ratio", "host_bound"} & kinds  # not judged without a trace or NVML
    assert any("no profiler trace: diagnosed from the step telemetry" in n for n in d.notes)
    assert "--profile-steps A:B within the job's 12 steps" in " ".join(d.notes)
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["sources"]["kineto"]["captured"] is False
