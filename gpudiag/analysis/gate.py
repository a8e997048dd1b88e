"""Compares a Diagnosis with thresholds or a baseline Diagnosis → GateResult.

Pure: no I/O, no globals. The rules (docs/gate.md states them for users):

* **Absolute checks**, one per rank: ``idle_ratio`` ≤ ``max_idle_ratio`` (default 0.30),
  and, when configured, comm-wait share ≤ ``max_comm_wait_ratio`` and data-wait share ≤
  ``max_data_wait_ratio``. A rank without analysed steps makes its check *inconclusive*.
* **Stragglers**: every Finding of kind ``straggler`` (whoever produced it) is a failing
  check (``stragglers="fail"``), a warning (``"warn"``) or ignored (``"off"``).
* **Regression against a baseline**: the samples are per-step job step times — for each step
  number the slowest rank's duration (a synchronous data-parallel step ends when its slowest
  rank does, and the ranks' durations of one step are not independent samples). Steps whose
  number is below ``warmup_steps`` (default 2) are dropped on both sides: step 0 carries lazy
  initialisation, allocator growth and DDP bucket rebuilding. With fewer than
  ``min_samples`` (default 8) samples on either side the check is *inconclusive*.
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
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from gpudiag.analysis.model import Diagnosis
from gpudiag.analysis.wholerun import disturbed_steps
from gpudiag.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, UsageError

PASS, FAIL, WARN, INCONCLUSIVE = "pass", "fail", "warn", "inconclusive"
STRAGGLER_MODES = ("fail", "warn", "off")


@dataclass(frozen=True)
class GateConfig:
    """Every number that changes a gate verdict; ratios in [0, 1]."""

    max_idle_ratio: float = 0.30
    max_comm_wait_ratio: float | None = None
    max_data_wait_ratio: float | None = None
    max_regression_ratio: float = 0.10
    alpha: float = 0.01
    min_samples: int = 8
    warmup_steps: int = 2
    stragglers: str = "fail"
    inconclusive_ok: bool = False

    def __post_init__(self) -> None:
        for name in ("max_idle_ratio", "max_comm_wait_ratio", "max_data_wait_ratio", "alpha"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= float(v) <= 1.0:
                raise UsageError(f"gate: {name}={v} is not a ratio in [0, 1]", "0.30 means 30%")
        if self.max_regression_ratio < 0:
            raise UsageError(
                f"gate: max regression {self.max_regression_ratio:.0%} is negative",
                "give a percentage such as 10",
            )
        if self.min_samples < 2 or self.warmup_steps < 0:
            raise UsageError("gate: min_samples must be ≥ 2 and warmup_steps ≥ 0", "")
        if self.stragglers not in STRAGGLER_MODES:
            raise UsageError(
                f"gate: stragglers={self.stragglers!r}", f"choose one of {STRAGGLER_MODES}"
            )


# Config-file keys → GateConfig fields; the regression limit is written in percent there.
_CONFIG_KEYS = {f.name for f in fields(GateConfig)} - {"max_regression_ratio"} | {
    "max_regression_pct"
}


def gate_config(table: dict[str, Any] | None = None, **overrides: Any) -> GateConfig:
    """``[tool.gpudiag.gate]`` then CLI overrides (``None`` = not given) → GateConfig."""
    table = dict(table or {})
    unknown = sorted(set(table) - _CONFIG_KEYS)
    if unknown:
        raise UsageError(
            f"[tool.gpudiag.gate]: unknown setting(s) {', '.join(unknown)}",
            f"known settings: {', '.join(sorted(_CONFIG_KEYS))}",
        )
    if "max_regression_pct" in table:
        table["max_regression_ratio"] = float(table.pop("max_regression_pct")) / 100.0
    table.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GateConfig(**table)
    except TypeError as e:
        raise UsageError(f"gate configuration: {e}", "see docs/gate.md") from e


@dataclass(frozen=True)
class Check:
    """One gate check: a metric (of one rank, or of the run when ``rank`` is None)."""

    name: str
    rank: int | None
    status: str  # pass, fail, warn, inconclusive
    value: float | None
    limit: float | None
    message: str
    p_value: float | None = None
    effect_ratio: float | None = None
    samples: list[int] = field(default_factory=list)  # [candidate, baseline] sample counts


@dataclass(frozen=True)
class GateResult:
    """The verdict and every check behind it."""

    status: str  # passed, failed, inconclusive
    checks: list[Check]
    subject: str = ""
    baseline: str | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    baseline_fingerprint: dict[str, Any] | None = None
    inconclusive_ok: bool = False

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 5 inconclusive (see DESIGN.md's table)."""
        return {"passed": EXIT_OK, "failed": EXIT_GATE_FAILED}.get(self.status, EXIT_INCONCLUSIVE)

    def counts(self) -> dict[str, int]:
        """How many checks have each status."""
        out = dict.fromkeys((PASS, WARN, FAIL, INCONCLUSIVE), 0)
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return out

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
        p = _norm_sf((u1 - mu - 0.5) / sigma)
    elif alternative == "less":
        p = _norm_sf((u2 - mu - 0.5) / sigma)
    else:
        p = min(1.0, 2.0 * _norm_sf((max(u1, u2) - mu - 0.5) / sigma))
    return u1, p


