"""Both idles, and evidence first: gpudiag against HTA's figures, the raw events and construction.

* GPU idle (no kernel, copy or memset of any kind) against HTA 0.5.0's temporal breakdown
  on the shared sets (shared/traces/kineto/README.md) and against the reference reader on
  HTA's own window (HTA drops the last ProfilerStep: it keeps the GPU ops launched before
  the last step starts).
* What the trace can support: sampled traces (host-operator id holes, read by the
  reference), CPU-only views of a GPU job, communication-only extracts and one short step
  withhold or qualify the verdict and promise no gain; dropped events are counted.
"""

from __future__ import annotations

from pathlib import Path

import make_evidence_cases as cases
import pytest
import reference
from testpaths import nonempty

import gpudiag
from gpudiag.analysis.model.metrics import LimitedEvidenceMetrics
from gpudiag.config import SteadyRules
from gpudiag.traces.load import load_run

EVERY_STEP = gpudiag.Thresholds(steady=SteadyRules(include_warmup=True))
# HTA 0.5.0, get_temporal_breakdown, on HTA's window (README of shared/traces/kineto)
HTA_IDLE = {"a100x8_r3/rank-3.json.gz": 0.1620, "v100x2_r1/rank-1.json.gz": 0.0747}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> dict[str, Path]:
    return cases.build_all(tmp_path_factory.mktemp("evidence_cases"))


def _hta_window_idle(d: gpudiag.Diagnosis) -> float:
    """gpudiag's GPU idle over every step but the last (HTA drops the last ProfilerStep)."""
    steps = d.steps[:-1]
    return sum(s.gpu_idle_ns or 0 for s in steps) / sum(s.duration_ns for s in steps)


@pytest.mark.parametrize("rel", sorted(HTA_IDLE))
def test_gpu_idle_agrees_with_the_reference_on_htas_window(rel, kineto_sets):
    path = kineto_sets / rel
    d = gpudiag.analyze(path, jobs=1, thresholds=EVERY_STEP)
    _, hta_like, every_op = reference.hta_gpu_idle(path)
    # the reference reproduces HTA's published figure from the raw JSON ...
    assert hta_like == pytest.approx(HTA_IDLE[rel], abs=0.0005)
    # ... and gpudiag's GPU idle over the same steps agrees with the reference counting
    # every GPU op in HTA's window (gpudiag's periods follow the device, HTA's window too)
    assert _hta_window_idle(d) == pytest.approx(every_op, abs=0.01)
    # the non-compute idle is a different, larger quantity
    assert d.run.idle_ratio > d.run.gpu_idle_ratio + 0.2


def test_a100_gpu_idle_is_within_3_points_of_htas(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "a100x8_r3", jobs=1)
    assert d.run.gpu_idle_ratio == pytest.approx(0.1620, abs=0.03)
    assert _hta_window_idle(d) == pytest.approx(0.1620, abs=0.03)


def test_v100_htas_idle_counts_the_last_steps_ops_inside_its_window_as_idle(kineto_sets):
    # HTA's 7.47% leaves out the 43 ops the last step launched that run inside its window;
    # counting them (as nvidia-smi would: the GPU is busy) gives 3.5%, gpudiag 3.4–3.7%.
    path = kineto_sets / "v100x2_r1/rank-1.json.gz"
    _, hta_like, every_op = reference.hta_gpu_idle(path)
    assert hta_like - every_op > 0.03
    d = gpudiag.analyze(path, jobs=1)
    assert d.run.gpu_idle_ratio == pytest.approx(every_op, abs=0.005)


def test_gpu_idle_is_at_most_the_non_compute_idle_everywhere(kineto_sets):
    for path in sorted(p for p in kineto_sets.iterdir() if p.is_dir()):
        d = gpudiag.analyze(path, jobs=1)
        if d.run.gpu_idle_ratio is None:
            assert d.run.mode == "cpu", path
            continue
        assert d.run.gpu_idle_ratio <= d.run.idle_ratio + 1e-9, path
        for r in d.ranks:
            assert r.gpu_idle_ratio is not None and r.gpu_idle_ratio <= r.idle_ratio + 1e-9


