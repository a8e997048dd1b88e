"""Compares a Diagnosis with thresholds or a baseline Diagnosis → GateResult.

Pure: no I/O, no globals. The rules (docs/gate.md states them for users):

* **Absolute checks**, one per rank: ``idle_ratio`` ≤ ``max_idle_ratio`` (default: the
  analysis's ``idle_ratio_max``, so the gate and the idle finding agree), and, when
  configured, comm-wait share ≤ ``max_comm_wait_ratio`` and data-wait share ≤
  ``max_data_wait_ratio``. A rank without analysed steps makes its check *inconclusive*.
* **Stragglers**: every Finding of kind ``straggler`` (whoever produced it) is a failing
  check (``stragglers="fail"``), a warning (``"warn"``) or ignored (``"off"``).
* **Regression against a baseline** of one or more runs. Each run is reduced to its
  steady median job step time (:func:`step_time_stats`, the function ``diff`` uses too):
  per step number the slowest rank's duration (a synchronous step ends when its slowest
  rank does), over the steady steps only (:mod:`gpudiag.analysis.steady`; ``warmup_steps``
  overrides the leading steps left out). A run with fewer than ``min_samples`` (8) steady
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
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gpudiag.analysis.model import Diagnosis, FindingKind, RunStep, StrEnum
from gpudiag.analysis.steady import steady_steps
from gpudiag.config import GateConfig, Thresholds
from gpudiag.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from gpudiag.runconditions import RunConditions, contention
from gpudiag.runconditions import describe as describe_run_conditions


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


PASS, FAIL, WARN, INCONCLUSIVE = (CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WARN,
                                  CheckStatus.INCONCLUSIVE)  # fmt: skip


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


# ---- Mann-Whitney U ----


def _exact_sf(u: float, n1: int, n2: int) -> float:
    """P(U ≥ u) under H0 for untied samples, from the exact distribution of U."""
    # f[j] over (i, j): counts of arrangements of i x's and j y's with U = index;
    # recurrence f(i, j, u) = f(i-1, j, u-j) + f(i, j-1, u).
    size = n1 * n2 + 1
    prev = [np.zeros(size) for _ in range(n2 + 1)]
    for j in range(n2 + 1):
        prev[j][0] = 1.0  # i = 0: only U = 0
    for _ in range(n1):
        cur = [np.zeros(size) for _ in range(n2 + 1)]
        cur[0][0] = 1.0
        for j in range(1, n2 + 1):
            shifted = np.zeros(size)
            shifted[j:] = prev[j][: size - j]
            cur[j] = shifted + cur[j - 1]
        prev = cur
    counts = prev[n2]
    k = math.ceil(u - 1e-9)
    return float(counts[k:].sum() / counts.sum())


CONTINUITY = 0.5  # the normal approximation's continuity correction of U


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_u(
    x: Sequence[float], y: Sequence[float], alternative: str = "greater", method: str = "auto"
) -> tuple[float, float]:
    """Mann-Whitney U of ``x`` against ``y``: (U of x, p-value).

    ``alternative="greater"`` tests whether x tends to be larger than y (a slowdown when x
    are the candidate's step times). ``method``: ``"exact"`` (no ties only), ``"asymptotic"``
    (normal approximation with tie and continuity correction) or ``"auto"`` (exact when
    both samples have at most 50 values and there are no ties). Same conventions as
    ``scipy.stats.mannwhitneyu``.
    """
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    n1, n2 = a.size, b.size
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples need at least one value")
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative={alternative!r}")
    both = np.concatenate([a, b])
    order = np.argsort(both, kind="mergesort")
    sorted_v = both[order]
    ranks = np.empty(both.size)
    # Average ranks of ties.
    _, first, counts = np.unique(sorted_v, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)
    u2 = n1 * n2 - u1
    ties = bool((counts > 1).any())
    if method == "auto":
        method = "exact" if max(n1, n2) <= 50 and not ties else "asymptotic"
    if method == "exact":
        if alternative == "greater":
            p = _exact_sf(u1, n1, n2)
        elif alternative == "less":
            p = _exact_sf(u2, n1, n2)
        else:
            p = min(1.0, 2.0 * _exact_sf(max(u1, u2), n1, n2))
        return u1, p
    n = n1 + n2
    tie_term = float((counts.astype(np.float64) ** 3 - counts).sum()) / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    mu = n1 * n2 / 2.0
    if sigma == 0:
        return u1, 1.0
    if alternative == "greater":
        p = _norm_sf((u1 - mu - CONTINUITY) / sigma)
    elif alternative == "less":
        p = _norm_sf((u2 - mu - CONTINUITY) / sigma)
    else:
        p = min(1.0, 2.0 * _norm_sf((max(u1, u2) - mu - CONTINUITY) / sigma))
    return u1, p


# ---- Student's t (run-level test) ----


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(ln + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_ppf(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with ``df`` degrees of freedom."""
    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 1.0 - t_sf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


# ---- samples and fingerprints ----


def step_samples(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> list[int]:
    """Per-step job step times (ns): per steady step number, the slowest rank.

    Uses the run directory's telemetry (every step) when the Diagnosis has it and it holds
    more steady steps than the profiled window, else the profiled steps; either way only
    the steady steps (:func:`gpudiag.analysis.steady.steady_steps`) count.
    """
    th = th or Thresholds()
    window = [RunStep(s.rank, s.step, s.start_ns, s.duration_ns, None, None, None, False)
              for s in d.steps]  # fmt: skip
    tele = list(d.whole_run.steps) if d.whole_run else []
    # The window's first step is not the job's: only --warmup-steps drops it there.
    keep = steady_steps(window, th.steady, warmup_steps or 0)
    rows = window
    if tele:
        keep_t = steady_steps(tele, th.steady, warmup_steps)
        if len({st for _, st in keep_t}) > len({st for _, st in keep}):
            rows, keep = tele, keep_t
    per_step: dict[int, int] = {}
    for s in rows:
        if (s.rank, s.step) in keep and s.duration_ns > 0:
            per_step[s.step] = max(per_step.get(s.step, 0), s.duration_ns)
    return [per_step[k] for k in sorted(per_step)]


def step_time_stats(
    d: Diagnosis, warmup_steps: int | None = None, th: Thresholds | None = None
) -> tuple[float | None, float | None, int]:
    """(median, p90, count) of :func:`step_samples`, in ns; ``gate`` and ``diff`` share it."""
    samples = step_samples(d, warmup_steps, th)
    if not samples:
        return None, None, 0
    return float(np.median(samples)), float(np.percentile(samples, 90)), len(samples)


@dataclass(frozen=True)
class RunStat:
    """One run reduced to what the run-level comparison needs (a baseline file's entry)."""

    name: str
    step_time_ns_median: float | None
    step_time_ns: list[int]  # the steady per-step job step times
    shares: dict[str, float]
    idle_ratio: float
    fingerprint: dict[str, Any]
    stragglers: list[int] = field(default_factory=list)
    conditions: dict[str, Any] | None = None


def run_stat(
    d: Diagnosis,
    name: str = "",
    conditions: RunConditions | None = None,
    warmup_steps: int | None = None,
    th: Thresholds | None = None,
) -> RunStat:
    """Reduce a Diagnosis (and its recorded run conditions) to a :class:`RunStat`."""
    samples = step_samples(d, warmup_steps, th)
    median = step_time_stats(d, warmup_steps, th)[0]
    stragglers = sorted({r for f in d.findings if f.kind == FindingKind.STRAGGLER
                         for r in f.ranks})  # fmt: skip
    return RunStat(name, median, samples, d.run.shares.as_dict(), d.run.idle_ratio,
                   fingerprint(d), stragglers,
                   conditions.to_json() if conditions is not None else None)  # fmt: skip


BASELINE_FORMAT = "gpudiag.baseline"
BASELINE_VERSION = 1


def baseline_to_json(runs: Sequence[RunStat], cfg: GateConfig, version: str = "") -> dict[str, Any]:
    """The document ``gate --save-baseline FILE RUN…`` writes: one entry per run."""
    return {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "gpudiag_version": version,
        "warmup_steps": cfg.warmup_steps,
        "runs": [asdict(r) for r in runs],
    }


def is_baseline_json(doc: Any) -> bool:
    """True for a document written by :func:`baseline_to_json`."""
    return isinstance(doc, dict) and doc.get("format") == BASELINE_FORMAT


def baseline_from_json(doc: dict[str, Any]) -> list[RunStat]:
    """The runs of a baseline file; ValueError on a newer or malformed one."""
    if int(doc.get("version", 0)) > BASELINE_VERSION:
        raise ValueError(f"baseline file version {doc.get('version')} is newer than this "
                         f"gpudiag understands ({BASELINE_VERSION})")  # fmt: skip
    try:
        return [RunStat(**r) for r in doc["runs"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"malformed baseline file ({e})") from e


def fingerprint(d: Diagnosis) -> dict[str, Any]:
    """What must match for two runs to be comparable: world size, device names, mode."""
    devices = sorted({dev for r in d.ranks for dev in r.devices})
    return {
        "world_size": d.run.world_size or d.run.ranks,
        "devices": devices,
        "mode": str(d.run.mode),
    }


_FP_LABELS = {"world_size": "world size", "devices": "GPUs", "mode": "mode"}


def _fp_value(key: str, v: Any) -> str:
    if key == "devices":
        return ", ".join(v) if v else "no GPUs"
    return str(v)


def describe_fingerprint_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``world size 8 vs 4, GPUs H100 vs A100``: the keys that differ, in the user's words."""
    return ", ".join(
        f"{_FP_LABELS.get(k, k)} {_fp_value(k, a.get(k))} vs {_fp_value(k, b.get(k))}"
        for k in a
        if a.get(k) != b.get(k)
    )


# ---- the gate ----


def _limit_checks(d: Diagnosis, cfg: GateConfig, th: Thresholds, note: str = "") -> list[Check]:
    out: list[Check] = []
    specs: list[tuple[str, str, float | None]] = [
        ("idle_ratio", "idle ratio", cfg.idle_limit(th)),
        ("comm_wait_share", "comm-wait share", cfg.max_comm_wait_ratio),
        ("data_wait_share", "data-wait share", cfg.max_data_wait_ratio),
    ]
    for name, label, limit in specs:
        if limit is None:
            continue
        for rs in sorted(d.ranks, key=lambda r: r.rank):
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


def _straggler_checks(d: Diagnosis, cfg: GateConfig, base: Sequence[RunStat]) -> list[Check]:
    if cfg.stragglers == "off":
        return []
    found = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    if not found:
        return [Check("straggler", None, PASS, None, None, "no straggler findings")]
    before = {r for b in base for r in b.stragglers}
    out: list[Check] = []
    status = FAIL if cfg.stragglers == "fail" else WARN
    for f in found:
        for rank in f.ranks or [None]:  # type: ignore[list-item]
            again = " (also in the baseline)" if base and rank in before else ""
            out.append(Check("straggler", rank, status, None, None, f.message + again))
    return out


def runs_needed(cv: float, effect: float, cfg: GateConfig) -> int | None:
    """The fewest baseline runs whose noise floor is below ``effect``; None past the cap."""
    for n in range(2, cfg.max_runs_advice + 1):
        if t_ppf(1.0 - cfg.run_alpha, n - 1) * cv * math.sqrt(1.0 + 1.0 / n) < effect:
            return n
    return None


def _regression_check(cand: RunStat, base: Sequence[RunStat], cfg: GateConfig,
                      contended: list[str]) -> Check:  # fmt: skip
    name, limit = "step_time_regression", cfg.min_effect_ratio
    counts = [len(cand.step_time_ns), min(len(b.step_time_ns) for b in base)]
    if min(counts) < cfg.min_samples or cand.step_time_ns_median is None:
        return Check(name, None, INCONCLUSIVE, None, limit,
                     f"too few steady steps to compare: {counts[0]} (subject) and {counts[1]} "
                     f"(smallest baseline run); need {cfg.min_samples} each",
                     samples=counts)  # fmt: skip
    medians = [float(b.step_time_ns_median or 0.0) for b in base]
    n, m, c = len(medians), float(np.mean(medians)), float(cand.step_time_ns_median)
    effect = c / m - 1.0 if m > 0 else 0.0
    pooled = [v for b in base for v in b.step_time_ns]
    _, p_mw = mann_whitney_u(cand.step_time_ns, pooled, alternative="greater")
    details: dict[str, Any] = {"baseline_runs": n, "baseline_medians_ns": medians,
                               "baseline_mean_ns": m, "candidate_median_ns": c,
                               "within_run_mann_whitney_p": p_mw}  # fmt: skip
    head = f"median step time {c / 1e6:.1f} ms vs {m / 1e6:.1f} ms baseline ({effect:+.1%}"
    ci: list[float] = []
    if n == 1:
        floor, mde = cfg.single_run_min_effect_ratio, None
        p = p_mw
        signal = p_mw < cfg.alpha
        desc = (f"{head}; one baseline run: no between-run spread, so timing fails only above "
                f"+{floor:.0%}; within-run Mann-Whitney p={p_mw:.2g})")  # fmt: skip
        advice = ("give 3 or more baseline runs (--baseline B1 B2 B3) to measure the "
                  "runner's noise")  # fmt: skip
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
        desc = (f"{head}, {conf:.0%} CI {ci[0]:+.1%} to {ci[1]:+.1%}); {n} baseline runs vary "
                f"by ±{cv:.1%}, smallest detectable effect {mde:.1%}; run-level p={p:.2g}, "
                f"within-run Mann-Whitney p={p_mw:.2g}")  # fmt: skip
        need = runs_needed(cv, max(effect, limit), cfg)
        target = f"{max(effect, limit):.0%}"
        advice = (f"the baseline runs vary by ±{cv:.1%}; need ≥ {need} runs or a quieter runner "
                  f"to detect {target}" if need is not None else
                  f"the baseline runs vary by ±{cv:.1%}; more runs will not detect {target}: "
                  "use a quieter runner")  # fmt: skip
    details["min_effect_ratio"] = limit
    noisy = [b.name or f"run {i + 1}" for i, b in enumerate(base) if contention(_recorded(b), cfg)]
    if noisy:
        # A contended baseline run widens the spread (a larger noise floor), never hides one.
        desc += f"; contended baseline runs: {', '.join(noisy)}"
        details["contended_baseline_runs"] = noisy
    kw: dict[str, Any] = {"p_value": p, "effect_ratio": effect, "samples": counts, "ci": ci,
                          "mde_ratio": mde, "details": details}  # fmt: skip
    if effect <= limit:
        verdict = "not slower" if effect <= 0 else f"within min effect +{limit:.0%}"
        return Check(name, None, PASS, effect, limit, f"{verdict}: {desc}", **kw)
    if signal and effect > floor:
        if contended:
            return Check(name, None, INCONCLUSIVE, effect, limit,
                         f"inconclusive: slower, but the run was contended "
                         f"({'; '.join(contended)}), so timing cannot fail: {desc}",
                         **kw)  # fmt: skip
        return Check(name, None, FAIL, effect, limit, f"slower: {desc}", **kw)
    return Check(name, None, INCONCLUSIVE, effect, limit, f"inconclusive: {advice}: {desc}",
                 **kw)  # fmt: skip


def _recorded(b: RunStat) -> RunConditions | None:
    """A baseline run's recorded run conditions (kept as JSON in the baseline file)."""
    return RunConditions(b.conditions) if b.conditions is not None else None


def _as_runs(baseline: Diagnosis | RunStat | Sequence[Diagnosis | RunStat] | None,
             cfg: GateConfig, th: Thresholds) -> list[RunStat]:  # fmt: skip
    if baseline is None:
        return []
    items = [baseline] if isinstance(baseline, (Diagnosis, RunStat)) else list(baseline)
    return [b if isinstance(b, RunStat) else run_stat(b, "", None, cfg.warmup_steps, th)
            for b in items]  # fmt: skip


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
    ``conditions``: the subject's recorded run conditions (:func:`gpudiag.runconditions.merge`).
    """
    th = th or Thresholds()
    base = _as_runs(baseline, cfg, th)
    fp = fingerprint(d)
    base_fp = base[0].fingerprint if base else None
    contended = contention(conditions, cfg)
    recorded = conditions.to_json() if conditions is not None else None
    note = f" (run contended: {describe_run_conditions(conditions)})" if contended else ""
    checks = _limit_checks(d, cfg, th, note) + _straggler_checks(d, cfg, base)
    if recorded:
        checks.append(Check("run_conditions", None, WARN if contended else PASS, None, None,
                            ("contended: " + "; ".join(contended)) if contended else
                            f"quiet: {describe_run_conditions(conditions)}",
                            details=recorded))  # fmt: skip
    mismatch = False
    if base:
        odd = next((b for b in base if b.fingerprint != fp), None)
        if odd is not None:
            mismatch = True
            diffs = describe_fingerprint_difference(fp, odd.fingerprint)
            checks.insert(0, Check("fingerprint", None, INCONCLUSIVE, None, None,
                                   f"baseline {odd.name or 'run'} is from a different setup "
                                   f"({diffs}): not compared"))  # fmt: skip
        else:
            cand = run_stat(d, subject, conditions, cfg.warmup_steps, th)
            checks.append(_regression_check(cand, base, cfg, contended))
    statuses = {c.status for c in checks}
    if mismatch:
        status = GateStatus.INCONCLUSIVE
    elif FAIL in statuses:
        status = GateStatus.FAILED
    elif INCONCLUSIVE in statuses and not cfg.inconclusive_ok:
        status = GateStatus.INCONCLUSIVE
    else:
        status = GateStatus.PASSED
    return GateResult(status, checks, subject, baseline_name, fp, base_fp, cfg.inconclusive_ok,
                      asdict(cfg), recorded)  # fmt: skip
