"""Issue 23: the cross-rank step is whole-array work, with the results of the loops it replaced.

Each vectorised function is checked against a straightforward reading of its definition
(the per-collective / per-rank loops the code used to run) on random runs, exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpudiag.analysis.run.collectives import Collectives, match
from gpudiag.analysis.run.collectives import summarize_collectives as summarize
from gpudiag.config import CollectiveRules


def _colls(seed: int, ranks: int, n: int, keyed: bool) -> list[Collectives]:
    rng = np.random.default_rng(seed)
    types = ["allreduce", "allgather", "send", "reducescatter"]
    sizes = rng.choice([1 << 20, 1 << 24, -1], n).astype(np.int64)  # the same on every rank
    out = []
    for r in range(ranks):
        ty = [types[i % len(types)] for i in range(n)]
        start = np.sort(rng.integers(0, 10**9, n)).astype(np.int64)
        out.append(
            Collectives(
                rank=r,
                type=ty,
                key=(np.arange(n, dtype=np.int64) if keyed else np.full(n, -1, np.int64)),
                nbytes=sizes.copy(),
                start=start,
                dur=rng.integers(1, 5_000_000, n).astype(np.int64),
                step=np.sort(rng.integers(-1, 4, n)).astype(np.int32),
                devices=8,
                device_name="NVIDIA A100-SXM4-80GB",
            )
        )
    return out


def _union_parts(intervals):
    """Each (start, end, label)'s part of the union: a sweep in start order (ties: first listed)."""
    parts = []
    reach = None
    for s, e, label in sorted(intervals, key=lambda x: x[0]):
        lo = s if reach is None else max(s, reach)
        parts.append((label, max(0, e - lo)))
        reach = e if reach is None else max(reach, e)
    return parts


def _reference(colls, rules):
    """The per-collective loop, as the definition reads: a rank's wait is the union of its
    [entry, entry + wait] intervals, each collective's part going to its step."""
    _, matched = match(colls)
    by_rank = {c.rank: c for c in colls}
    sync = {c.rank: 0 for c in colls}
    transfer = {c.rank: 0 for c in colls}
    waits: dict[int, list] = {c.rank: [] for c in colls}  # (start, end, (k, step))
    late: dict[int, list[int]] = {}
    late_waits: dict[tuple[int, int], list] = {}  # (late rank, other rank) -> intervals
    for k, m in enumerate(matched):
        durs = {r: int(by_rank[r].dur[i]) for r, i in m.items()}
        t = min(durs.values())
        for r, d in durs.items():
            transfer[r] += t
            s0 = int(by_rank[r].start[m[r]])
            waits[r].append((s0, s0 + d - t, (k, int(by_rank[r].step[m[r]]))))
        last = min(durs, key=lambda r: durs[r])
        waited = (sum(durs.values()) - len(durs) * t) // (len(durs) - 1)
        if waited >= rules.late_wait_ns:
            late.setdefault(last, []).append(waited)
            for r, d in durs.items():
                s0 = int(by_rank[r].start[m[r]])
                late_waits.setdefault((last, r), []).append((s0, s0 + d - t, k))
    # sums per (rank, step), keys in the order a collective-by-collective pass meets them
    part = {}
    for r, iv in waits.items():
        for (k, st), w in _union_parts(iv):
            part[(k, r)] = (st, w)
            sync[r] += w
    by_step: dict[tuple[int, int], int] = {}
    for k in range(len(matched)):
        for c in colls:
            st, w = part[(k, c.rank)]
            by_step[(c.rank, st)] = by_step.get((c.rank, st), 0) + w
    late_total = dict.fromkeys(late, 0)
    for (r, _), iv in late_waits.items():
        late_total[r] += sum(w for _, w in _union_parts(iv))
    return sync, transfer, by_step, late, late_total