# ---- samples and fingerprints ----


def step_samples(d: Diagnosis, warmup_steps: int = 2) -> list[int]:
    """Per-step job step times (ns): per step number, the slowest rank; warm-up dropped.

    Uses the run directory's telemetry (every step, less the steps the profiler slowed
    down) when the Diagnosis has it and it holds more steps than the profiled window, else
    the profiled steps.
    """
    rows: list[tuple[int, int]] = [(s.step, s.duration_ns) for s in d.steps]
    whole = getattr(d, "whole_run", None)
    tele = list(getattr(whole, "steps", None) or [])
    disturbed = disturbed_steps(tele)  # the profiler's own cost is not the job's
    steady = [(int(s.step), int(s.duration_ns)) for s in tele if s.step not in disturbed]
    if len({s for s, _ in steady}) > len({s for s, _ in rows}):
        rows = steady
    per_step: dict[int, int] = {}
    for step, dur in rows:
        if step >= warmup_steps and dur > 0:
            per_step[step] = max(per_step.get(step, 0), dur)
    return [per_step[k] for k in sorted(per_step)]


def fingerprint(d: Diagnosis) -> dict[str, Any]:
    """What must match for two runs to be comparable: world size, device names, mode."""
    devices = sorted({dev for r in d.ranks for dev in r.devices})
    return {
        "world_size": d.run.world_size or d.run.ranks,
        "devices": devices,
        "mode": d.run.mode,
    }


# ---- the gate ----


def _limit_checks(d: Diagnosis, cfg: GateConfig) -> list[Check]:
    out: list[Check] = []
    specs: list[tuple[str, str, float | None]] = [
        ("idle_ratio", "idle ratio", cfg.max_idle_ratio),
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
    found = [f for f in d.findings if f.kind == "straggler"]
    if not found:
        return [Check("straggler", None, PASS, None, None, "no straggler findings")]
    before = {r for f in (base.findings if base else []) if f.kind == "straggler" for r in f.ranks}
    out: list[Check] = []
    status = FAIL if cfg.stragglers == "fail" else WARN
    for f in found:
        for rank in f.ranks or [None]:  # type: ignore[list-item]
            again = " (also in the baseline)" if base is not None and rank in before else ""
            out.append(Check("straggler", rank, status, None, None, f.message + again))
    return out


def _regression_check(d: Diagnosis, base: Diagnosis, cfg: GateConfig) -> Check:
    cand = step_samples(d, cfg.warmup_steps)
    ref = step_samples(base, cfg.warmup_steps)
    limit = cfg.max_regression_ratio
    counts = [len(cand), len(ref)]
    if min(counts) < cfg.min_samples:
        return Check("step_time_regression", None, INCONCLUSIVE, None, limit,
                     f"too few steps to compare: {len(cand)} (subject) and {len(ref)} "
                     f"(baseline) after skipping {cfg.warmup_steps} warm-up steps; "
                     f"need {cfg.min_samples} each", samples=counts)  # fmt: skip
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
) -> GateResult:
    """Run every configured check on ``d`` (and against ``baseline``) and decide."""
    fp = fingerprint(d)
    base_fp = fingerprint(baseline) if baseline is not None else None
    checks = _limit_checks(d, cfg) + _straggler_checks(d, cfg, baseline)
    mismatch = False
    if baseline is not None:
        if fp != base_fp:
            mismatch = True
            diffs = ", ".join(
                f"{k} {fp[k]!r} vs {base_fp[k]!r}"  # type: ignore[index]
                for k in fp
                if fp[k] != base_fp[k]  # type: ignore[index]
            )
            checks.insert(0, Check("fingerprint", None, INCONCLUSIVE, None, None,
                                   f"baseline is from a different setup ({diffs}): "
                                   "not compared"))  # fmt: skip
        else:
            checks.append(_regression_check(d, baseline, cfg))
    statuses = {c.status for c in checks}
    if mismatch:
        status = "inconclusive"
    elif FAIL in statuses:
        status = "failed"
    elif INCONCLUSIVE in statuses and not cfg.inconclusive_ok:
        status = "inconclusive"
    else:
        status = "passed"
    return GateResult(status, checks, subject, baseline_name, fp, base_fp, cfg.inconclusive_ok)
