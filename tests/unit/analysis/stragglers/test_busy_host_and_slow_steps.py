"""s26 trial items 1, 2, 10: stragglers under a busy host, the telemetry straggler's one
step model, and a cluster of slow steps (hand-built inputs with known, injected effects)."""

from __future__ import annotations

import dataclasses

import pytest

from gpudiag.analysis.compare.gate import evaluate
from gpudiag.analysis.diagnose import build_diagnosis
from gpudiag.analysis.findings.variability import variability
from gpudiag.analysis.model.diagnosis import (
    Cause,
    Diagnosis,
    Finding,
    FindingKind,
    RunStep,
    Severity,
    StepBreakdown,
    WholeRun,
)
from gpudiag.analysis.model.metrics import StragglerMetrics
from gpudiag.analysis.rank.analyse import telemetry_results
from gpudiag.analysis.stragglers.busy_host import on_busy_host
from gpudiag.config import GateConfig, Thresholds, VariabilityRules
from gpudiag.rundir.conditions import RunConditions, host_contention


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


# ---- items 1 and 2: the telemetry straggler's one number, and a busy host ----

MS = 1_000_000


def _ddp(excess_ms: float, steps: int = 24, swing: float = 0.0) -> WholeRun:
    """A DDP job's step telemetry: rank 0 works ``excess_ms`` longer outside backward every
    step and rank 1 waits that long inside backward (its all-reduce), so both ranks' steps
    take the same 110 ms. Truth by construction: at rank 1's speed a step takes
    110 − excess ms. ``swing``: the excess alternates excess ± swing (it varies as a busy
    host's load does; issue 30: a steady one-sided excess is the job's own)."""
    out = []
    for s in range(steps):
        ex = excess_ms + (swing if s % 2 else -swing)
        for r in range(2):
            fwd = 40 + (ex if r == 0 else 0)
            bwd = 70 - (ex if r == 0 else 0)  # 55 ms compute + the wait
            out.append(RunStep(r, s, s * 110 * MS, 110 * MS, 0, None, round(bwd * MS), False))
            assert fwd + bwd == 110
    return WholeRun(ranks=[], steps=out)


def _diagnosis(whole: WholeRun, busy: dict[str, float] | None = None) -> Diagnosis:
    th = Thresholds()
    return build_diagnosis(telemetry_results(whole, th), th, whole_run=whole, host_contention=busy)


def test_telemetry_straggler_one_number() -> None:
    d = _diagnosis(_ddp(15))
    (f,) = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    m = f.metrics_as(StragglerMetrics)
    gain = 15 * MS  # injected
    assert f.ranks == [0] and f.persistent
    assert m.step_time_ns_mean == 110 * MS and m.step_time_ns_if_median_speed == 110 * MS - gain
    assert "the others wait for it 15.0 ms a step (14% of the mean step 110.0 ms)" in f.message
    assert d.verdict is not None and d.verdict.share == pytest.approx(15 / 110)
    assert "costs 14% of each step: the others wait 15 ms a step" in d.verdict.headline
    assert d.what_if is not None and d.what_if.if_straggler_at_median_speed_ns == 95 * MS
    (r,) = [r for r in d.recommendations if r.id == "investigate-rank-0"]
    assert r.estimated_gain_ns == gain


