"""Two kinds of step (issue 24 §4): the variability finding names both, not one median.

The step times are built here; the two kinds, their counts and the slow steps are known
from the construction.
"""

from __future__ import annotations

import pytest

from gpudiag.analysis.findings.variability import variability
from gpudiag.analysis.model.diagnosis import StepBreakdown
from gpudiag.analysis.run.modes import step_modes
from gpudiag.config import SteadyRules, VariabilityRules


def _steps(durations_ms: list[float]) -> list[StepBreakdown]:
    out, t = [], 0
    for i, d in enumerate(durations_ms):
        ns = round(d * 1e6)
        out.append(StepBreakdown(0, i + 1, t, ns, ns, 0, 0, 0, 0))
        t += ns
    return out


def test_alternating_steps_name_both_kinds_and_the_slow_steps():
    # NERSC's baseline: ~0.2 s and ~1.5 s steps, alternating (steps 2, 4, … are slow)
    durs = [d for i in range(6) for d in (200.0 + i % 3, 1500.0 + i % 5)]
    (f,) = variability(_steps(durs), VariabilityRules(), steady=SteadyRules())
    m = f.metrics
    assert [k["steps"] for k in m.modes] == [6, 6]
    assert m.modes[0]["median_ns"] == pytest.approx(201e6, rel=0.01)
    assert m.modes[1]["median_ns"] == pytest.approx(1502e6, rel=0.01)
    assert f.steps == [2, 4, 6, 8, 10, 12]
    assert "two kinds of step: 6 around 20" in f.message and "6 around 1.50 s" in f.message
    assert "describes neither" in f.message


def test_a_slow_majority_is_named_as_the_slow_kind_not_as_jitter():
    # 4 fast steps of 100 ms, 6 slow of 180 ms: the median is a slow step, no step is 1.5×
    # it, yet the run has two kinds of step; the slow ones are steps 5–10
    durs = [100.0, 101.0, 99.0, 100.0, 180.0, 181.0, 179.0, 180.0, 182.0, 180.0]
    (f,) = variability(_steps(durs), VariabilityRules(), steady=SteadyRules())
    assert f.metrics.pattern == "two_kinds"
    assert f.steps == [5, 6, 7, 8, 9, 10]
    assert "4 around 100.0 ms" in f.message and "6 around 180.0 ms" in f.message
    # the slow ones' excess is over the fast kind's median: 6 × 80 ms of 1482 ms
    assert f.metrics.excess_share == pytest.approx(6 * 80.5 / sum(durs), abs=0.005)


def test_one_kind_of_step_has_no_modes():
    durs = [100.0, 104.0, 98.0, 101.0, 103.0, 99.0, 100.0, 102.0]
    assert step_modes([round(d * 1e6) for d in durs]) == []
    assert variability(_steps(durs), VariabilityRules(), steady=SteadyRules()) == []
