"""Issue 16: the verdict, the words of user text, the compute-bound remedies, the Python API."""

from __future__ import annotations

import json

import pytest
from testpaths import TESTS

import gpudiag
from gpudiag.analysis.findings.compute import compute_bound
from gpudiag.analysis.model import words
from gpudiag.analysis.model.diagnosis import (
    Finding,
    FindingKind,
    KernelBreakdown,
    Mode,
    RunSummary,
    Severity,
    Shares,
    Verdict,
)
from gpudiag.analysis.model.metrics import ShareMetrics
from gpudiag.analysis.remedies.advice import recommend
from gpudiag.analysis.verdict import verdict
from gpudiag.api.saved import diagnosis_from_json
from gpudiag.config import AdviceRules


def _run(compute: float, comm: float = 0.0, data: float = 0.0) -> RunSummary:
    other = 1.0 - compute - comm - data
    return RunSummary(
        2,
        2,
        4,
        10_000_000,
        11_000_000,
        Shares(compute, comm, data, other),
        0.0,
        1.0 - compute,
        Mode.GPU,
    )


def _share_finding(kind: FindingKind, sev: Severity, per_rank: dict[str, float]) -> Finding:
    return Finding(
        kind, sev, "m", ranks=sorted(int(r) for r in per_rank), metrics=ShareMetrics(per_rank, 0.1)
    )


@pytest.mark.parametrize(
    ("xs", "text"),
    [
        ([3], "3"),
        ([0, 1], "0–1"),
        ([0, 1, 2, 3, 4, 5, 7], "0–5, 7"),
        ([0, 1, 5], "0, 1, 5"),
        ([2, 9, 10, 11], "2, 9–11"),
    ],
)
def test_rank_lists_fold(xs, text):
    assert words.fold(xs) == text


def test_words():
    assert words.ranks([4]) == "rank 4" and words.ranks([0, 1, 2]) == "ranks 0–2"
    assert [words.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 22, 101)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "22nd",
        "101st",
    ]
    assert words.plural(1, "step") == "1 step" and words.plural(2, "step") == "2 steps"
    assert words.percent(-0.001) == "0%"


def test_no_bottleneck_says_how_the_step_splits():
    v = verdict(_run(0.93), [])
    assert v == Verdict(
        "no bottleneck: compute 93%, non-compute idle 7%", "none", 0.93, [], "profiled window"
    )


def test_most_severe_then_largest_share_wins():
    data = _share_finding(FindingKind.DATA_BOUND, Severity.WARNING, {"0": 0.44, "1": 0.48})
    comm = _share_finding(FindingKind.COMM_BOUND, Severity.WARNING, {"0": 0.12})
    idle = _share_finding(FindingKind.IDLE_RATIO, Severity.WARNING, {"0": 0.9})
    v = verdict(_run(0.4, 0.12, 0.46), [idle, comm, data])
    assert v.bottleneck == "data" and v.ranks == [0, 1]
    assert v.headline == "data-bound: ranks 0–1 wait for input 46% of each step"
    severe = _share_finding(FindingKind.COMM_BOUND, Severity.ERROR, {"1": 0.31})
    v = verdict(_run(0.4, 0.31, 0.2), [data, severe])
    assert v.bottleneck == "communication"
    assert v.headline == "communication-bound: rank 1 waits for collectives 31% of each step"


def test_saved_diagnosis_without_a_verdict_gets_one(tmp_path):
    d = gpudiag.analyze(TESTS / "data" / "nccl219_data", jobs=1)
    doc = d.to_json()
    assert list(doc)[:4] == ["schema_version", "gpudiag_version", "inputs", "verdict"]
    del doc["verdict"], doc["kernels"]
    back = diagnosis_from_json(doc)
    assert back.verdict == d.verdict and back.kernels is None
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    assert gpudiag.analyze(path).verdict.bottleneck == "data"


def _kernels(families: dict[str, float], fp32: float = 0.0) -> KernelBreakdown:
    return KernelBreakdown("kernel", 100, [], families, fp32)


def test_compute_bound_remedies_follow_the_kernels():
    rules = AdviceRules()
    run = _run(0.9)
    assert (
        compute_bound(_run(rules.compute_bound_share - 0.01), _kernels({"GEMM": 1.0}), rules) == []
    )
    fused = compute_bound(
        run,
        _kernels({"elementwise": 0.4, "normalisation": 0.2, "GEMM": 0.3, "communication": 0.1}),
        rules,
    )
    assert fused[0].kind == FindingKind.COMPUTE_BOUND and fused[0].severity == Severity.INFO
    assert fused[0].metrics.fusable_share == pytest.approx(0.6 / 0.9)
    ids = [r.id for r in recommend(run, [], [], fused, None, rules)]
    assert ids == ["fuse-kernels"]
    fp32 = compute_bound(run, _kernels({"GEMM": 0.8, "elementwise": 0.2}, fp32=0.9), rules)
    assert [r.id for r in recommend(run, [], [], fp32, None, rules)] == ["reduced-precision"]
    bf16 = compute_bound(run, _kernels({"GEMM": 0.8, "elementwise": 0.2}, fp32=0.1), rules)
    assert recommend(run, [], [], bf16, None, rules) == []
    assert verdict(run, fused).bottleneck == "none"


def test_frames_and_markdown():
    pytest.importorskip("pandas")
    d = gpudiag.analyze(TESTS / "data" / "straggler_comms_id", jobs=1)
    f = gpudiag.findings_frame(d)
    assert list(f.columns[:5]) == ["kind", "severity", "message", "ranks", "steps"]
    assert len(f) == len(d.findings) and f["kind"].iloc[0] == str(d.findings[0].kind)
    md = gpudiag.to_markdown(d)
    assert md.splitlines()[2].startswith("**straggler: rank 1")


def test_public_names_are_clean():
    names = dir(gpudiag)
    assert "analyze" in names and "Diagnosis" in names and "Thresholds" in names
    assert not {"Any", "TYPE_CHECKING", "annotations", "importlib"} & set(names)
    assert set(gpudiag.__all__) == set(names)


def test_one_duration_with_the_roundings_outputs_have():
    # the four roundings the outputs have always had, at their boundaries
    ns = [None, 999, 12_340, 9_950_000, 12_340_000, 999_900_000, 1_234_000_000, 12_340_000_000]
    assert [words.duration(x) for x in ns] == [
        "n/a",
        "999 ns",
        "12.3 µs",
        "9.9 ms",
        "12.3 ms",
        "999.9 ms",
        "1.23 s",
        "12.3 s",
    ]
    assert [words.duration(x, "message") for x in ns[1:]] == [
        "0.0 ms",
        "0.0 ms",
        "9.9 ms",
        "12.3 ms",
        "999.9 ms",
        "1.23 s",
        "12.34 s",
    ]
    assert [words.duration(x, "brief") for x in ns[1:]] == [
        "0.0 ms",
        "0.0 ms",
        "9.9 ms",
        "12 ms",
        "1000 ms",
        "1.2 s",
        "12.3 s",
    ]
    assert words.duration(12_340_000, "ms") == "12.3 ms"
    assert words.duration(12_640_000, "ms", 0) == "13 ms"
