"""s26 trial items 1, 2, 10: stragglers under a busy host, the telemetry straggler's one
step model, and a cluster of slow steps (hand-built inputs with known, injected effects)."""

from __future__ import annotations

from gpudiag.analysis.model import FindingKind, StepBreakdown
from gpudiag.analysis.variability import variability
from gpudiag.config import VariabilityRules


def _job_steps(durations_ms: list[float], ranks: int = 2) -> list[StepBreakdown]:
    """Every rank takes the same time in a step (a synchronous job), except rank 1 is 1 ms
    faster: the job step is rank 0's."""
    out, t = [], 0
    for i, d in enumerate(durations_ms):
        for r in range(ranks):
            ns = round((d - r) * 1e6)
            out.append(StepBreakdown(r, i + 1, t, ns, ns, 0, 0, 0, 0))
        t += round(d * 1e6)
    return out


# ---- item 10: a cluster of slow steps is not a single outlier ----

# 12 steps around 100 ms; 4 injected slow ones (steps 3, 5, 8, 11), the slowest just over
# 1.5× the median and the other three just under it (the trial's ok1 shape)
_CLUSTER = [100, 98, 147, 101, 156, 99, 102, 144, 100, 97, 141, 103]


def test_a_cluster_of_slow_steps_is_not_a_single_outlier() -> None:
    (f,) = variability(_job_steps(_CLUSTER), VariabilityRules())
    assert f.kind == FindingKind.STEP_VARIABILITY
    assert "single outlier" not in f.message
    assert f.metrics.pattern == "stalls"
    assert f.steps == [3, 5, 8, 11]  # exactly the injected ones
    assert "4 of 12 steps are slow" in f.message


def test_a_lone_slow_step_is_still_a_single_outlier() -> None:
    lone = [100, 98, 104, 101, 156, 99, 102, 103, 100, 97, 101, 103]
    (f,) = variability(_job_steps(lone), VariabilityRules())
    assert f.metrics.pattern == "outlier" and f.steps == [5]


def test_the_findings_median_is_the_job_steps_and_says_so() -> None:
    (f,) = variability(_job_steps(_CLUSTER), VariabilityRules())
    # job step = each step's slowest rank (rank 0 here): median of the injected durations
    assert f.metrics.median_ns == round(
        sorted(_CLUSTER)[5] * 1e6 / 2 + sorted(_CLUSTER)[6] * 1e6 / 2
    )
    assert "median of 101.5 ms (per step, the slowest rank's time)" in f.message