def test_the_sampled_shared_set_is_said_to_be_sampled_and_promises_nothing(kineto_sets):
    path = kineto_sets / "sampled_2rank_a2a"
    for f in nonempty(path.glob("rank-*.json.gz"), "sampled ranks"):
        ids, span, holes = reference.host_id_holes(f)
        assert ids / span < 0.02 and holes > 0.5 * ids  # the raw events: ~1.4% kept
    d = gpudiag.analyze(path, jobs=1)
    assert d.verdict.bottleneck == "unknown"
    assert "sampled" in d.verdict.headline
    assert all(r.estimated_gain_ns is None for r in d.recommendations)
    assert d.what_if is None
    assert not [f for f in d.findings if f.kind in ("host_bound", "idle_ratio")]
    assert any("sampled" in n for n in d.notes)


def test_a_sampled_trace_is_told_from_the_complete_one(built):
    for name, sampled in (("complete", False), ("sampled", True)):
        ids, _, holes = reference.host_id_holes(built[name])
        assert (holes >= 0.2 * ids) == sampled
        d = gpudiag.analyze(built[name], jobs=1)
        assert (d.verdict.bottleneck == "unknown") == sampled, name


@pytest.mark.parametrize("where", ["edge_no_distinfo", "edge_distinfo_no_rank", "cpu_view"])
def test_a_cpu_only_view_of_a_gpu_job_withholds_the_split(where, kineto_sets, built):
    path = built[where] if where == "cpu_view" else kineto_sets / where
    d = gpudiag.analyze(path, jobs=1)
    assert d.verdict.bottleneck == "unknown"
    assert "cannot split compute from host time: the trace holds no GPU activity" in (
        d.verdict.headline
    )
    assert not d.recommendations or all(r.estimated_gain_ns is None for r in d.recommendations)


def test_a_real_cpu_only_job_is_judged(kineto_sets):
    # gloo and no GPU listed: nothing is missing, so nothing is withheld; but one step
    # with 2 host events starting in it is too little to generalise (issue 20, item 8)
    d = gpudiag.analyze(kineto_sets / "edge_cpu_only", jobs=1)
    assert d.verdict.bottleneck != "unknown"
    assert d.verdict.limits and "too little to generalise" in d.verdict.limits[0]
    assert all(r.estimated_gain_ns is None for r in d.recommendations)


def test_a_communication_only_extract_withholds_the_split(built):
    d = gpudiag.analyze(built["comm_only"], jobs=1)
    assert d.verdict.bottleneck == "unknown"
    assert "only communication" in d.verdict.headline


@pytest.mark.parametrize("where", ["edge_amd_mi250", "short"])
def test_one_short_step_qualifies_the_verdict(where, kineto_sets, built):
    path = built[where] if where == "short" else kineto_sets / where
    d = gpudiag.analyze(path, jobs=1)
    assert "— qualified: only" in d.verdict.headline
    assert "too little to generalise" in d.verdict.headline
    assert d.verdict.bottleneck != "unknown"
    (f,) = [f for f in d.findings if f.kind == "limited_evidence"]
    assert f.severity == "info"
    assert f.metrics == LimitedEvidenceMetrics(limit="short", effect="qualify")


def test_dropped_events_are_counted_with_their_reason(built):
    d = gpudiag.analyze(built["bad_times"], jobs=1)
    notes = [n for n in d.notes if "invalid timestamps" in n]
    assert notes == [
        "rank 0: 2 events with invalid timestamps ignored (ts or dur not a finite number, "
        "dur < 0, or beyond ±146 years)"
    ]
    (tl,) = load_run(built["bad_times"]).ranks
    assert sum(tl.meta.dropped.values()) == 2


def test_complete_shared_sets_carry_no_limit(kineto_sets):
    for name in (
        "a100x8_r3",
        "v100x2_r1",
        "a100x2_r0_pgcfg",
        "mi300x_ddp8_r0_rccl",
        "b200x8_r0_infer",
        "rtx2080ti_dataloader_nostep",
    ):
        d = gpudiag.analyze(kineto_sets / name, jobs=1)
        assert d.verdict.limits is None, name
        assert not [f for f in d.findings if f.kind == "limited_evidence"], name
