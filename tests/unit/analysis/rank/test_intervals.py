import numpy as np
import pytest

from gpudiag.analysis.rank import intervals as iv


def _mask(s: iv.IntervalSet, n: int = 80) -> np.ndarray:
    m = np.zeros(n, bool)
    for a, b in zip(*s, strict=True):
        m[a:b] = True
    return m


def _random_set(rng: np.random.Generator) -> iv.IntervalSet:
    n = int(rng.integers(0, 10))
    s = rng.integers(0, 60, n)
    return iv.union(s, s + rng.integers(0, 12, n))


def test_union_merges_overlaps_touching_and_drops_empty():
    s, e = iv.union([5, 0, 3, 20, 30], [10, 4, 6, 25, 30])
    assert s.tolist() == [0, 20] and e.tolist() == [10, 25]


@pytest.mark.parametrize("seed", range(5))
def test_set_operations_match_brute_force(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        a, b = _random_set(rng), _random_set(rng)
        ma, mb = _mask(a), _mask(b)
        assert (_mask(iv.intersect(a, b)) == (ma & mb)).all()
        assert (_mask(iv.subtract(a, b)) == (ma & ~mb)).all()
        assert (_mask(iv.join(a, b)) == (ma | mb)).all()
        lo, hi = sorted(rng.integers(0, 80, 2).tolist())
        assert iv.measure(a, [lo], [hi])[0] == ma[lo:hi].sum()
        gaps = iv.complement(a, lo, hi)
        assert (_mask(gaps)[lo:hi] == ~ma[lo:hi]).all()


def test_results_are_sorted_disjoint_and_non_empty():
    rng = np.random.default_rng(9)
    for _ in range(100):
        r = iv.subtract(_random_set(rng), _random_set(rng))
        assert (r[1] > r[0]).all()
        assert (r[0][1:] > r[1][:-1]).all()


def test_measure_many_windows_at_once():
    a = iv.union([0, 10], [5, 20])
    got = iv.measure(a, [0, 3, 8, 15, 25], [30, 12, 9, 100, 30])
    assert got.tolist() == [15, 4, 0, 5, 0]
