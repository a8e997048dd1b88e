"""The gate's timing checks: one run-level test, applied to wall-clock and to CPU time per step.

Both checks reduce each run to the median of one per-step quantity over its steady steps
and compare the candidate's median with the baseline runs' medians (docs/gate.md, "The
regression rule"):

* ``step_time_regression``: the job's wall-clock step time (per step, the slowest rank).
  A busy host stretches it: on a candidate whose recorded run conditions are contended
  a slowdown cannot fail on it (inconclusive, ``own_test_slower`` in its details), unless
  the baseline runs were recorded as contended (:func:`comparable_contention`).
* ``cpu_time_regression``: the CPU time of each rank's training thread per step (per
  step, the largest over the ranks), recorded by the rank hook. It counts the work the
  job's own code does, which contention stretches far less than the wall clock, so it
  can fail a contended candidate. Applied on CPU runs whose runs all recorded it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag._support.records import dataclass
from gpudiag.analysis.compare.baseline import RunStat
from gpudiag.analysis.compare.checks import (
    FAIL,
    INCONCLUSIVE,
    OFF,
    PASS,
    Check,
    CheckDetails,
    CheckStatus,
)
from gpudiag.analysis.compare.stats import mann_whitney_u, t_ppf, t_sf
from gpudiag.analysis.model.words import duration
from gpudiag.config import GateConfig
from gpudiag.rundir.conditions import STEADY_CPU_RATIO, RunConditions, contention

WALL = "step_time_regression"
CPU = "cpu_time_regression"
OWN_TEST_SLOWER = "own_test_slower"  # details key: the check's own test says slower
COMPARABLE = "comparable_contention"  # details key: why a contended run's wall clock is tested


def runs_needed(cv: float, effect: float, cfg: GateConfig) -> int | None:
    """The fewest baseline runs whose noise floor is below ``effect``; None past the cap."""
    for n in range(2, cfg.max_runs_advice + 1):
        if t_ppf(1.0 - cfg.run_alpha, n - 1) * cv * math.sqrt(1.0 + 1.0 / n) < effect:
            return n
    return None


def _median(samples: Sequence[int]) -> float:
    return float(nputil.median(list(samples)))


def _advice(cv: float, effect: float, limit: float, cfg: GateConfig) -> str:
    need = runs_needed(cv, max(effect, limit), cfg)
    target = f"{max(effect, limit):.0%}"
    if need is not None:
        return (
            f"the baseline runs vary by ±{cv:.1%}; need ≥ {need} runs or a quieter runner "
            f"to detect {target}"
        )
    return (
        f"the baseline runs vary by ±{cv:.1%}; more runs will not detect {target}: "
        "use a quieter runner"
    )


@dataclass(frozen=True)
class RunLevelTest:
    """The run-level test of one candidate median against n ≥ 2 baseline medians."""

    effect: float  # c / m − 1
    mean: float  # m, the baseline medians' mean
    cv: float  # their spread: s / m
    t_quantile: float  # t_{1−run_alpha, n−1}
    p: float  # P(T_{n−1} > (c − m) / (s √(1 + 1/n)))
    mde: float  # the smallest detectable effect


def run_level_test(c: float, medians: Sequence[float], cfg: GateConfig) -> RunLevelTest:
    """The run-level test of one candidate median ``c`` against n ≥ 2 baseline medians.

    ``effect`` = c / m − 1; ``mde`` = t_{1−run_alpha, n−1} · s · √(1 + 1/n) / m (the
    one-sided prediction bound of one new run); ``p`` = P(T_{n−1} > (c − m) / (s √(1 + 1/n))).
    """
    n, m = len(medians), float(np.mean(medians))
    s = float(np.std(medians, ddof=1))
    cv = s / m if m > 0 else 0.0
    tq = t_ppf(1.0 - cfg.run_alpha, n - 1)
    scale = s * math.sqrt(1.0 + 1.0 / n)
    p = t_sf((c - m) / scale, n - 1) if scale > 0 else (0.0 if c > m else 1.0)
    effect = c / m - 1.0 if m > 0 else 0.0
    return RunLevelTest(
        effect=effect, mean=m, cv=cv, t_quantile=tq, p=p, mde=tq * cv * math.sqrt(1.0 + 1.0 / n)
    )


@dataclass(frozen=True)
class _Reading:
    """A candidate's median against the baseline's: what the check's outcome rests on."""

    mean: float  # the baseline's (its one median, or the medians' mean)
    effect: float
    floor: float  # the effect a slowdown must pass to fail
    mde: float | None
    p: float
    signal: bool  # the test says slower
    ci: list[float]
    desc: str
    advice: str
    test: RunLevelTest | None = None  # two or more baseline runs


