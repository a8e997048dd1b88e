"""Issue 24 §1: a straggler verdict quotes its finding in that finding's own terms.

The README demo on a busy host opened with "rank 1 runs 0% slower than the median rank": a
late-arrival straggler (the rank the others wait for at the collectives) has no
``median_excess_ratio``, and the verdict read that metric for every straggler. Two stalls in
a 6-step window were "683% slower" (the excess of one stall over a step, as if every step
stalled). Each kind now speaks for itself, and the verdict names the finding it quotes.
"""

from __future__ import annotations

import sys

from testpaths import DATA, TESTS

from gpudiag.analysis.model.diagnosis import (
    Cause,
    Diagnosis,
    Finding,
    FindingKind,
    Mode,
    RunSummary,
    Severity,
    Shares,
)
from gpudiag.analysis.model.metrics import LateArrivalMetrics, StragglerMetrics
from gpudiag.analysis.verdict import verdict

sys.path.insert(0, str(TESTS))
from consistency import problems

RUN = RunSummary(
    2, 2, 6, 1_000_000_000, 1_200_000_000, Shares(0.9, 0.1, 0.0, 0.0), 0.0, 0.1, Mode.CPU
)


def _stalls(persistent: bool, excess_ns: int, slow: int, compared: int) -> Finding:
    m = StragglerMetrics(
        source="trace",
        wait_attribution="busy-time gap",
        score=0.9,
        median_excess_ns=excess_ns,
        median_excess_ratio=excess_ns / 1e9,
        slow_steps=slow,
        steps_compared=compared,
        excess_by_part_ns={},
        also=[],
        step_time_ns_median=1_000_000_000,
        step_time_ns_if_median_speed=1_000_000_000,
        short_window=True,
    )
    return Finding(
        FindingKind.STRAGGLER,
        Severity.ERROR if persistent else Severity.WARNING,
        "m",
        ranks=[1],
        steps=[] if persistent else [3, 7],
        metrics=m,
        cause=Cause.COMPUTE,
        persistent=persistent,
    )


def _late() -> Finding:
    m = LateArrivalMetrics(
        source="late_arrival",
        last_at=9,
        collectives_matched=10,
        next_rank_last_at=1,
        wait_share=0.9,
        waited_ns_per_step=150_000_000,
        median_excess_ns=150_000_000,
        excess_by_part_ns={},
        steps_compared=5,
        step_time_ns_median=1_000_000_000,
    )
    return Finding(
        FindingKind.STRAGGLER,
        Severity.WARNING,
        "m",
        ranks=[1],
        steps=[5, 6],
        metrics=m,
        cause=Cause.COMPUTE,
    )


def _doc(f: Finding) -> dict:
    v = verdict(RUN, [f])
    d = Diagnosis(
        run=RUN,
        ranks=[],
        steps=[],
        findings=[f],
        verdict=v,
        thresholds={"stragglers": {"excess_ratio": 0.1}},
    )
    return d.to_json()


def test_late_arrival_verdict_quotes_the_waiting_not_a_missing_excess():
    v = verdict(RUN, [_late()])
    assert v.headline.startswith("straggler: rank 1 arrives last at 9 of 10 collectives")
    assert "the others wait 150 ms a step for it (15% of each step)" in v.headline
    assert "0% slower" not in v.headline
    assert v.share == 0.15 and v.finding == 0 and v.ranks == [1]
    assert problems(_doc(_late())) == []


def test_two_stalls_are_a_count_not_a_slowdown():
    f = _stalls(False, 6_830_000_000 // 10, slow=2, compared=6)  # 683 ms each time
    v = verdict(RUN, [f])
    assert "stalled in 2 of 6 steps" in v.headline and "683 ms behind" in v.headline
    assert "slower than the median" not in v.headline
    assert abs(v.share - 0.683 * 2 / 6) < 1e-9  # what the stalls cost a step on average
    assert problems(_doc(f)) == []


def test_a_persistent_straggler_quotes_its_typical_excess():
    # a finding without its cost (a file written before it was recorded): its typical excess
    f = _stalls(True, 420_000_000, slow=6, compared=6)
    v = verdict(RUN, [f])
    assert v.headline.startswith("straggler: rank 1 (slower compute) costs 42% of each step")
    assert v.share == 0.42 and problems(_doc(f)) == []


def test_the_checker_catches_the_old_zero_percent_headline():
    doc = _doc(_late())
    doc["verdict"]["headline"] = "straggler: rank 1 runs 0% slower than the median rank"
    doc["verdict"]["share"] = 0.0
    found = problems(doc)
    assert any("0% slower" in p for p in found) and any("metric" in p for p in found)


def test_recorded_busy_host_demo_run_no_longer_reads_zero_percent_slower():
    # a CPU-bound demo run recorded beside a CPU hog (tests/data/gate_recorded_runs/README.md):
    # its late-arrival straggler made the verdict "rank 0 runs 0% slower than the median rank"
    import dataclasses

    from gpudiag.api.load import load_diagnosis

    d = load_diagnosis(DATA / "gate_recorded_runs" / "cpu_same9.diagnosis.json")
    v = verdict(d.run, d.findings)
    assert v.headline == (
        "straggler: rank 0 arrives last at 4 of 4 collectives (slower compute); "
        "the others wait 36 ms a step for it (12% of each step)"
    )
    doc = dataclasses.replace(d, verdict=v, what_if=None, recommendations=[]).to_json()
    assert problems(doc) == []
