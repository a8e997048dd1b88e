"""Issue 20 item 4 (words only): a rank that waits mostly in point-to-point exchanges
(MPI_Sendrecv halos) is "communication-bound … waits for point-to-point communication",
not "for collectives".

Truth from outside gpudiag: the jacobi-mpi Nsight export's ``MPI_OTHER_EVENTS`` rows, summed
per call name by a plain SQL loop here (rank 3: MPI_Sendrecv ≫ MPI_Allreduce); and
hand-made evidence whose shares are known by construction.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import gpudiag
from gpudiag.analysis.model.diagnosis import RankEvidence
from gpudiag.analysis.run.collectives import p2p_share


def test_p2p_share_from_calls_and_kernels() -> None:
    mpi = RankEvidence(comm_calls={"MPI_Sendrecv": 750, "MPI_Allreduce": 250})
    assert p2p_share([mpi]) == 0.75
    ddp = RankEvidence(comm_types={"allreduce": 1.0})
    assert p2p_share([ddp]) == 0.0
    # NCCL runs all-to-all with SendRecv kernels: the host operations decide
    a2a = RankEvidence(comm_types={"sendrecv": 1.0}, host_comm_types={"alltoall": 1.0})
    assert p2p_share([a2a]) == 0.0
    assert p2p_share([RankEvidence()]) is None


def test_jacobi_halo_exchange_reads_point_to_point(shared_traces: Path) -> None:
    path = shared_traces / "nsys/jacobi-mpi/report1.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    totals: dict[str, int] = {}
    for name, dur in con.execute(
        "SELECT s.value, e.end - e.start FROM MPI_OTHER_EVENTS e JOIN StringIds s ON s.id = e.textId"
    ):
        totals[name] = totals.get(name, 0) + dur
    con.close()
    comm = {n: v for n, v in totals.items() if n not in ("MPI_Init", "MPI_Finalize")}
    assert totals["MPI_Sendrecv"] > 0.5 * sum(comm.values())  # halos, not the reductions
    d = gpudiag.analyze(path, jobs=1, cache=False)
    head = d.verdict.headline
    assert head.startswith("communication-bound") and "point-to-point" in head
    assert "collectives" not in head
