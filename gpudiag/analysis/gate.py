"""Compares a Diagnosis with thresholds or a baseline Diagnosis → GateResult.

Pure: no I/O, no globals. The rules (docs/gate.md states them for users):

* **Absolute checks**, one per rank: ``idle_ratio`` ≤ ``max_idle_ratio`` (default: the
  analysis's ``idle_ratio_max``, so the gate and the idle finding agree), and, when
  configured, comm-wait share ≤ ``max_comm_wait_ratio`` and data-wait share ≤
  ``max_data_wait_ratio``. A rank without analysed steps makes its check *inconclusive*.
* **Stragglers**: every Finding of kind ``straggler`` (whoever produced it) is a failing
  check (``stragglers="fail"``), a warning (``"warn"``) or ignored (``"off"``).
* **Regression against a baseline**: the samples are per-step job step times — for each step
  number the slowest rank's duration (a synchronous data-parallel step ends when its slowest
  rank does, and the ranks' durations of one step are not independent samples), over the
  steady steps only (:mod:`gpudiag.analysis.steady`; ``warmup_steps`` overrides the number of
  leading steps left out). With fewer than ``min_samples`` (default 8) samples on either
  side the check is *inconclusive*.
  Otherwise it **fails** when both

  - the candidate is statistically slower: one-sided Mann-Whitney U test,
    p < ``alpha`` (default 0.01), and
  - the effect is practically relevant: median(candidate) / median(baseline) − 1 >
    ``max_regression_ratio`` (default 0.10).

  A large but not significant slowdown is a *warning*; anything else passes. Requiring both
  (as asv does) keeps a noisy but unchanged run green and a real slowdown red.
* **Fingerprint**: world size, device names and mode (gpu/cpu) of subject and baseline must
  match; otherwise nothing is compared and the gate is inconclusive, whatever
  ``inconclusive_ok`` says (comparing across setups is a set-up mistake, not noise).

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


def _limit_checks(d: Diagnosis, cfg: GateConfig, th: Thresholds) -> list[Check]:
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
            msg = f"rank {rs.rank}: {label} {value:.1%} {verb} {limit:.0%}"
            out.append(Check(name, rs.rank, PASS if ok else FAIL, value, limit, msg))
    return out


def _straggler_checks(d: Diagnosis, cfg: GateConfig, base: Diagnosis | None) -> list[Check]:
    if cfg.stragglers == "off":
        return []
    found = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    if not found:
        return [Check("straggler", None, PASS, None, None, "no straggler findings")]
    before = {r for f in (base.findings if base else [])
              if f.kind == FindingKind.STRAGGLER for r in f.ranks}  # fmt: skip
    out: list[Check] = []
    status = FAIL if cfg.stragglers == "fail" else WARN
    for f in found:
        for rank in f.ranks or [None]:  # type: ignore[list-item]
            again = " (also in the baseline)" if base is not None and rank in before else ""
            out.append(Check("straggler", rank, status, None, None, f.message + again))
    return out


def _regression_check(d: Diagnosis, base: Diagnosis, cfg: GateConfig, th: Thresholds) -> Check:
    cand = step_samples(d, cfg.warmup_steps, th)
    ref = step_samples(base, cfg.warmup_steps, th)
    limit = cfg.max_regression_ratio
    counts = [len(cand), len(ref)]
    if min(counts) < cfg.min_samples:
        return Check("step_time_regression", None, INCONCLUSIVE, None, limit,
                     f"too few steady steps to compare: {len(cand)} (subject) and {len(ref)} "
                     f"(baseline); need {cfg.min_samples} each", samples=counts)  # fmt: skip
    m_c, m_r = float(np.median(cand)), float(np.median(ref))
    effect = m_c / m_r - 1.0 if m_r > 0 else 0.0
    _, p = mann_whitney_u(cand, ref, alternative="greater")
    significant = p < cfg.alpha
    big = effect > limit
    desc = (
        f"median step time {m_c / 1e6:.1f} ms vs {m_r / 1e6:.1f} ms baseline "
        f"({effect:+.1%}; limit +{limit:.0%}), Mann-Whitney p={p:.2g} (alpha {cfg.alpha:g})"
    )
    if significant and big:
        status, verdict = FAIL, "slower"
    elif big:
        status, verdict = WARN, "slower but not significant"
    else:
        status, verdict = PASS, "not slower" if effect <= 0 else "within limit"
    return Check("step_time_regression", None, status, effect, limit, f"{verdict}: {desc}",
                 p_value=p, effect_ratio=effect, samples=counts)  # fmt: skip


def evaluate(
    d: Diagnosis,
    cfg: GateConfig,
    baseline: Diagnosis | None = None,
    subject: str = "",
    baseline_name: str | None = None,
    th: Thresholds | None = None,
) -> GateResult:
    """Run every configured check on ``d`` (and against ``baseline``) and decide.

    ``th``: the analysis thresholds in force (the idle limit and the steady-step rule).
    """
    th = th or Thresholds()
    fp = fingerprint(d)
    base_fp = fingerprint(baseline) if baseline is not None else None
    checks = _limit_checks(d, cfg, th) + _straggler_checks(d, cfg, baseline)
    mismatch = False
    if baseline is not None:
        if fp != base_fp:
            mismatch = True
            diffs = describe_fingerprint_difference(fp, base_fp or {})
            checks.insert(0, Check("fingerprint", None, INCONCLUSIVE, None, None,
                                   f"baseline is from a different setup ({diffs}): "
                                   "not compared"))  # fmt: skip
        else:
            checks.append(_regression_check(d, baseline, cfg, th))
    statuses = {c.status for c in checks}
    if mismatch:
        status = GateStatus.INCONCLUSIVE
    elif FAIL in statuses:
        status = GateStatus.FAILED
    elif INCONCLUSIVE in statuses and not cfg.inconclusive_ok:
        status = GateStatus.INCONCLUSIVE
    else:
        status = GateStatus.PASSED
    return GateResult(status, checks, subject, baseline_name, fp, base_fp, cfg.inconclusive_ok)
