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
  (:mod:`gpudiag.analysis.reading.steady`; ``warmup_steps`` overrides the leading steps left out).
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
    fail on the wall clock: what would fail is *inconclusive*, with the reason; unless its
    baseline runs were as contended (``comparable_contention_margin``), when the test
    applies as on a quiet host. The job's own work (``cpu_time_regression``) can fail it.

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

import numpy as np

from gpudiag._support.records import asdict
from gpudiag.analysis.compare.baseline import (
    RunStat,
    describe_fingerprint_difference,
    fingerprint,
    run_outcome,
    run_stat,
)
from gpudiag.analysis.compare.checks import (
    FAIL,
    INCONCLUSIVE,
    OFF,
    PASS,
    WARN,
    Check,
    CheckStatus,
    Fingerprint,
    GateResult,
    GateStatus,
)
from gpudiag.analysis.compare.paired import paired_checks
from gpudiag.analysis.compare.stats import t_ppf
from gpudiag.analysis.compare.timing import (
    CPU,
    WALL,
    cpu_check,
    hold_to_own_test,
    regression_check,
    runs_needed,
)
from gpudiag.analysis.model.diagnosis import Diagnosis, FindingKind
from gpudiag.analysis.model.words import duration
from gpudiag.config import GateConfig, Thresholds
from gpudiag.rundir.conditions import RunConditions, contention
from gpudiag.rundir.conditions import describe as describe_run_conditions

__all__ = [
    "Check",
    "CheckStatus",
    "GateResult",
    "GateStatus",
    "baseline_summary",
    "evaluate",
    "regression_check",
    "runs_needed",
]


# ---- the gate ----


def _limit_checks(d: Diagnosis, cfg: GateConfig, th: Thresholds, note: str = "") -> list[Check]:
    out: list[Check] = []
    specs: list[tuple[str, str, float | None, str]] = [
        (
            "idle_ratio",
            "idle ratio",
            cfg.idle_limit(th, str(d.run.mode)),
            "on a CPU-only run (set --max-idle-ratio)",
        ),
        ("comm_wait_share", "comm-wait share", cfg.max_comm_wait_ratio, "(set --max-comm-wait)"),
        ("data_wait_share", "data-wait share", cfg.max_data_wait_ratio, "(set --max-data-wait)"),
    ]
    for name, label, limit, how in specs:
        if limit is None:
            out.append(Check(name, None, OFF, None, None, f"not applied {how}"))
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
        return [
            Check(
                "straggler",
                None,
                OFF,
                None,
                None,
                "not applied (--stragglers off; set fail or warn)",
            )
        ]
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
    paired: Sequence[RunStat] | None = None,
) -> GateResult:
    """Run every configured check on ``d`` (and against the baseline runs) and decide.

    ``th``: the analysis thresholds in force (the idle limit and the steady-step rule);
    ``conditions``: the subject's recorded run conditions (:func:`gpudiag.rundir.conditions.merge`);
    ``paired``: the candidate's further runs when the runs were alternated (``--paired``):
    ``d`` and each of them is paired with the baseline run of its position, the timing
    checks are :mod:`gpudiag.analysis.compare.paired`'s, and a further run that did not
    end well fails the gate as ``d`` would.
    """
    th = th or Thresholds()
    base = _as_runs(baseline, cfg, th)
    fp = fingerprint(d)
    contended = contention(conditions, cfg)
    recorded = conditions.to_json() if conditions is not None else None
    note = f" (run contended: {describe_run_conditions(conditions)})" if contended else ""
    ended = run_outcome(d) or next(
        (f"{r.name or 'a candidate run'}: {r.outcome}" for r in paired or [] if r.outcome), None
    )
    checks = [
        Check("run_outcome", None, FAIL, None, None, f"the run did not end well: {ended}")
        if ended
        else Check("run_outcome", None, PASS, None, None, "no failure, crash, interruption or hang")
    ]
    checks += _limit_checks(d, cfg, th, note) + _straggler_checks(d, cfg, base, contended)
    checks.append(_conditions_check(conditions, contended))
    checks += _baseline_checks(d, base, fp, cfg, th, subject, conditions, contended, paired)
    if cfg.inconclusive_ok:
        checks = [hold_to_own_test(c) for c in checks]
    statuses = {c.status for c in checks}
    mismatch = any(c.name == "fingerprint" and c.status == INCONCLUSIVE for c in checks)
    if ended:
        status = GateStatus.FAILED  # a failed run fails whatever else its checks say
    elif mismatch:
        status = GateStatus.INCONCLUSIVE
    elif FAIL in statuses:
        status = GateStatus.FAILED
    elif INCONCLUSIVE in statuses and not cfg.inconclusive_ok:
        status = GateStatus.INCONCLUSIVE
    else:
        status = GateStatus.PASSED
    base_fp = base[0].fingerprint if base else None
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