@pytest.mark.parametrize(
    ("seed", "ranks", "keyed"),
    [(0, 2, True), (1, 5, True), (2, 16, False), (3, 3, False), (4, 64, True)],
)
def test_matched_waits_are_the_loops(seed, ranks, keyed):
    rules = CollectiveRules()
    colls = _colls(seed, ranks, 40, keyed)
    summary, by_step = summarize(colls, rules=rules)
    sync, transfer, ref_steps, late, late_total = _reference(colls, rules)
    assert summary is not None and summary.matched > 0
    assert list(by_step.items()) == list(ref_steps.items())  # same sums, same key order
    assert {int(r): (v.sync_wait_ns, v.transfer_ns) for r, v in summary.per_rank.items()} == {
        r: (sync[r], transfer[r]) for r in sync
    }
    assert {
        int(r): (v.last, v.waited_ns, v.waited_ns_min, v.waited_ns_max)
        for r, v in summary.late_arrival.items()
    } == {r: (len(w), late_total[r], min(w), max(w)) for r, w in late.items()}


def test_the_random_runs_hold_side_by_side_collectives():
    """The runs above exercise the union: some rank enters a collective before its last ends."""
    rules = CollectiveRules()
    colls = _colls(1, 5, 40, True)
    summary, _ = summarize(colls, rules=rules)
    _, matched = match(colls)
    summed = {c.rank: 0 for c in colls}
    for m in matched:
        durs = {r: int(colls[r].dur[i]) for r, i in m.items()}
        for r, d in durs.items():
            summed[r] += d - min(durs.values())
    assert summary is not None
    assert any(summary.per_rank[str(r)].sync_wait_ns < summed[r] for r in summed)


@pytest.mark.parametrize(("ranks", "seed"), [(2, 0), (3, 1), (8, 2), (33, 3)])
def test_straggler_excess_is_the_leave_one_out_loop(ranks, seed):
    from gpudiag.analysis.stragglers.stepmatrix import excess, others_median

    rng = np.random.default_rng(seed)
    busy = rng.integers(0, 50, (ranks, 6)).astype(np.float64) * 1e6  # ties included
    loop = np.array([np.median(np.delete(busy, i, axis=0), axis=0) for i in range(ranks)])
    assert others_median(busy).tolist() == loop.tolist()
    assert excess(busy).tolist() == (busy - loop).tolist()
    busy[1, 2] = np.nan  # a gap: the loop's own answer (NaN where a NaN is among the others)
    loop = np.array([np.median(np.delete(busy, i, axis=0), axis=0) for i in range(ranks)])
    assert np.array_equal(others_median(busy), loop, equal_nan=True)


@pytest.mark.parametrize("seed", range(4))
def test_per_rank_statistics_are_the_per_rank_loops(seed):
    from gpudiag.analysis.model.diagnosis import StepBreakdown, by_rank
    from gpudiag.analysis.remedies.remedy import PerRankStats

    rng = np.random.default_rng(seed)
    steps = []
    for r in rng.permutation(40).tolist():
        for s in range(int(rng.integers(1, 9))):
            comm, data = (int(x) for x in rng.integers(0, 10**7, 2))
            steps.append(StepBreakdown(r, s, 0, comm + data + 5, 5, comm, data, 0, 0))
    sync = {(s.rank, s.step): int(rng.integers(0, 10**7)) for s in steps if rng.random() < 0.7}
    stats = PerRankStats(steps, sync)
    grouped = by_rank(steps)
    for ranks in ([], [3], list(range(40)), [39, 0, 77]):
        for part, stat in (("comm_wait_ns", np.median), ("data_wait_ns", np.mean)):
            best = 0.0
            for r in ranks:
                vals = [getattr(s, part) for s in grouped.get(r, [])]
                if vals:
                    best = max(best, float(stat(vals)))
            name = "median" if stat is np.median else "mean"
            assert stats.largest(ranks, part, name) == round(best)
        best = 0.0
        for r in ranks:
            vals = [max(0, s.comm_wait_ns - sync.get((r, s.step), 0)) for s in grouped.get(r, [])]
            if vals:
                best = max(best, float(np.median(vals)))
        assert stats.largest(ranks, "exposed_transfer") == round(best)
