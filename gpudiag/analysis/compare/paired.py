"""The gate's paired timing test: candidate and baseline runs alternated on one host.

On a busy runner the same code runs ±10–40% slower or faster from one run to the next
(docs/gate.md, "What the signals do on a busy host"): the host's factor, not the code,
sets the baseline runs' spread, so a test of one candidate against independent baseline
runs cannot see a +30% slowdown there. Recorded **alternately** in one CI job — B1 C1 B2 C2
B3 C3, each candidate run beside the baseline run before it — a pair shares its host's
factor, and the ratio of the pair's two medians cancels it. ``gpudiag gate C1 C2 C3
--baseline B1 B2 B3 --paired`` tests those ratios (C_i is paired with B_i, in the order
given):

* per pair i, d_i = ln(c_i / b_i), c_i and b_i the runs' statistic (the median over the
  steady steps of the per-step quantity: the slowest rank's wall-clock step time, or the
  largest training-thread CPU time, as the unpaired rule);
* over n ≥ 2 pairs, mean d̄ and sample standard deviation s_d; effect e = exp(d̄) − 1;
  t = d̄ / (s_d / √n); p = P(T_{n−1} > t); the smallest detectable effect
  MDE = exp(t_{1−run_alpha, n−1} · s_d / √n) − 1; the (1 − 2·run_alpha) interval
  exp(d̄ ± t_{1−run_alpha, n−1} · s_d / √n) − 1;
* **fail** when p < ``run_alpha`` and e > ``min_effect_ratio``; **pass** when
  e ≤ ``min_effect_ratio``; otherwise **inconclusive**. For normally distributed log
  ratios its false-alarm rate on unchanged code is at most ``run_alpha`` (a paired t-test),
  whatever the host's load, as long as the pair's two runs saw the same load;
* so the pairs must be comparable: a contended candidate's wall clock is tested when each
  pair's candidate run was at most ``comparable_contention_margin`` more contended than its
  partner (:func:`gpudiag.analysis.compare.timing.comparable_contention` on the pair);
  its CPU time when the run-conditions sampler's fixed work cost the candidate run at most
  ``max_host_cost_increase_ratio`` more than its partner. Else a slowdown is inconclusive,
  naming the pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpudiag._support import nputil
from gpudiag.analysis.compare.baseline import RunStat
from gpudiag.analysis.compare.checks import FAIL, INCONCLUSIVE, PASS, Check, CheckDetails
from gpudiag.analysis.compare.stats import t_ppf, t_sf
from gpudiag.analysis.compare.timing import (
    CPU,
    WALL,
    comparable_contention,
    cpu_not_applied,
    host_cost,
)
from gpudiag.config import GateConfig
from gpudiag.rundir.conditions import RunConditions, contention

PAIRED_HOW = (
    "record the baseline's and the candidate's runs alternately in one job "
    "(B1 C1 B2 C2 B3 C3) and give them in that order"
)


def _samples(r: RunStat, name: str) -> list[int]:
    if name == WALL:
        return list(r.step_time_ns) if r.step_time_ns_median is not None else []
    return list(r.cpu_ns)


def _label(r: RunStat, i: int, kind: str) -> str:
    return r.name or f"{kind} run {i + 1}"


def _uncomparable(
    name: str, cands: Sequence[RunStat], base: Sequence[RunStat], cfg: GateConfig
) -> list[str]:
    """The pairs whose two runs did not see the same host (why a slowdown cannot fail)."""
    out = []
    for i, (c, b) in enumerate(zip(cands, base, strict=True)):
        pair = f"pair {i + 1} ({_label(c, i, 'candidate')}, {_label(b, i, 'baseline')})"
        if name == CPU:
            out += [f"{pair}: {why}" for why in host_cost(c, [b], cfg)]
            continue
        cond = RunConditions(dict(c.conditions)) if c.conditions is not None else None
        if contention(cond, cfg) and comparable_contention(c, [b], cfg) is None:
            out.append(f"{pair}: the candidate run was more contended than its partner")
    return out


def paired_check(
    name: str, cands: Sequence[RunStat], base: Sequence[RunStat], cfg: GateConfig
) -> Check:
    """``WALL`` or ``CPU`` by the paired rule (the module docstring)."""
    what = "median step time" if name == WALL else "median training-thread CPU time a step"
    limit = cfg.min_effect_ratio
    runs = [*cands, *base]
    counts = [min(len(_samples(c, name)) for c in cands), min(len(_samples(b, name)) for b in base)]
    if min(counts) < cfg.min_samples:
        few = [r.name or "a run" for r in runs if len(_samples(r, name)) < cfg.min_samples]
        return Check(
            name,
            None,
            INCONCLUSIVE,
            None,
            limit,
            f"too few steady steps to compare: {', '.join(few[:3])} (need {cfg.min_samples} each)",
            samples=counts,
        )
    c_med = [float(nputil.median(_samples(c, name))) for c in cands]
    b_med = [float(nputil.median(_samples(b, name))) for b in base]
    logs = np.log(np.asarray(c_med) / np.asarray(b_med))
    n = len(logs)
    mean, sd = float(logs.mean()), float(logs.std(ddof=1))
    tq = t_ppf(1.0 - cfg.run_alpha, n - 1)
    se = sd / math.sqrt(n)
    p = t_sf(mean / se, n - 1) if se > 0 else (0.0 if mean > 0 else 1.0)
    effect = math.expm1(mean)
    mde = math.expm1(tq * se)
    ci = [math.expm1(mean - tq * se), math.expm1(mean + tq * se)]
    ratios = [math.exp(x) for x in logs.tolist()]
    details: CheckDetails = {
        "paired": True,
        "pair_ratios": ratios,
        "pair_log_sd": sd,
        "baseline_runs": n,
        "baseline_medians_ns": b_med,
        "candidate_medians_ns": c_med,
        "t_quantile": tq,
        "run_level_p": p,
        "min_effect_ratio": limit,
    }
    desc = (
        f"{what}: {n} alternated pairs, candidate/baseline "
        f"{', '.join(f'{r:.2f}' for r in ratios)} (geometric mean {effect:+.1%}, "
        f"{1.0 - 2.0 * cfg.run_alpha:.0%} CI {ci[0]:+.1%} to {ci[1]:+.1%}); the pairs' "
        f"ratios vary by ±{sd:.1%}, smallest detectable effect {mde:.1%}; paired p={p:.2g}"
    )

    def check(status: str, message: str) -> Check:
        return Check(
            name,
            None,
            status,  # type: ignore[arg-type]
            effect,
            limit,
            message,
            p_value=p,
            effect_ratio=effect,
            samples=counts,
            ci=ci,
            mde_ratio=mde,
            details=details,
        )

    if effect <= limit:
        verdict = "not slower" if effect <= 0 else f"within min effect +{limit:.0%}"
        return check(PASS, f"{verdict}: {desc}")
    slower = p < cfg.run_alpha
    details["own_test_slower"] = slower
    if not slower:
        more = "more pairs or a steadier pairing" if n < cfg.max_runs_advice else "a quieter runner"
        return check(INCONCLUSIVE, f"inconclusive: {more} would tell: {desc}")
    odd = _uncomparable(name, cands, base, cfg)
    if odd:
        return check(INCONCLUSIVE, f"inconclusive: slower, but {'; '.join(odd)}: {desc}")
    return check(FAIL, f"slower: {desc}")


def paired_checks(
    cands: Sequence[RunStat], base: Sequence[RunStat], cfg: GateConfig, mode: str, gpu: bool
) -> list[Check]:
    """The paired wall-clock and CPU-time checks, or why each is not applied."""
    if len(cands) != len(base) or len(cands) < 2:
        why = (
            f"not applied: --paired needs as many baseline runs as candidate runs, two or "
            f"more ({len(cands)} candidate, {len(base)} baseline); {PAIRED_HOW}"
        )
        return [Check(n, None, INCONCLUSIVE, None, None, why) for n in (WALL, CPU)]
    off = cpu_not_applied([*cands, *base], mode, gpu)
    return [paired_check(WALL, cands, base, cfg), off or paired_check(CPU, cands, base, cfg)]
