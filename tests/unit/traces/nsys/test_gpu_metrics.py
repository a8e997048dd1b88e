"""Nsight GPU_METRICS samples (SM / tensor active) joined to steps."""

import shutil
import sqlite3

import pytest

import gpudiag


@pytest.fixture
def export_with_metrics(tmp_path, shared_traces):
    # healthy_1pct: 400 back-to-back 1 ms kernels on device 0 from t=0 to ~404 ms, no steps
    db = tmp_path / "healthy_metrics.sqlite"
    shutil.copy(shared_traces / "nsys/nsys-ai/healthy_1pct.sqlite", db)
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
                                              metricId INTEGER, metricName TEXT);
        CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER);
        INSERT INTO TARGET_INFO_GPU_METRICS VALUES
            (65536, 0, 'GH100', 1, 'SMs Active [Throughput %]'),
            (65536, 0, 'GH100', 2, 'Tensor Active [Throughput %]'),
            (65536, 0, 'GH100', 3, 'DRAM Read Bandwidth [Throughput %]');
    """)
    rows = []
    for i in range(400):  # a sample every ms on device 0 (typeId low byte)
        t = i * 1_000_000
        rows += [(t, 65536, 1, 80 if i < 200 else 40), (t, 65536, 2, 10), (t, 65536, 3, 55)]
    con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return db


def test_gpu_metrics_are_averaged_over_the_steps(export_with_metrics):
    d = gpudiag.analyze(export_with_metrics, jobs=1)
    (r,) = d.ranks
    gm = r.evidence.gpu_metrics
    assert gm is not None
    assert set(gm) == {"sm_active", "tensor_active"}  # DRAM is not joined
    assert gm["sm_active"] == pytest.approx(0.6, abs=0.01)
    assert gm["tensor_active"] == pytest.approx(0.10)
    assert r.evidence.gpu_metrics_per_step["sm_active"] == [pytest.approx(0.6, abs=0.01)]


def test_export_without_gpu_metrics_has_none(shared_traces):
    d = gpudiag.analyze(shared_traces / "nsys/nsys-ai/healthy_1pct.sqlite", jobs=1)
    assert d.ranks[0].evidence.gpu_metrics is None
    assert "gpu_metrics" not in d.to_json()["ranks"][0]["evidence"]
