"""Compares a Diagnosis with thresholds or a baseline Diagnosis → GateResult.

Pure: no I/O, no globals. The rules (docs/gate.md states them for users):

* **Absolute checks**, one per rank: ``idle_ratio`` ≤ ``max_idle_ratio`` (default: the
  analysis's ``idle_ratio_max``, so the gate and the idle finding agree, on GPU runs; a
  CPU-only run has no idle limit unless one is set), and, when
  configured, comm-wait share ≤ ``max_comm_wait_ratio`` and data-wait share ≤
  ``max_data_wait_ratio``. A rank without analysed steps makes its check *inconclusive*.
* **Stragglers**: every Finding of kind ``straggler`` (whoever produced it) is a failing
  check (``stragglers="fail"``), a warning (``"warn"``) or ignored (``"off"``). A
  candidate whose recorded run conditions are contended cannot fail on a straggler either
  (on a busy host which rank falls behind is chance): what would fail is *inconclusive*.
* **Regression against a baseline** of one or more runs. Each run is reduced to its
  steady median job step time (:func:`gpudiag.analysis.compare.baseline.step_time_stats`, which
  ``diff`` uses too): per step number the slowest rank's duration (a synchronous step
  ends when its slowest rank does), over the steady steps only
  (:mod:`gpudiag.analysis.rank.steady`; ``warmup_steps`` overrides the leading steps left out).
  A run with fewer than ``min_samples`` (8) steady
  steps makes the check *inconclusive*. Steps of one run share that run's host conditions,
  so they are not independent samples of the code's speed: the comparison is between
  *runs*. With baseline medians b_1..b_n (mean m, sample standard deviation s) and the
  candidate's median c:

  - effect e = c / m − 1;
  - n ≥ 2: noise floor (minimum detectable effect) MDE = t_{1−run_alpha, n−1} · s ·
    sqrt(1 + 1/n) / m, the half-width of the prediction interval of one new run; the
    interval [e − MDE, e + MDE] is reported as the effect's confidence interval, and the
    run-level p = P(T_{n−1} > (c − m) / (s · sqrt(1 + 1/n))). **Fail** when e > MDE
    (equivalently p < run_alpha) and e > ``min_effect_ratio``; **pass** when
    e ≤ ``min_effect_ratio``; otherwise **inconclusive**, saying how many runs would detect e.
  - n = 1: no between-run spread. **Fail** only when e > ``single_run_min_effect_ratio``
    (50%) and the within-run Mann-Whitney test (candidate steps slower than the baseline's,
    p < ``alpha``) agrees; **pass** when e ≤ ``min_effect_ratio``; otherwise inconclusive.
  - A candidate whose recorded run conditions are contended (:func:`contention`) cannot
    fail on timing: what would fail is *inconclusive*, with the reason.

  The per-step Mann-Whitney p (candidate steps against all baseline steps) is reported as
  a within-run detail.
* **Fingerprint**: world size, device names and mode (gpu/cpu) of subject and baseline must
  match; otherwise nothing is compared and the gate is inconclusive, whatever
  ``inconclusive_ok`` says (comparing across setups is a set-up mistake, not noise).

* **Run conditions**: when the candidate's are known, a ``run_conditions`` row says whether
  they were quiet (pass) or contended (warn; a warning never changes the verdict), and the
  share limits' messages carry them when contended.

Verdict: a fingerprint mismatch → inconclusive; else any failure → failed; else any
inconclusive check → inconclusive (passed when ``inconclusive_ok``); else passed (warnings
included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, field
from typing import Any

import numpy as np

from gpudiag._support.records import dataclass
from gpudiag.analysis.compare.baseline import (
    RunStat,
    describe_fingerprint_difference,
    fingerprint,
    run_stat,
)
from gpudiag.analysis.compare.stats import mann_whitney_u, t_ppf, t_sf
from gpudiag.analysis.model.diagnosis import Diagnosis, FindingKind, StrEnum
from gpudiag.analysis.model.words import duration
from gpudiag.config import GateConfig, Thresholds
from gpudiag.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from gpudiag.rundir.conditions import RunConditions, contention
from gpudiag.rundir.conditions import describe as describe_run_conditions


class CheckStatus(StrEnum):
    """The outcome of one check."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    INCONCLUSIVE = "inconclusive"


class GateStatus(StrEnum):
    """The gate's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 5 inconclusive (see DESIGN.md's table)."""
        return {GateStatus.PASSED: EXIT_OK, GateStatus.FAILED: EXIT_GATE_FAILED}.get(
            self, EXIT_INCONCLUSIVE
        )


PASS, FAIL, WARN, INCONCLUSIVE = (
    CheckStatus.PASS,
    CheckStatus.FAIL,
    CheckStatus.WARN,
    CheckStatus.INCONCLUSIVE,
)