def test_telemetry_ranks_within_noise_name_no_straggler() -> None:
    # which rank works longer alternates (±3 ms): nobody makes the others wait every step
    whole = _ddp(0)
    steps = [
        dataclasses.replace(
            s, backward_ns=s.backward_ns + (3 if (s.step + s.rank) % 2 else -3) * MS
        )
        for s in whole.steps
    ]
    d = _diagnosis(WholeRun(ranks=[], steps=steps))
    assert not [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    assert d.verdict is not None and d.verdict.bottleneck != "straggler"


BUSY = {"other_cpu_ratio": 0.62}


def test_busy_host_qualifies_the_straggler_everywhere() -> None:
    # an excess that swings 5–25 ms a step, as contention does (a steady one is the job's:
    # tests/unit/analysis/stragglers/test_blame_rule.py)
    d = _diagnosis(_ddp(15, swing=10), BUSY)
    (f,) = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    assert f.severity == Severity.WARNING  # not a confident (error) straggler
    assert f.metrics_as(StragglerMetrics).host_contention == BUSY
    tail = "other processes used 62% of the CPUs during the run: likely the host, not the job"
    assert tail in f.message
    assert d.verdict is not None and d.verdict.headline.startswith("busy host: rank 0 costs 14%")
    assert tail in d.verdict.headline and d.verdict.bottleneck == "straggler"
    (r,) = [r for r in d.recommendations if r.finding == FindingKind.STRAGGLER]
    assert r.title.startswith("Re-run on a quiet host") and "nvidia-smi" not in r.detail
    assert r.evidence["host_contention"] == BUSY


def test_gate_straggler_under_contention_is_inconclusive_not_failed() -> None:
    busy = RunConditions({"samples": 10, "other_cpu_ratio_mean": 0.62, "steal_ratio_mean": 0.0})
    cfg = GateConfig()
    res = evaluate(_diagnosis(_ddp(15), BUSY), cfg, conditions=busy)
    (c,) = [c for c in res.checks if c.name == "straggler"]
    assert c.status == "inconclusive" and res.status != "failed"
    quiet = RunConditions({"samples": 10, "other_cpu_ratio_mean": 0.01, "steal_ratio_mean": 0.0})
    res = evaluate(_diagnosis(_ddp(15)), cfg, conditions=quiet)
    (c,) = [c for c in res.checks if c.name == "straggler"]
    assert c.status == "fail" and res.status == "failed"


def test_host_contention_reads_the_cpu_limits() -> None:
    cond = RunConditions({"samples": 10, "other_cpu_ratio_mean": 0.62, "steal_ratio_mean": 0.3})
    assert host_contention(cond, GateConfig()) == {"other_cpu_ratio": 0.62, "steal_ratio": 0.3}
    assert (
        host_contention(RunConditions({"samples": 3, "other_cpu_ratio_mean": 0.1}), GateConfig())
        == {}
    )
    assert host_contention(None, GateConfig()) == {}


def _straggler(cause: Cause) -> Finding:
    return Finding(
        FindingKind.STRAGGLER,
        Severity.ERROR,
        "rank 1 …",
        ranks=[1],
        metrics=StragglerMetrics(
            "trace", "", 0.8, 5 * MS, 0.2, 4, 4, {}, [], 25 * MS, 20 * MS, False, 25 * MS
        ),
        cause=cause,
        persistent=True,
    )


def test_busy_host_explains_a_cpu_jobs_compute_straggler_only() -> None:
    # a CPU job: stolen CPU stretches its compute (and data loading)
    for cause in (Cause.COMPUTE, Cause.UNKNOWN):
        (c,) = on_busy_host([_straggler(cause)], BUSY, gpu=False)
        assert c.severity == Severity.WARNING and "likely the host" in c.message
        assert c.metrics_as(StragglerMetrics).host_contention == BUSY
    # time outside compute (a sleep, Python) is not what contention stretches: the job's own,
    # with the busy host mentioned (gslow: a 0.15 s sleep on rank 1 beside a CPU hog)
    (h,) = on_busy_host([_straggler(Cause.HOST)], BUSY, gpu=False)
    assert h.severity == Severity.ERROR and "likely the host" not in h.message
    assert "the host was busy too: other processes used 62% of the CPUs" in h.message
    assert "host_contention" not in h.metrics.to_json()
    (d,) = on_busy_host([_straggler(Cause.DATA)], BUSY, gpu=False)  # its loader: its own
    assert d.severity == Severity.ERROR and "the host was busy too" in d.message
    # a quiet host changes nothing
    assert on_busy_host([_straggler(Cause.HOST)], {}, gpu=False) == [_straggler(Cause.HOST)]


def test_gpu_straggler_is_never_blamed_on_the_host_without_evidence() -> None:
    # a slower GPU compute is not the busy host's doing
    (g,) = on_busy_host([_straggler(Cause.COMPUTE)], BUSY, gpu=True)
    assert g == _straggler(Cause.COMPUTE)
    assert on_busy_host([_straggler(Cause.DATA)], BUSY, gpu=True) == [_straggler(Cause.DATA)]
    # host-side work: a starved launch thread could explain it, the trace cannot tell
    (h,) = on_busy_host([_straggler(Cause.HOST)], BUSY, gpu=True)
    assert h.severity == Severity.ERROR and "a starved launch thread could explain it" in h.message
