"""Issue 23: the sort-based ``np.unique`` stand-ins give exactly what ``np.unique`` gives."""

from __future__ import annotations

import numpy as np
import pytest

from gpudiag._support import nputil


@pytest.mark.parametrize("seed", range(8))
def test_same_as_numpy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 2000))
    dtype = [np.int64, np.int32, np.int8, np.uint64][seed % 4]
    x = rng.integers(0, [5, 1000, 10**12, 100][seed % 4], n).astype(dtype)
    u = np.unique(x)
    assert nputil.unique(x).tolist() == u.tolist() and nputil.unique(x).dtype == x.dtype
    for got, want in zip(nputil.unique_index(x), np.unique(x, return_index=True), strict=True):
        assert got.tolist() == want.tolist()
    for got, want in zip(nputil.unique_inverse(x), np.unique(x, return_inverse=True), strict=True):
        assert got.tolist() == want.tolist()
    want3 = np.unique(x, return_index=True, return_counts=True)
    for got, want in zip(nputil.unique_index_counts(x), want3, strict=True):
        assert got.tolist() == want.tolist()


def test_empty_and_single():
    for x in (np.zeros(0, np.int64), np.array([7], np.int64)):
        assert nputil.unique(x).tolist() == np.unique(x).tolist()
        assert [a.tolist() for a in nputil.unique_index(x)] == [
            a.tolist() for a in np.unique(x, return_index=True)
        ]


@pytest.mark.parametrize(("rows", "seed"), [(2, 0), (3, 1), (4, 2), (7, 3), (64, 4), (65, 5)])
def test_median_without_each_is_the_leave_one_out_median(rows, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6 if seed % 2 else 10**9, (rows, 5)).astype(np.float64)  # ties too
    want = np.array([np.median(np.delete(a, i, axis=0), axis=0) for i in range(rows)])
    got = nputil.median_without_each(a)
    assert got.tolist() == want.tolist()  # exactly: the same two values, the same mean


@pytest.mark.parametrize("seed", range(4))
def test_group_medians_are_numpy_medians(seed):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 50, 3000)
    v = rng.integers(0, [3, 10**12, 100, 10**6][seed], 3000)
    keys, med = nputil.group_medians(g, v)
    assert keys.tolist() == sorted(set(g.tolist()))
    assert med.tolist() == [float(np.median(v[g == k])) for k in keys.tolist()]


@pytest.mark.parametrize("seed", range(6))
def test_percentile_and_median_same_as_numpy(seed):
    """Bit for bit, as floats (percentile) and as np.float64 (median), ints and floats."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            x = rng.integers(0, 10**12, n)
        elif kind == 1:
            x = rng.random(n) * 10.0 ** int(rng.integers(-3, 12))
        else:
            x = rng.integers(-3, 3, n).astype(np.float64)
        for q in (0, 10, 25, 50, 75, 90, 99, 100, 33.3):
            assert nputil.percentile(x, q) == float(np.percentile(x, q))
        m = nputil.median(x)
        assert m == np.median(x) and type(m) is type(np.median(x))
        assert nputil.median(list(x)) == np.median(list(x))
    assert np.isnan(nputil.median(np.array([1.0, np.nan, 2.0])))  # numpy's own answer
    assert np.isnan(nputil.percentile(np.array([1.0, np.nan]), 50))