@dataclass(frozen=True)
class Check:
    """One gate check: a metric (of one rank, or of the run when ``rank`` is None)."""

    name: str
    rank: int | None
    status: CheckStatus
    value: float | None
    limit: float | None
    message: str
    p_value: float | None = None
    effect_ratio: float | None = None
    samples: list[int] = field(default_factory=list)  # [candidate, baseline] sample counts
    ci: list[float] = field(default_factory=list)  # [low, high] of the effect, when known
    mde_ratio: float | None = None  # the smallest effect this baseline could detect
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GateResult:
    """The verdict and every check behind it."""

    status: GateStatus
    checks: list[Check]
    subject: str = ""
    baseline: str | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    baseline_fingerprint: dict[str, Any] | None = None
    inconclusive_ok: bool = False
    rules: dict[str, Any] = field(default_factory=dict)  # the GateConfig in force
    conditions: dict[str, Any] | None = None  # the subject's run conditions, when recorded

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 5 inconclusive (see DESIGN.md's table)."""
        return self.status.exit_code

    def counts(self) -> dict[str, int]:
        """How many checks have each status."""
        out = dict.fromkeys((PASS, WARN, FAIL, INCONCLUSIVE), 0)
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return {str(k): v for k, v in out.items()}

    def to_json(self) -> dict[str, Any]:
        """Plain dict (the ``exit_code`` included)."""
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


# ---- the gate ----


def _limit_checks(d: Diagnosis, cfg: GateConfig, th: Thresholds, note: str = "") -> list[Check]:
    out: list[Check] = []
    specs: list[tuple[str, str, float | None]] = [
        ("idle_ratio", "idle ratio", cfg.idle_limit(th, str(d.run.mode))),
        ("comm_wait_share", "comm-wait share", cfg.max_comm_wait_ratio),
        ("data_wait_share", "data-wait share", cfg.max_data_wait_ratio),
    ]
    for name, label, limit in specs:
        if limit is None:
            continue
        for rs in sorted(d.ranks, key=lambda r: r.rank):
            if name == "comm_wait_share" and not rs.shares.comm_measured:
                msg = f"rank {rs.rank}: {label} not measured (step telemetry only)"
                out.append(Check(name, rs.rank, INCONCLUSIVE, None, limit, msg))
                continue
            if rs.steps == 0:
                msg = f"rank {rs.rank}: no analysed steps, {label} unknown"
                out.append(Check(name, rs.rank, INCONCLUSIVE, None, limit, msg))
                continue
            value = {
                "idle_ratio": rs.idle_ratio,
                "comm_wait_share": rs.shares.comm_wait,
                "data_wait_share": rs.shares.data_wait,
            }[name]
            ok = value <= limit
            verb = "≤" if ok else ">"
            msg = f"rank {rs.rank}: {label} {value:.1%} {verb} {limit:.0%}{note}"
            out.append(Check(name, rs.rank, PASS if ok else FAIL, value, limit, msg))
    return out


def _straggler_checks(
    d: Diagnosis, cfg: GateConfig, base: Sequence[RunStat], contended: Sequence[str] = ()
) -> list[Check]:
    """One check per straggler finding's rank; a contended run's cannot fail (inconclusive)."""
    if cfg.stragglers == "off":
        return []
    found = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    if not found:
        return [Check("straggler", None, PASS, None, None, "no straggler findings")]
    before = {r for b in base for r in b.stragglers}
    out: list[Check] = []
    status = FAIL if cfg.stragglers == "fail" else WARN
    why = ""
    if contended and status == FAIL:
        # on a busy host the rank that falls behind is chance: as the timing check, no fail
        status = INCONCLUSIVE
        why = "inconclusive (contended run: see run_conditions): "
    for f in found:
        for rank in f.ranks or [None]:  # type: ignore[list-item]
            again = " (also in the baseline)" if base and rank in before else ""
            out.append(Check("straggler", rank, status, None, None, why + f.message + again))
    return out


def baseline_summary(runs: Sequence[RunStat], cfg: GateConfig, name: str = "") -> GateResult:
    """What ``gate --save-baseline FILE R1 R2 …`` says: each run labelled, nothing judged.

    A baseline is what later runs are compared with, not a subject: its runs are never
    held to the absolute limits (idle, shares, stragglers), and saving one passes. Each run
    gets a row (its name, steady steps, median step time); a run with fewer than
    ``min_samples`` steady steps is a warning (it will make comparisons inconclusive), and
    one row says how much the runs vary and the smallest slowdown they can detect.
    """
    checks = []
    for i, r in enumerate(runs):
        label = r.name or f"run {i + 1}"
        n, med = len(r.step_time_ns), r.step_time_ns_median
        few = n < cfg.min_samples
        text = (
            f"{label}: {n} steady steps, median step time {'n/a' if med is None else duration(med)}"
        )
        if few:
            text += f"; fewer than {cfg.min_samples}: comparisons with it will be inconclusive"
        checks.append(
            Check(
                "baseline_run",
                None,
                WARN if few else PASS,
                med,
                None,
                text,
                samples=[n],
                details={"run": label},
            )
        )
    meds = [float(r.step_time_ns_median) for r in runs if r.step_time_ns_median]
    if len(meds) >= 2:
        m = float(np.mean(meds))
        cv = float(np.std(meds, ddof=1)) / m if m > 0 else 0.0
        mde = t_ppf(1.0 - cfg.run_alpha, len(meds) - 1) * cv * math.sqrt(1 + 1 / len(meds))
        floor = max(mde, cfg.min_effect_ratio)
        checks.append(
            Check(
                "baseline_spread",
                None,
                PASS,
                cv,
                None,
                f"{len(meds)} runs vary by ±{cv:.1%}: a later run fails on timing "
                f"only when slower by more than {floor:.1%} (level "
                f"{cfg.run_alpha:g}, min effect {cfg.min_effect_ratio:.0%})",
                mde_ratio=mde,
            )
        )
    fp = runs[0].fingerprint if runs else {}
    return GateResult(
        GateStatus.PASSED, checks, name, None, fp, None, cfg.inconclusive_ok, asdict(cfg), None
    )


def runs_needed(cv: float, effect: float, cfg: GateConfig) -> int | None:
    """The fewest baseline runs whose noise floor is below ``effect``; None past the cap."""
    for n in range(2, cfg.max_runs_advice + 1):
        if t_ppf(1.0 - cfg.run_alpha, n - 1) * cv * math.sqrt(1.0 + 1.0 / n) < effect:
            return n
    return None


def regression_check(
    cand: RunStat, base: Sequence[RunStat], cfg: GateConfig, contended: list[str]
) -> Check:
    """The timing check of one candidate run against the baseline runs (the module's rule)."""
    name, limit = "step_time_regression", cfg.min_effect_ratio
    counts = [len(cand.step_time_ns), min(len(b.step_time_ns) for b in base)]
    if min(counts) < cfg.min_samples or cand.step_time_ns_median is None:
        few = (
            f"too few steady steps to compare: {counts[0]} (subject) and {counts[1]} "
            f"(smallest baseline run); need {cfg.min_samples} each"
        )
        return Check(name, None, INCONCLUSIVE, None, limit, few, samples=counts)
    medians = [float(b.step_time_ns_median or 0.0) for b in base]
    n, m, c = len(medians), float(np.mean(medians)), float(cand.step_time_ns_median)
    effect = c / m - 1.0 if m > 0 else 0.0
    pooled = [v for b in base for v in b.step_time_ns]
    _, p_mw = mann_whitney_u(cand.step_time_ns, pooled, alternative="greater")
    details: dict[str, Any] = {"baseline_runs": n, "baseline_medians_ns": medians}
    details.update(baseline_mean_ns=m, candidate_median_ns=c, within_run_mann_whitney_p=p_mw)
    head = f"median step time {duration(c, 'ms')} vs {duration(m, 'ms')} baseline ({effect:+.1%}"
    ci: list[float] = []
    if n == 1:
        floor, mde = cfg.single_run_min_effect_ratio, None
        p = p_mw
        signal = p_mw < cfg.alpha
        desc = (
            f"{head}; one baseline run: no between-run spread, so timing fails only above "
            f"+{floor:.0%}; within-run Mann-Whitney p={p_mw:.2g})"
        )
        advice = "give 3 or more baseline runs (--baseline B1 B2 B3) to measure the runner's noise"
    else:
        s = float(np.std(medians, ddof=1))
        cv = s / m if m > 0 else 0.0
        tq = t_ppf(1.0 - cfg.run_alpha, n - 1)
        mde = tq * cv * math.sqrt(1.0 + 1.0 / n)
        floor = mde
        scale = s * math.sqrt(1.0 + 1.0 / n)
        p = t_sf((c - m) / scale, n - 1) if scale > 0 else (0.0 if c > m else 1.0)
        signal = p < cfg.run_alpha
        ci = [effect - mde, effect + mde]
        details.update(baseline_cv=cv, t_quantile=tq, run_level_p=p)
        conf = 1.0 - 2.0 * cfg.run_alpha
        desc = (
            f"{head}, {conf:.0%} CI {ci[0]:+.1%} to {ci[1]:+.1%}); {n} baseline runs vary "
            f"by ±{cv:.1%}, smallest detectable effect {mde:.1%}; run-level p={p:.2g}, "
            f"within-run Mann-Whitney p={p_mw:.2g}"
        )
        need = runs_needed(cv, max(effect, limit), cfg)
        target = f"{max(effect, limit):.0%}"
        advice = (
            f"the baseline runs vary by ±{cv:.1%}; need ≥ {need} runs or a quieter runner "
            f"to detect {target}"
            if need is not None
            else f"the baseline runs vary by ±{cv:.1%}; more runs will not detect {target}: "
            "use a quieter runner"
        )
    details["min_effect_ratio"] = limit
    noisy = [b.name or f"run {i + 1}" for i, b in enumerate(base) if contention(_recorded(b), cfg)]
    if noisy:
        # A contended baseline run widens the spread (a larger noise floor), never hides one.
        desc += f"; contended baseline runs: {', '.join(noisy)}"
        details["contended_baseline_runs"] = noisy
    kw: dict[str, Any] = {"p_value": p, "effect_ratio": effect, "samples": counts, "ci": ci}
    kw.update(mde_ratio=mde, details=details)
    if effect <= limit:
        verdict = "not slower" if effect <= 0 else f"within min effect +{limit:.0%}"
        return Check(name, None, PASS, effect, limit, f"{verdict}: {desc}", **kw)
    if signal and effect > floor:
        if contended:
            why = (
                f"inconclusive: slower, but the run was contended "
                f"({'; '.join(contended)}), so timing cannot fail: {desc}"
            )
            return Check(name, None, INCONCLUSIVE, effect, limit, why, **kw)
        return Check(name, None, FAIL, effect, limit, f"slower: {desc}", **kw)
    return Check(name, None, INCONCLUSIVE, effect, limit, f"inconclusive: {advice}: {desc}", **kw)


def _recorded(b: RunStat) -> RunConditions | None:
    """A baseline run's recorded run conditions (kept as JSON in the baseline file)."""
    return RunConditions(b.conditions) if b.conditions is not None else None


def _as_runs(
    baseline: Diagnosis | RunStat | Sequence[Diagnosis | RunStat] | None,
    cfg: GateConfig,
    th: Thresholds,
) -> list[RunStat]:
    if baseline is None:
        return []
    items = [baseline] if isinstance(baseline, (Diagnosis, RunStat)) else list(baseline)
    return [
        b if isinstance(b, RunStat) else run_stat(b, "", None, cfg.warmup_steps, th) for b in items
    ]


def evaluate(
    d: Diagnosis,
    cfg: GateConfig,
    baseline: Diagnosis | RunStat | Sequence[Diagnosis | RunStat] | None = None,
    subject: str = "",
    baseline_name: str | None = None,
    th: Thresholds | None = None,
    conditions: RunConditions | None = None,
) -> GateResult:
    """Run every configured check on ``d`` (and against the baseline runs) and decide.

    ``th``: the analysis thresholds in force (the idle limit and the steady-step rule);
    ``conditions``: the subject's recorded run conditions (:func:`gpudiag.rundir.conditions.merge`).
    """
    th = th or Thresholds()
    base = _as_runs(baseline, cfg, th)
    fp = fingerprint(d)
    base_fp = base[0].fingerprint if base else None
    contended = contention(conditions, cfg)
    recorded = conditions.to_json() if conditions is not None else None
    note = f" (run contended: {describe_run_conditions(conditions)})" if contended else ""
    checks = _limit_checks(d, cfg, th, note) + _straggler_checks(d, cfg, base, contended)
    if recorded:
        checks.append(
            Check(
                "run_conditions",
                None,
                WARN if contended else PASS,
                None,
                None,
                ("contended: " + "; ".join(contended))
                if contended
                else f"quiet: {describe_run_conditions(conditions)}",
                details=recorded,
            )
        )
    mismatch = False
    if base:
        odd = next((b for b in base if b.fingerprint != fp), None)
        if odd is not None:
            mismatch = True
            diffs = describe_fingerprint_difference(fp, odd.fingerprint)
            checks.insert(
                0,
                Check(
                    "fingerprint",
                    None,
                    INCONCLUSIVE,
                    None,
                    None,
                    f"baseline {odd.name or 'run'} is from a different setup "
                    f"({diffs}): not compared",
                ),
            )
        else:
            cand = run_stat(d, subject, conditions, cfg.warmup_steps, th)
            checks.append(regression_check(cand, base, cfg, contended))
    statuses = {c.status for c in checks}
    if mismatch:
        status = GateStatus.INCONCLUSIVE
    elif FAIL in statuses:
        status = GateStatus.FAILED
    elif INCONCLUSIVE in statuses and not cfg.inconclusive_ok:
        status = GateStatus.INCONCLUSIVE
    else:
        status = GateStatus.PASSED
    return GateResult(
        status,
        checks,
        subject,
        baseline_name,
        fp,
        base_fp,
        cfg.inconclusive_ok,
        asdict(cfg),
        recorded,
    )
