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
* ``straggler_comms_id/``: 2024+ layout, two ranks, 4 steps of synchronous data parallelism
  with collectives matched by ``Comms Id``: rank 1 computes 5 ms longer (8 vs 3 ms), so
  rank 0's all-reduce kernel spins 5 ms waiting before the 2 ms transfer both share.
* ``pipeline_4stage/``: four pipeline stages (ranks 0-3), one GPipe step of m = 4
  micro-batches, forward 1 ms and backward 2 ms per micro-batch and stage, activations and
  gradients passed with ``send``/``recv`` (``ncclDevKernel_SendRecv``; a receive kernel
  spins from when the stage's GPU is free until the data arrives, as NCCL's does). Each
  stage computes m·(F+B) = 12 ms of a (m+p−1)·(F+B) = 21 ms step: bubble
  (p−1)/(m+p−1) = 3/7, all of it waiting in receives except stage 0's forward and the
  last stage's backward warm-up.
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
        ev.append(
            _x(
                "Kernel",
                "volta_sgemm_128x64_nn",
                0,
                "stream 7",
                base + 1_000,
                6_000,
                correlation=corr,
                device=0,
                stream=7,
            )
        )
        ev.append(_x("Runtime", "cudaLaunchKernel", pid, tid, base + 400, 20, correlation=corr + 1))
        ev.append(
            _x(
                "Kernel",
                "ncclKernel_AllReduce_RING_LL_Sum_float",
                0,
                "stream 21",
                base + 6_000,
                2_000,
                correlation=corr + 1,
                device=0,
                stream=21,
            )
        )
        ev.append(_x("Runtime", "cudaMemcpyAsync", pid, tid, base + 500, 10, correlation=corr + 2))
        ev.append(
            _x(
                "Memcpy",
                "Memcpy HtoD (Pageable -> Device)",
                0,
                "stream 7",
                base + 8_500,
                200,
                correlation=corr + 2,
                device=0,
                stream=7,
                bytes=4096,
            )
        )
        corr += 3
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "traceEvents": ev,
    }


def nccl219_data(rank: int) -> dict[str, Any]:
    pid = tid = 1000 + rank
    base_ns = 1_790_000_000_000_000_000
    ev: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": tid,
            "args": {"name": f"thread {tid} (pt_main_thread)"},
        },
        {
            "ph": "M",
            "name": "process_labels",
            "pid": rank,
            "tid": 0,
            "args": {"labels": f"GPU {rank}"},
        },
    ]
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
        ev.append(
            _x(
                "kernel",
                "sm90_xmma_gemm_bf16bf16_bf16f32",
                rank,
                7,
                k0,
                compute,
                correlation=corr,
                device=rank,
                stream=7,
            )
        )
        ev.append({"ph": "s", "cat": "ac2g", "id": corr, "pid": pid, "tid": tid, "ts": launch})
        ev.append(
            {"ph": "f", "cat": "ac2g", "id": corr, "pid": rank, "tid": 7, "ts": k0, "bp": "e"}
        )
        comm_args = {
            "Collective name": "allreduce",
            "dtype": "BFloat16",
            "In msg nelems": 1 << 20,
            "Out msg nelems": 1 << 20,
            "Group size": 2,
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Seq": s + 1,
            "Comms Id": 77_000 + s,
            "Rank": rank,
        }
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
        ev.append(
            _x(
                "kernel",
                name,
                rank,
                40,
                k0 + compute - 1_000.0,
                2_000.0,
                correlation=corr + 1,
                device=rank,
                stream=40,
                **comm_args,
            )
        )
        corr += 2
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": base_ns,
        "displayTimeUnit": "ms",
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": 2,
            "nccl_version": "2.27.3",
        },
        "deviceProperties": [{"id": rank, "name": "NVIDIA H100 80GB HBM3"}],
        "traceEvents": ev,
    }


def _modern(rank: int, world: int, ev: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": 1_790_000_000_000_000_000,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)],
        "traceEvents": ev,
    }


