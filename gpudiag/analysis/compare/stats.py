"""The gate's statistics: Mann-Whitney U, the regularised incomplete beta and Student's t.

Plain numerics (numpy and math, no scipy at run time); tests compare them with scipy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

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
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
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


@functools.lru_cache(maxsize=1024)
def t_ppf(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with ``df`` degrees of freedom.

    Bisection over :func:`t_sf` (200 halvings, ~0.4 ms); cached, since the gate asks the same
    few quantiles for every check (``runs_needed`` walks n = 2 … ``max_runs_advice``).
    """
    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 1.0 - t_sf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0