def _conditions_check(conditions: RunConditions | None, contended: list[str]) -> Check:
    """``run_conditions``: quiet (pass), contended (warn), or not recorded (off)."""
    if conditions is None or not conditions.to_json():
        return Check(
            "run_conditions",
            None,
            OFF,
            None,
            None,
            "not applied: no run conditions "
            "recorded (traces or a saved diagnosis; `gpudiag run` records them)",
        )
    return Check(
        "run_conditions",
        None,
        WARN if contended else PASS,
        None,
        None,
        ("contended: " + "; ".join(contended))
        if contended
        else f"quiet: {describe_run_conditions(conditions)}",
        details=conditions.to_json(),
    )


def _baseline_checks(
    d: Diagnosis,
    base: list[RunStat],
    fp: Fingerprint,
    cfg: GateConfig,
    th: Thresholds,
    subject: str,
    conditions: RunConditions | None,
    contended: list[str],
    paired: Sequence[RunStat] | None = None,
) -> list[Check]:
    """The fingerprint and the two timing checks, or why they are not applied.

    ``paired``: the candidate's further runs (``--paired``); a pair whose baseline run did
    not end well leaves with that run.
    """
    if not base:
        why = "not applied: no baseline (give --baseline B1 B2 B3)"
        return [Check(n, None, OFF, None, None, why) for n in ("fingerprint", WALL, CPU)]
    out: list[Check] = []
    cand = run_stat(d, subject, conditions, cfg.warmup_steps, th)
    cands = None if paired is None else [cand, *paired]
    bad = [b for b in base if b.outcome]
    if bad:
        names = ", ".join(f"{b.name or 'a run'} ({b.outcome})" for b in bad)
        out.append(
            Check(
                "baseline_outcome",
                None,
                INCONCLUSIVE,
                None,
                None,
                f"baseline runs that did not end well are left out: {names}",
            )
        )
        if cands is not None and len(cands) == len(base):
            cands = [c for c, b in zip(cands, base, strict=True) if not b.outcome]
        base = [b for b in base if not b.outcome]
        if not base:
            return out
    odd = next((b for b in [*base, *(cands or [])] if b.fingerprint != fp), None)
    if odd is not None:
        diffs = describe_fingerprint_difference(fp, odd.fingerprint)
        who = "baseline" if any(odd is b for b in base) else "candidate"
        return [
            *out,
            Check(
                "fingerprint",
                None,
                INCONCLUSIVE,
                None,
                None,
                f"{who} {odd.name or 'run'} is from a different setup ({diffs}): not compared",
            ),
        ]
    out.append(Check("fingerprint", None, PASS, None, None, "same setup as the baseline"))
    gpu = bool(fp.get("devices"))
    if cands is not None:
        return out + paired_checks(cands, base, cfg, str(d.run.mode), gpu)
    out.append(regression_check(cand, base, cfg, contended))
    out.append(cpu_check(cand, base, cfg, str(d.run.mode), gpu))
    return out
