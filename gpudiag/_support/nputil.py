"""``np.unique`` by sorting, for the 1-D integer arrays of traces (ids, times; no NaN).

numpy 2.3+ finds the distinct values of an integer array with a hash table first: for the
hundreds of thousands of distinct timestamps or keys of a trace that is ~100x slower than
a sort (0.45 s against 4 ms for 600k int64 here), and it was the largest single cost of a
rank's analysis after the decode. These functions give what ``np.unique`` gives — the
sorted distinct values, the index of each one's first occurrence, the inverse and the
counts — from one (stable) sort.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


def unique(values: npt.ArrayLike) -> Array:
    """The sorted distinct values of a 1-D array (``np.unique(values)``)."""
    x = np.sort(np.asarray(values).ravel())
    if x.size < 2:
        return x
    keep = np.empty(x.size, bool)
    keep[0] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]


def unique_index(values: npt.ArrayLike) -> tuple[Array, npt.NDArray[np.intp]]:
    """Distinct values and where each first occurs (``np.unique(..., return_index=True)``)."""
    x = np.asarray(values).ravel()
    order = np.argsort(x, kind="stable")
    flag = _starts(x[order])
    return x[order][flag], order[flag]


def unique_inverse(values: npt.ArrayLike) -> tuple[Array, npt.NDArray[np.intp]]:
    """Distinct values and each value's index among them (``return_inverse=True``)."""
    x = np.asarray(values).ravel()
    order = np.argsort(x, kind="stable")
    flag = _starts(x[order])
    inverse = np.empty(x.size, np.intp)
    inverse[order] = np.cumsum(flag) - 1
    return x[order][flag], inverse


def unique_index_counts(
    values: npt.ArrayLike,
) -> tuple[Array, npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Distinct values, first occurrences and counts (``return_index``, ``return_counts``)."""
    x = np.asarray(values).ravel()
    order = np.argsort(x, kind="stable")
    flag = _starts(x[order])
    pos = np.flatnonzero(flag)
    counts = np.diff(np.append(pos, x.size)).astype(np.intp)
    return x[order][flag], order[flag], counts


def _starts(sorted_values: Array) -> npt.NDArray[np.bool_]:
    """True where a sorted array's value differs from the one before (and at 0)."""
    flag = np.empty(sorted_values.size, bool)
    if sorted_values.size:
        flag[0] = True
        np.not_equal(sorted_values[1:], sorted_values[:-1], out=flag[1:])
    return flag


def median_without_each(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``out[i, j]`` = median of column ``j`` without row ``i`` (leave-one-out), for all i.

    What ``np.median(np.delete(a, i, axis=0), axis=0)`` gives for every row ``i``, from one
    sort per column instead of one median of a copy per row: O(R log R) per column, not
    O(R²). Needs at least two rows and no NaN (callers fall back to the loop otherwise).
    """
    r = a.shape[0]
    order = np.argsort(a, axis=0, kind="stable")
    v = np.take_along_axis(a, order, axis=0)  # each column sorted
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(r)[:, None], axis=0)  # each value's sorted rank
    m = r - 1  # values left once a row is removed

    def left(j: int) -> npt.NDArray[np.float64]:
        # the j-th smallest of the others: v[j] when the removed one sorts after it
        out: npt.NDArray[np.float64] = np.where(
            j < pos, v[j][None, :], v[min(j + 1, r - 1)][None, :]
        )
        return out

    if m % 2:
        return left((m - 1) // 2)
    lo, hi = left(m // 2 - 1), left(m // 2)
    out: npt.NDArray[np.float64] = (lo + hi) / 2
    return out


def group_medians(
    groups: npt.NDArray[np.int64], values: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The distinct groups (sorted) and ``np.median`` of each one's values, all at once."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order].astype(np.float64)
    flag = _starts(g)
    start = np.flatnonzero(flag)
    count = np.diff(np.append(start, g.size))
    lo = v[start + (count - 1) // 2]
    hi = v[start + count // 2]
    return g[start], (lo + hi) / 2


def percentile(values: npt.ArrayLike, q: float) -> float:
    """``float(np.percentile(values, q))`` (linear), of all values, from one sort.

    numpy 2.3+'s percentile calls ``np.unique``, which imports ``numpy.ma`` (~8 ms, once
    a process). The steps and the arithmetic are numpy's (virtual index ``(n-1)·q/100``,
    then its ``_lerp``), so the result is the same to the bit; no values or a NaN among
    them go to numpy itself.
    """
    a = np.sort(np.asarray(values), axis=None)
    n = a.size
    if n == 0 or (a.dtype.kind == "f" and np.isnan(a[-1])):
        return float(np.percentile(a, q))
    vi = (n - 1) * (q / 100)
    if vi >= n - 1:
        return float(a[-1] + (a[-1] - a[-1]) * 0.0)  # as numpy's lerp (dtype follows)
    lo = int(np.floor(vi)) if vi >= 0 else 0
    gamma = vi - lo
    prev, nxt = a[lo], a[lo + 1]
    diff = nxt - prev
    if gamma >= 0.5:
        return float(nxt - diff * (1 - gamma))
    return float(prev + diff * gamma)


def median(values: npt.ArrayLike) -> np.float64:
    """``np.median(values)`` of all values, from one sort.

    numpy's own imports ``numpy.ma`` for a float array (~8 ms, once a process); this is
    the mean of the middle one or two values as numpy takes it.
    """
    a = np.sort(np.asarray(values), axis=None)
    n = a.size
    if n == 0 or (a.dtype.kind == "f" and np.isnan(a[-1])):
        out: np.float64 = np.float64(np.median(a))
        return out
    k = n // 2
    mid = a[k : k + 1] if n % 2 else a[k - 1 : k + 1]
    out = np.float64(np.mean(mid))
    return out
