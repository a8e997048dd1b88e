"""Pipelines recognised at any bubble size (issue 24 §4), on hand-built GPipe traces.

The truth is the construction (tests/accuracy/make_pipeline_cases.py): p stages, m
micro-batches, each stage's receive wait per step (p − 1)(F + B) − s·B (+ an injected slow
link), the schedule's bubble (p − 1)/(m + p − 1) — never an earlier gpudiag output.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

import gpudiag
from gpudiag.report.console import render

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import make_pipeline_cases as mp  # noqa: E402
from consistency import problems  # noqa: E402

BELOW = ["gpipe_p4_m8", "gpipe_p4_m16", "gpipe_p2_m8"]  # schedule and waits ≤ 30%
ABOVE = ["gpipe_p4_m4", "gpipe_p4_m16_slowlink"]  # schedule > 30%; waits 13 points over it


@pytest.fixture(scope="module")
def diagnoses(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipelines")
    return {n: gpudiag.analyze(mp.build(n, out), jobs=1) for n in mp.CASES}


@pytest.mark.parametrize("name", list(mp.CASES))
def test_stages_m_schedule_and_each_stages_wait_are_the_constructions(diagnoses, name):
    c, d = mp.CASES[name], diagnoses[name]
    pipe = d.collectives.pipeline
    assert (pipe.stages, pipe.micro_batches, pipe.schedule) == (c.p, c.m, "gpipe")
    assert pipe.ideal_bubble_ratio == pytest.approx((c.p - 1) / (c.m + c.p - 1))
    period = c.step_us() + mp.GAP_US
    for s in range(c.p):
        truth = c.recv_wait_us(s) / period
        assert pipe.stage_bubble_ratio[str(s)] == pytest.approx(truth, abs=0.002), s
    (f,) = [f for f in d.findings if f.kind == "pipeline_bubble"]  # one, at any bubble size
    assert f.ranks == list(range(c.p))


@pytest.mark.parametrize("name", BELOW)
def test_a_bubble_within_the_threshold_is_an_info_finding_the_verdict_names(diagnoses, name):
    c, d = mp.CASES[name], diagnoses[name]
    (f,) = [f for f in d.findings if f.kind == "pipeline_bubble"]
    assert f.severity == "info"
    assert f"pipeline of {c.p} stages (GPipe, m = {c.m})" in f.message
    assert f"bubble (p−1)/(m+p−1) is {(c.p - 1) / (c.m + c.p - 1):.0%}" in f.message
    assert "within the 30% idle threshold" in f.message
    # its receive waits are the bubble: never "communication not hidden", nor a straggler
    assert not [g for g in d.findings if g.kind in ("comm_bound", "straggler", "host_bound")]
    v = d.verdict
    assert v.bottleneck == "none" and d.findings[v.finding] is f
    assert v.headline.startswith("no bottleneck beyond the pipeline's bubble")
    assert f"{c.p} stages (GPipe, m = {c.m})" in v.headline
    assert f"idle {round(100 * max(f.metrics.bubble_ratio, f.metrics.ideal_bubble_ratio))}%" in (
        v.headline
    )


def test_more_micro_batches_only_while_they_would_shrink_the_bubble(diagnoses):
    # m = 8 < 4·p: the remedy, worth the schedule's bubble at m = 8 less that at m = 16
    d = diagnoses["gpipe_p4_m8"]
    (rec,) = [r for r in d.recommendations if r.id == "pipeline-microbatches"]
    gain = (3 / 11 - 3 / 19) * d.what_if.step_time_ns
    assert rec.estimated_gain_ns == pytest.approx(gain, rel=0.01)
    # m = 16 = 4·p already: nothing to propose
    d = diagnoses["gpipe_p4_m16"]
    assert not [r for r in d.recommendations if r.id == "pipeline-microbatches"]


@pytest.mark.parametrize("name", ABOVE)
def test_a_bubble_above_the_threshold_or_the_schedule_is_a_warning(diagnoses, name):
    d = diagnoses[name]
    (f,) = [f for f in d.findings if f.kind == "pipeline_bubble"]
    assert f.severity == "warning"
    assert d.verdict.bottleneck == "pipeline"
    if name.endswith("slowlink"):  # balanced stages: the excess is put on the transfers
        assert "slow point-to-point transfers" in f.message


@pytest.mark.parametrize("name", list(mp.CASES))
def test_every_pipeline_case_tells_one_story(diagnoses, name):
    buf = io.StringIO()
    render(diagnoses[name], buf, width=110, color=False)
    assert not problems(diagnoses[name].to_json(), buf.getvalue())