def _read(what: str, c: float, medians: list[float], p_mw: float, cfg: GateConfig) -> _Reading:
    """One baseline run: the within-run test above a floor; more: the run-level test."""
    n = len(medians)
    if n == 1:
        m = medians[0]
        effect = c / m - 1.0 if m > 0 else 0.0
        floor = cfg.single_run_min_effect_ratio
        head = f"{what} {duration(c, 'ms')} vs {duration(m, 'ms')} baseline ({effect:+.1%}"
        desc = (
            f"{head}; one baseline run: no between-run spread, so timing fails only above "
            f"+{floor:.0%}; within-run Mann-Whitney p={p_mw:.2g})"
        )
        advice = "give 3 or more baseline runs (--baseline B1 B2 B3) to measure the runner's noise"
        return _Reading(m, effect, floor, None, p_mw, p_mw < cfg.alpha, [], desc, advice)
    t = run_level_test(c, medians, cfg)
    ci = [t.effect - t.mde, t.effect + t.mde]
    head = f"{what} {duration(c, 'ms')} vs {duration(t.mean, 'ms')} baseline ({t.effect:+.1%}"
    desc = (
        f"{head}, {1.0 - 2.0 * cfg.run_alpha:.0%} CI {ci[0]:+.1%} to {ci[1]:+.1%}); "
        f"{n} baseline runs vary by ±{t.cv:.1%}, smallest detectable effect {t.mde:.1%}; "
        f"run-level p={t.p:.2g}, within-run Mann-Whitney p={p_mw:.2g}"
    )
    advice = _advice(t.cv, t.effect, cfg.min_effect_ratio, cfg)
    return _Reading(t.mean, t.effect, t.mde, t.mde, t.p, t.p < cfg.run_alpha, ci, desc, advice, t)


def timing_check(
    name: str,
    cand: Sequence[int],
    base: Sequence[Sequence[int]],
    cfg: GateConfig,
    contended: Sequence[str] = (),
    noisy: Sequence[str] = (),
) -> Check:
    """One timing check (``WALL`` or ``CPU``) of a candidate's per-step samples (the rule above).

    ``contended``: why a slowdown cannot fail (the wall clock: the candidate's run
    conditions over their limits; CPU time: a host that made the same work cost more);
    ``noisy``: the baseline runs whose conditions were contended.
    """
    what = "median step time" if name == WALL else "median training-thread CPU time a step"
    limit = cfg.min_effect_ratio
    counts = [len(cand), min(len(b) for b in base)]
    if min(counts) < cfg.min_samples:
        return Check(
            name,
            None,
            INCONCLUSIVE,
            None,
            limit,
            f"too few steady steps to compare: {counts[0]} (subject) and {counts[1]} "
            f"(smallest baseline run); need {cfg.min_samples} each",
            samples=counts,
        )
    medians = [_median(b) for b in base]
    c = _median(cand)
    _, p_mw = mann_whitney_u(list(cand), [v for b in base for v in b], alternative="greater")
    r = _read(what, c, medians, p_mw, cfg)
    details = _details(c, medians, p_mw, r, cfg)
    desc = r.desc
    if noisy:
        # A contended baseline run widens the spread (a larger noise floor), never hides one.
        desc += f"; contended baseline runs: {', '.join(noisy)}"
        details["contended_baseline_runs"] = list(noisy)

    def check(status: CheckStatus, message: str) -> Check:
        return Check(
            name,
            None,
            status,
            r.effect,
            limit,
            message,
            p_value=r.p,
            effect_ratio=r.effect,
            samples=counts,
            ci=r.ci,
            mde_ratio=r.mde,
            details=details,
        )

    if r.effect <= limit:
        verdict = "not slower" if r.effect <= 0 else f"within min effect +{limit:.0%}"
        return check(PASS, f"{verdict}: {desc}")
    slower = r.signal and r.effect > limit
    details["own_test_slower"] = slower  # OWN_TEST_SLOWER
    if not (slower and r.effect > r.floor):
        return check(INCONCLUSIVE, f"inconclusive: {r.advice}: {desc}")
    if contended and name == WALL:
        return check(
            INCONCLUSIVE,
            f"inconclusive: slower, but the run was contended ({'; '.join(contended)}), so "
            f"the wall clock cannot fail it (the job's own work decides: {CPU}): {desc}",
        )
    if contended:
        return check(
            INCONCLUSIVE, f"inconclusive: more CPU time, but {'; '.join(contended)}: {desc}"
        )
    return check(FAIL, f"slower: {desc}")


