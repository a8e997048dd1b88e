"""gpudiag against a second, simple implementation (reference.py) on real shared traces.

The reference follows docs/definitions.md with plain Python loops over the raw JSON and
SQLite, so a disagreement points at the product's loaders, step logic or set arithmetic.
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest
import reference

import gpudiag
from gpudiag.config import SteadyRules

EVERY_STEP = gpudiag.Thresholds(steady=SteadyRules(include_warmup=True))
# GPU-mode sets stepped by ProfilerStep#N (CPU-only traces and one-window sets are not
# covered by the reference)
KINETO = [
    "a100x2_r0_pgcfg/rank-0.json.gz",
    "a100x8_r3/rank-3.json.gz",
    "v100x2_r1/rank-1.json.gz",
    "sampled_2rank_a2a/rank-0.json.gz",
    "sampled_2rank_a2a/rank-1.json.gz",
    "mi300x_ddp8_r0_rccl/rank-0.json.gz",
    "edge_h100_infer_1step/h100.json.gz",
    "edge_amd_mi250/mi250.json.gz",
]


def _agree(got, ref):
    assert [s.step for s in got] == [s.step for s in ref]
    for g, r in zip(got, ref, strict=True):
        assert (g.start_ns, g.duration_ns) == (r.start, r.duration), g.step
        assert g.compute_ns == pytest.approx(r.compute, abs=1_000), g.step
        assert g.comm_wait_ns == pytest.approx(r.comm_wait, abs=1_000), g.step
        assert g.data_wait_ns == pytest.approx(r.data_wait, abs=1_000), g.step
        assert g.gpu_idle_ns == pytest.approx(r.gpu_idle, abs=1_000), g.step


@pytest.mark.parametrize("rel", KINETO)
def test_kineto_steps_match_the_reference(rel, kineto_sets):
    path = kineto_sets / rel
    d = gpudiag.analyze(path, jobs=1, thresholds=EVERY_STEP)
    _agree(d.steps, reference.kineto(path))


def test_nsys_user_ranges_match_the_reference(shared_traces):
    path = shared_traces / "nsys" / "ai-profiler" / "baseline_nvtx.sqlite"
    d = gpudiag.analyze(path, jobs=1, thresholds=EVERY_STEP)
    assert d.ranks[0].step_source == "user_range"
    _agree(d.steps, reference.nsys(path, "Batch %"))


def test_nsys_without_loader_ranges_matches_the_reference(shared_traces, tmp_path):
    # the same MNIST run with its DataLoader NVTX ranges deleted: data-wait must come from
    # the gaps between the 'Batch N' ranges alone
    path = tmp_path / "no_loader_ranges.sqlite"
    shutil.copy(shared_traces / "nsys" / "ai-profiler" / "baseline_nvtx.sqlite", path)
    path.chmod(0o644)
    con = sqlite3.connect(path)
    text = "COALESCE(text, (SELECT value FROM StringIds WHERE id = textId))"
    con.execute(
        f"DELETE FROM NVTX_EVENTS WHERE {text} = 'Data loading' "
        f"OR {text} LIKE 'enumerate(DataLoader)%'"
    )
    con.commit()
    con.close()
    d = gpudiag.analyze(path, jobs=1, thresholds=EVERY_STEP)
    ref = reference.nsys(path, "Batch %")
    _agree(d.steps, ref)
    share = sum(r.data_wait for r in ref) / sum(r.duration for r in ref)
    assert share > 0.9 and d.run.shares.data_wait == pytest.approx(share, abs=1e-6)
    assert d.findings[0].kind == "data_bound"