class _Gpu:
    """Appends a kernel with its launching runtime call (linked by correlation id)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.pid, self.corr = rank, 2000 + rank, 1
        self.ev: list[dict[str, Any]] = [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": self.pid,
                "tid": self.pid,
                "args": {"name": "python3"},
            },
        ]

    def kernel(
        self, name: str, start: float, dur: float, launch: float, stream: int = 7, **args: Any
    ) -> None:
        self.ev.append(
            _x(
                "cuda_runtime",
                "cudaLaunchKernel",
                self.pid,
                self.pid,
                launch,
                2.0,
                correlation=self.corr,
            )
        )
        self.ev.append(
            _x(
                "kernel",
                name,
                self.rank,
                stream,
                start,
                dur,
                correlation=self.corr,
                device=self.rank,
                stream=stream,
                **args,
            )
        )
        self.corr += 1


def straggler_comms_id(rank: int) -> dict[str, Any]:
    g = _Gpu(rank)
    for s in range(4):
        t = 1_000.0 + s * 12_000.0
        g.ev.append(_x("user_annotation", f"ProfilerStep#{s}", g.pid, g.pid, t, 11_900.0))
        compute = 8_000.0 if rank == 1 else 3_000.0
        g.kernel("sm90_gemm", t + 100.0, compute, launch=t + 10.0)
        ready, end = t + 100.0 + compute, t + 100.0 + 8_000.0 + 2_000.0
        args = {
            "Collective name": "allreduce",
            "dtype": "Float",
            "In msg nelems": 4 << 20,
            "Out msg nelems": 4 << 20,
            "Group size": 2,
            "Process Group Name": "0",
            "Seq": s + 1,
            "Comms Id": 9_000_000_000 + s,
        }
        g.kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            ready,
            end - ready,
            launch=t + 20.0,
            stream=40,
            **args,
        )
    return _modern(rank, 2, g.ev)


def pipeline_stage(
    stage: int, p: int = 4, m: int = 4, f: float = 1_000.0, b: float = 2_000.0
) -> dict[str, Any]:
    g = _Gpu(stage)
    t0 = 1_000.0
    g.ev.append(_x("user_annotation", "ProfilerStep#0", g.pid, g.pid, t0, (m + p - 1) * (f + b)))
    free = t0  # when this stage's GPU last finished (a receive kernel spins from then on)

    def recv(start: float, src: int) -> None:
        # NCCL's receive kernel runs from its launch until the data has arrived
        begin = min(free, start - 20.0)
        g.kernel(
            "ncclDevKernel_SendRecv",
            begin,
            start - begin,
            launch=t0 + 1.0,
            stream=40,
            **{"Collective name": "recv", "Src Rank": src},
        )

    for j in range(m):  # forward of micro-batch j on this stage
        start = t0 + (stage + j) * f
        if stage > 0:
            recv(start, stage - 1)
        g.kernel("fwd_gemm", start, f, launch=t0 + 2.0)
        free = start + f
        if stage < p - 1:
            g.kernel(
                "ncclDevKernel_SendRecv",
                start + f,
                20.0,
                launch=t0 + 3.0,
                stream=40,
                **{"Collective name": "send", "Dst Rank": stage + 1},
            )
    back0 = t0 + (p - 1 + m) * f
    for k in range(m):  # backward, last micro-batch first
        start = back0 + (p - 1 - stage + k) * b
        if stage < p - 1:
            recv(start, stage + 1)
        g.kernel("bwd_gemm", start, b, launch=t0 + 5.0)
        free = start + b
        if stage > 0:
            g.kernel(
                "ncclDevKernel_SendRecv",
                start + b,
                20.0,
                launch=t0 + 6.0,
                stream=40,
                **{"Collective name": "send", "Dst Rank": stage - 1},
            )
    return _modern(stage, p, g.ev)


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
        write(HERE / "straggler_comms_id" / f"rank-{r}.json.gz", straggler_comms_id(r))
    for stage in range(4):
        write(HERE / "pipeline_4stage" / f"rank-{stage}.json.gz", pipeline_stage(stage))


if __name__ == "__main__":
    main()