def _details(
    c: float, medians: list[float], p_mw: float, r: _Reading, cfg: GateConfig
) -> CheckDetails:
    """The check's ``details`` (the JSON's keys, in the order the gate has written them)."""
    details: CheckDetails = {
        "baseline_runs": len(medians),
        "baseline_medians_ns": medians,
        "candidate_median_ns": c,
        "within_run_mann_whitney_p": p_mw,
    }
    t = r.test
    if t is not None:
        details["baseline_cv"] = t.cv
        details["t_quantile"] = t.t_quantile
        details["run_level_p"] = t.p
    details["baseline_mean_ns"] = r.mean
    details["min_effect_ratio"] = cfg.min_effect_ratio
    return details


def cpu_not_applied(runs: Sequence[RunStat], mode: str, gpu: bool) -> Check | None:
    """Why ``cpu_time_regression`` is off for these runs (a GPU run, runs without CPU times)."""
    if gpu or mode == "gpu":
        why = (
            "not applied on a GPU run (the training thread's CPU time is not the step's work there)"
        )
        return Check(CPU, None, OFF, None, None, why)
    missing = [r.name or f"run {i}" for i, r in enumerate(runs) if not r.cpu_ns]
    if not missing:
        return None
    return Check(
        CPU,
        None,
        OFF,
        None,
        None,
        f"not applied: no training-thread CPU time recorded for "
        f"{', '.join(missing[:3])}{' …' if len(missing) > 3 else ''} (recorded "
        "by `gpudiag run`'s step telemetry; traces, older runs and saved "
        "diagnoses without it)",
    )


def cpu_check(
    cand: RunStat, base: Sequence[RunStat], cfg: GateConfig, mode: str, gpu: bool
) -> Check:
    """``cpu_time_regression``, or why it is not applied (:func:`cpu_not_applied`)."""
    off = cpu_not_applied([cand, *base], mode, gpu)
    if off is not None:
        return off
    return timing_check(
        CPU,
        cand.cpu_ns,
        [b.cpu_ns for b in base],
        cfg,
        host_cost(cand, base, cfg),
        noisy_runs(base, cfg),
    )


HOST_COST = "sample_cost_us_mean"  # the run-conditions sampler's CPU time per sample


def host_cost(cand: RunStat, base: Sequence[RunStat], cfg: GateConfig) -> list[str]:
    """Why the candidate's CPU times are not comparable: the same fixed work cost more there.

    The run-conditions sampler does the same work every sample (it reads /proc) and records
    its CPU time; when the candidate's mean is more than ``max_host_cost_increase_ratio``
    above the costliest baseline run's, the host's load made CPU time dearer (context
    switches, caches) and a CPU slowdown cannot fail. Empty when any run did not record it.
    """
    costs = [(r.conditions or {}).get(HOST_COST) for r in [cand, *base]]
    if any(not isinstance(c, (int, float)) or c <= 0 for c in costs):
        return []
    c, top = float(costs[0]), max(float(x) for x in costs[1:])  # type: ignore[arg-type]
    if c <= top * (1.0 + cfg.max_host_cost_increase_ratio):
        return []
    return [
        f"the host made the same work dearer: the run-conditions sampler's fixed work "
        f"took {c / top - 1.0:+.0%} CPU time against the costliest baseline run (limit "
        f"+{cfg.max_host_cost_increase_ratio:.0%})"
    ]


def noisy_runs(base: Sequence[RunStat], cfg: GateConfig) -> list[str]:
    """The baseline runs whose recorded run conditions were contended."""
    return [
        b.name or f"run {i + 1}"
        for i, b in enumerate(base)
        if b.conditions is not None and contention(RunConditions(dict(b.conditions)), cfg)
    ]


