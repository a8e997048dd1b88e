"""Trial item 7: the jacobi-mpi pair's comm-wait against the raw rows.

Read with sqlite3: inside the two 'Jacobi solve' NVTX ranges, each rank's communication is
its NVTX ranges named 'MPI' (around the halo exchange, MPI_Sendrecv) and the MPI calls of
``MPI_OTHER_EVENTS`` — the residual's MPI_Allreduce lies outside the 'MPI' ranges (rank 7:
244 ms in it, rank 3: 6 ms). The trial compared comm-wait with the 'MPI' ranges alone
(rank 7: 694.2 ms); the union of both is what comm-wait may hold, and the ranks' totals
agree (a synchronous job), so the finding must show where each waits.
"""

from __future__ import annotations

import re
import sqlite3
import sys

import pytest
from testpaths import ACCURACY

import gpudiag

sys.path.insert(0, str(ACCURACY))
import reference


def _raw(path, windows=None):
    """MPI time (union of 'MPI' ranges and MPI calls) and each call's time, in windows.

    The windows default to the 'Jacobi solve' ranges; gpudiag's analysed steps run from
    one range's start to the next one's (the MPI_Barrier between them is inside).
    """
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    solve = (
        windows
        or con.execute(
            "SELECT start, end FROM NVTX_EVENTS WHERE text = 'Jacobi solve' AND end IS NOT NULL"
        ).fetchall()
    )
    spans = con.execute(
        "SELECT start, end FROM NVTX_EVENTS WHERE text = 'MPI' AND end IS NOT NULL"
    ).fetchall()
    calls = con.execute(
        "SELECT m.start, m.end, s.value FROM MPI_OTHER_EVENTS m JOIN StringIds s ON s.id = m.textId"
    ).fetchall()
    con.close()
    merged = reference.merge(spans + [(a, b) for a, b, _ in calls])
    union = sum(reference.inside(merged, s, e) for s, e in solve)
    by = {}
    for a, b, n in calls:
        for s, e in solve:
            if a < e and b > s:
                by[n] = by.get(n, 0) + min(b, e) - max(a, s)
    return union, by


@pytest.fixture(scope="module")
def diagnosis(shared_traces):
    return gpudiag.analyze(shared_traces / "nsys" / "jacobi-mpi", jobs=1)


@pytest.mark.parametrize(("rank", "report"), [(3, "report1"), (7, "report2")])
def test_comm_wait_within_the_mpi_time_present(diagnosis, shared_traces, rank, report):
    mine = [s for s in diagnosis.steps if s.rank == rank]
    windows = [(s.start_ns, s.start_ns + s.duration_ns) for s in mine]
    union, by = _raw(shared_traces / "nsys" / "jacobi-mpi" / f"{report}.sqlite", windows)
    wait = sum(s.comm_wait_ns for s in mine)
    assert wait <= union + 1_000  # never more than the MPI time in the solve
    assert wait >= 0.99 * union  # the GPU computes nothing meanwhile: all of it is exposed
    calls = next(r for r in diagnosis.ranks if r.rank == rank).evidence.comm_calls
    assert calls == pytest.approx(by, rel=1e-6)


def test_the_ranks_differ_in_where_they_wait(diagnosis, shared_traces):
    _, by7 = _raw(shared_traces / "nsys" / "jacobi-mpi" / "report2.sqlite")
    share = by7["MPI_Allreduce"] / (
        by7["MPI_Allreduce"] + by7["MPI_Sendrecv"] + by7.get("MPI_Barrier", 0)
    )
    (f,) = [f for f in diagnosis.findings if f.kind.value == "comm_bound"]
    m = re.search(r"rank 7 MPI_Sendrecv \d+%, MPI_Allreduce (\d+)%", f.message)
    assert m, f.message
    assert int(m.group(1)) == round(100 * share)  # 26%, rank 3's under 1%
    assert "rank 3 MPI_Sendrecv 99%" in f.message
