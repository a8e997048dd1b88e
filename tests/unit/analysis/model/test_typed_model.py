"""Issue 19: the parts of a Diagnosis are typed; their JSON is what the dicts gave."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from testpaths import DATA, GOLDEN, nonempty

import gpudiag
from gpudiag.analysis.model.diagnosis import (
    FindingKind,
    KernelBreakdown,
    RankEvidence,
    StepSource,
    Verdict,
)
from gpudiag.analysis.model.evidence import RankReading
from gpudiag.analysis.model.metrics import (
    BY_KIND,
    CommBoundMetrics,
    FindingMetrics,
    SavedMetrics,
    ShareMetrics,
    StragglerMetrics,
)
from gpudiag.api.saved import diagnosis_from_json


@pytest.mark.parametrize(
    "name", nonempty((p.parent.name for p in GOLDEN.glob("*/diagnosis.json")), "golden diagnoses")
)
def test_golden_documents_load_into_their_kinds_classes(name):
    doc = json.loads((GOLDEN / name / "diagnosis.json").read_text())
    d = diagnosis_from_json(doc)
    assert d.to_json() == doc
    assert isinstance(d.verdict, Verdict)
    assert all(isinstance(r.evidence, RankEvidence) for r in d.ranks)
    assert all(isinstance(r.step_source, StepSource) for r in d.ranks)
    assert d.kernels is None or isinstance(d.kernels, KernelBreakdown)
    for f in d.findings:
        assert type(f.metrics) in BY_KIND[f.kind], (f.kind, f.metrics)


def test_every_kind_but_none_has_a_metrics_class():
    assert set(BY_KIND) == set(FindingKind)
    assert all(issubclass(c, FindingMetrics) for cs in BY_KIND.values() for c in cs)


def test_metrics_json_keeps_absent_keys_absent_and_nulls_null():
    m = CommBoundMetrics({"0": 0.2}, 0.1, {"0": None})
    assert m.to_json() == {
        "per_rank": {"0": 0.2},
        "threshold": 0.1,
        "comm_hidden_ratio": {"0": None},
    }
    m = dataclasses.replace(m, sync_wait_share=0.5)
    assert list(m.to_json()) == ["per_rank", "threshold", "comm_hidden_ratio", "sync_wait_share"]
    assert RankEvidence(comm_top="x").to_json() == {"comm_top": "x"}


def test_a_ranks_reading_reads_back_typed_and_its_json_leaves_out_what_does_not_apply():
    reading = RankReading(steps_found=3, source="ProfilerStep", window_ns=10, holds={"kernels": 4})
    assert RankEvidence(reading=reading).to_json() == {
        "reading": {
            "steps_found": 3,
            "source": "ProfilerStep",
            "window_ns": 10,
            "startup_ns": 0,
            "holds": {"kernels": 4},
        }
    }
    docs = [json.loads(p.read_text()) for p in sorted(GOLDEN.glob("*/diagnosis.json"))]
    read = [
        (doc, r.evidence.reading)
        for doc in docs
        for r in diagnosis_from_json(doc).ranks
        if r.evidence.reading is not None
    ]
    assert read, "no golden diagnosis has a rank's reading"
    assert all(isinstance(rd, RankReading) for _, rd in read)
    startup = [rd for _, rd in read if rd.startup_calls]
    assert startup and all(rd.startup_end_ns is not None for rd in startup)


def test_metrics_of_another_shape_are_kept_as_read():
    doc = json.loads((GOLDEN / "sampled_2rank_a2a" / "diagnosis.json").read_text())
    doc = copy.deepcopy(doc)
    doc["findings"][0]["metrics"] = {"per_rank": {"0": 0.5}, "from_a_later_version": [1, 2]}
    d = diagnosis_from_json(doc)
    assert isinstance(d.findings[0].metrics, SavedMetrics)
    assert d.to_json() == doc


def test_verdict_and_stragglers_read_typed_metrics():
    d = gpudiag.analyze(DATA / "straggler_comms_id", jobs=1)
    (f,) = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    m = f.metrics_as(StragglerMetrics)
    assert d.verdict is not None and d.verdict.bottleneck == "straggler"
    assert d.verdict.share == pytest.approx(m.cost_ratio())  # what it costs the mean step
    with pytest.raises(TypeError, match="not ShareMetrics"):
        f.metrics_as(ShareMetrics)


def test_the_diagnosis_module_renders_and_reads_nothing():
    import gpudiag.analysis.model.diagnosis as model

    assert not {"to_markdown", "steps_frame", "findings_frame", "from_json"} & set(
        dir(model.Diagnosis)
    )
    text = Path(model.__file__).read_text()
    assert "gpudiag.report" not in text and "resources" not in text
