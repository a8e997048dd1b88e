"""Generate the small hand-built Kineto traces in tests/data/<scenario>/ (run: python tests/data/make_fixtures.py).

Each follows the layout described in ../shared/reference/kineto-format.md for one era and
holds a scenario with a known answer. Keep them tiny: a few dozen events each.

* ``legacy_2021/``: capitalised categories (Operator/Runtime/Kernel/Memcpy), lower-case
  ``external id``, string tids (``"stream 7"``), integer epoch-µs ``ts``, ``ProfilerStep#``
  as an Operator, ``ncclKernel_*`` names. One rank, 2 steps of 10 ms: per step 6 ms of
  compute, 2 ms of NCCL of which 1 ms overlaps compute.
* ``nccl219_data/``: 2024+ layout (``baseTimeNanoseconds``, float relative ``ts``, ``ac2g``
  flows), NCCL ≥ 2.19/2.27 names (``ncclDevKernel_*``, ``ncclSymDevKernel_*``), collective
  args with ``Seq`` and ``Comms Id``. Two ranks, 3 steps of 10 ms. Rank 0: 8 ms compute,
  1 ms exposed comm. Rank 1: its DataLoader ``__next__`` takes 4 ms with the GPU idle,
  then 4 ms compute, 1 ms exposed comm.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _x(
    cat: str, name: str, pid: Any, tid: Any, ts: float, dur: float, **args: Any
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }
    if args:
        e["args"] = args
    return e


def legacy_2021() -> dict[str, Any]:
    pid, tid, t0 = 4242, 4242, 1_620_000_000_000_000  # epoch µs
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
    ]
    corr = 100
    for s in range(2):
        base = t0 + s * 10_000
        ev.append(_x("Operator", f"ProfilerStep#{s + 7}", pid, tid, base, 9_800))
        ev.append(_x("Operator", "aten::mm", pid, tid, base + 100, 300, **{"external id": 1}))
        ev.append(_x("Runtime", "cudaLaunchKernel", pid, tid, base + 200, 20, correlation=corr))
        ev.append(_x("Kernel", "volta_sgemm_128x64_nn", 0, "stream 7", base + 1_000, 6_000,
                     correlation=corr, device=0, stream=7))  # fmt: skip
        ev.append(_x("Runtime", "cudaLaunchKernel", pid, tid, base + 400, 20, correlation=corr + 1))
        ev.append(_x("Kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 0, "stream 21", base + 6_000,
                     2_000, correlation=corr + 1, device=0, stream=21))  # fmt: skip
        ev.append(_x("Runtime", "cudaMemcpyAsync", pid, tid, base + 500, 10, correlation=corr + 2))
        ev.append(_x("Memcpy", "Memcpy HtoD (Pageable -> Device)", 0, "stream 7", base + 8_500, 200,
                     correlation=corr + 2, device=0, stream=7, bytes=4096))  # fmt: skip
        corr += 3
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "traceEvents": ev}  # fmt: skip


def nccl219_data(rank: int) -> dict[str, Any]:
    pid = tid = 1000 + rank
    base_ns = 1_790_000_000_000_000_000
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
         "args": {"name": f"thread {tid} (pt_main_thread)"}},
        {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": f"GPU {rank}"}},
    ]  # fmt: skip
    corr = 10
    dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    for s in range(3):
        t = 5_000.0 + s * 10_000.0  # µs relative to baseTimeNanoseconds
        ev.append(_x("user_annotation", f"ProfilerStep#{s}", pid, tid, t, 9_900.0))
        data = 4_000.0 if rank == 1 else 100.0
        ev.append(_x("user_annotation", dl, pid, tid, t + 50.0, data))
        launch = t + 100.0 + data
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", pid, tid, launch, 5.0, correlation=corr))
        compute = 4_000.0 if rank == 1 else 8_000.0
        k0 = t + 200.0 + data
        ev.append(_x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", rank, 7, k0, compute,
                     correlation=corr, device=rank, stream=7))  # fmt: skip
        ev.append({"ph": "s", "cat": "ac2g", "id": corr, "pid": pid, "tid": tid, "ts": launch})
        ev.append(
            {"ph": "f", "cat": "ac2g", "id": corr, "pid": rank, "tid": 7, "ts": k0, "bp": "e"}
        )
        comm_args = {"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1 << 20,
                     "Out msg nelems": 1 << 20, "Group size": 2, "Process Group Name": "0",
                     "Process Group Description": "default_pg", "Seq": s + 1,
                     "Comms Id": 77_000 + s, "Rank": rank}  # fmt: skip
        ev.append(_x("cpu_op", "c10d::allreduce_", pid, tid, launch + 10.0, 30.0))
        ev.append(_x("cpu_op", "record_param_comms", pid, tid, launch + 12.0, 25.0, **comm_args))
        ev.append(
            _x(
                "cuda_runtime",
                "cudaLaunchKernel",
                pid,
                tid,
                launch + 15.0,
                5.0,
                correlation=corr + 1,
            )
        )
        # 2 ms of NCCL starting 1 ms before compute ends: 1 ms hidden, 1 ms exposed
        name = (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
            if s < 2
            else "ncclSymDevKernel_AllReduce_RSxLD_bf16"
        )
        ev.append(_x("kernel", name, rank, 40, k0 + compute - 1_000.0, 2_000.0,
                     correlation=corr + 1, device=rank, stream=40, **comm_args))  # fmt: skip
        corr += 2
    return {"schemaVersion": 1, "baseTimeNanoseconds": base_ns, "displayTimeUnit": "ms",
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2, "nccl_version": "2.27.3"},
            "deviceProperties": [{"id": rank, "name": "NVIDIA H100 80GB HBM3"}],
            "traceEvents": ev}  # fmt: skip


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc, separators=(",", ":")).encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)


def main() -> None:
    write(HERE / "legacy_2021" / "trainer_worker0.pt.trace.json", legacy_2021())
    for r in range(2):
        write(HERE / "nccl219_data" / f"host_{1000 + r}.pt.trace.json.gz", nccl219_data(r))


if __name__ == "__main__":
    main()