STEADY_LABEL = "other processes' and steal CPU share over the steady steps"


def contention_levels(
    conditions: Mapping[str, object] | None, steady: bool = False
) -> dict[str, float]:
    """A run's recorded contention figures: CPU shares, and each GPU's throttled/shared share.

    ``steady``: the CPU share over the steady steps (:data:`STEADY_CPU_RATIO`) stands for the
    run's mean other-process and steal shares, which are mostly its start-up's.
    """
    if not conditions:
        return {}
    c = RunConditions(dict(conditions))
    cpu = (
        ((STEADY_LABEL, c.steady_cpu_ratio),)
        if steady
        else (
            ("other processes' CPU share", c.other_cpu_ratio_mean),
            ("steal share", c.steal_ratio_mean),
        )
    )
    out = {k: v for k, v in cpu if v is not None}
    for uuid, g in c.gpus.items():
        out[f"GPU {uuid} throttled share"] = g.slowdown_ratio
        out[f"GPU {uuid} shared share"] = g.shared_ratio
    return out


def comparable_contention(cand: RunStat, base: Sequence[RunStat], cfg: GateConfig) -> str | None:
    """Why a contended candidate's wall clock is still tested, or None when it is not.

    Comparable: every baseline run recorded its conditions, and each of the candidate's
    contention figures is at most ``comparable_contention_margin`` above the busiest
    baseline run's (a figure no baseline run recorded is not comparable). The CPU figure is
    the share over the steady steps when every run has it (the steps the test compares; a
    run's mean is mostly its start-up), else the runs' mean shares.
    """
    if not cand.conditions or any(not b.conditions for b in base):
        return None
    runs = [cand.conditions, *(b.conditions for b in base)]
    steady = all(r is not None and r.get(STEADY_CPU_RATIO) is not None for r in runs)
    levels = contention_levels(cand.conditions, steady)
    if not levels:
        return None
    worst: dict[str, float] = {}
    for b in base:
        for k, v in contention_levels(b.conditions, steady).items():
            worst[k] = max(worst.get(k, v), v)
    margin = cfg.comparable_contention_margin
    if any(k not in worst or v > worst[k] + margin for k, v in levels.items()):
        return None
    top = max(levels, key=lambda k: levels[k] - worst[k])
    return (
        f"the baseline runs were as contended ({top} {levels[top]:.0%}, busiest baseline run "
        f"{worst[top]:.0%}, margin {margin:.0%}), so the wall clock is tested"
    )


def regression_check(
    cand: RunStat, base: Sequence[RunStat], cfg: GateConfig, contended: Sequence[str]
) -> Check:
    """``step_time_regression``: the wall-clock step time of the candidate against the baseline.

    A contended candidate cannot fail on it, unless its baseline runs were as contended
    (:func:`comparable_contention`): then the test applies as on a quiet run.
    """
    samples = cand.step_time_ns if cand.step_time_ns_median is not None else []
    comparable = comparable_contention(cand, base, cfg) if contended else None
    c = timing_check(
        WALL,
        samples,
        [b.step_time_ns for b in base],
        cfg,
        [] if comparable else contended,
        noisy_runs(base, cfg),
    )
    if comparable is None:
        return c
    return dataclasses.replace(
        c,
        message=f"{c.message}; {comparable}",
        details={**c.details, "comparable_contention": comparable},  # COMPARABLE
    )


def hold_to_own_test(c: Check) -> Check:
    """With ``--inconclusive-ok``: an inconclusive check whose own test says slower fails."""
    if c.status != INCONCLUSIVE or not c.details.get(OWN_TEST_SLOWER):
        return c
    p = "" if c.p_value is None else f" (p={c.p_value:.2g}, effect {c.effect_ratio:+.1%})"
    return Check(
        c.name,
        c.rank,
        FAIL,
        c.value,
        c.limit,
        f"slower by its own test{p}; --inconclusive-ok accepts undecided checks, not a "
        f"measured slowdown: {c.message}",
        c.p_value,
        c.effect_ratio,
        c.samples,
        c.ci,
        c.mde_ratio,
        c.details,
    )
