"""Hand-built Kineto traces of issue 20's host-side causes, whose answer is known by construction.

Each case follows the 2024+ Kineto layout of the shared traces (``baseTimeNanoseconds``,
float ``ts`` in µs relative to it, ``cuda_runtime``/``cuda_driver`` calls linked to their
GPU work by ``correlation``, ``ProfilerStep#N`` as ``user_annotation`` on the training
thread, ``deviceProperties`` with ``computeMajor``/``computeMinor``/``numSms``) and is
shaped like the real trace the issue describes:

* ``allocator_rocm`` — an MI300X run without the caching allocator: 8 steps; steps 0–3 run
  20 kernels of 400 µs (8 ms) in 10 ms; from step 4 on each step first spends 40 ms in
  ``hipFree`` and 40 ms in ``hipMalloc`` on the training thread (GPU idle), then the
  same kernels: 90 ms, ×9 from step 4.
* ``blocking_copy_decode`` — five decode steps of an inference engine (H100, names as
  vLLM's: ``execute_context_…_generation_…``): 20 kernels of 500 µs each; in step 3 an
  ``aten::copy_`` to pageable host memory blocks in ``cudaMemcpyAsync`` for 463 ms (the
  GPU copy itself takes 3 ms).
* ``graphs_launched`` — six steps (H100) that replay one CUDA graph (``cudaGraphLaunch``,
  50 kernels of 8 µs) and launch 100 more kernels of 10 µs eagerly, one every 60 µs:
  launch-bound, and graphs are already in use.
* ``jit_compile`` — one 648 ms step (H100) whose training thread spends 346 ms in
  ``cuModuleLoadData`` (kernels compiled at run time, as NVRTC/nvFuser do) before 200
  kernels of 1 ms.
* ``sync_straggler`` — four ranks (A100) of data-parallel steps: every rank computes 4 ms,
  then all-reduces (NCCL kernel, 1 ms of transfer) and reads the loss
  (``aten::item`` → ``cudaStreamSynchronize``); rank 2's host spends 6 ms in Python work
  before it launches its step, so ranks 0, 1 and 3 sit in ``cudaStreamSynchronize`` while
  their all-reduce waits for rank 2. The straggler is rank 2.
* ``eager_autograd`` — five steps of 30 ms (A100) shaped like ``a100x2_r0_pgcfg``: in
  forward the training thread runs 40 operators of 300 µs, 50 µs apart; in backward it
  waits in ``loss.backward()`` outside any operator while its autograd thread
  (``pt_autograd_0``) runs 40 ``autograd::engine::evaluate_function`` operators of 300 µs,
  50 µs apart; then a 1.7 ms ``Optimizer.step#SGD.step``. Every operator launches kernels
  of 16 µs (85 a step, 350 µs apart): the training thread alone is outside operators 54%
  of each step, but some host thread is inside one for 25.7 ms of each 30 ms step, the GPU
  idle for 24.34 ms of it — eager operator overhead, not Python between operators.
* ``python_gaps`` — the same five steps with no autograd thread: 60 operators of 100 µs,
  400 µs apart, on the training thread alone, each launching one 16 µs kernel: no thread
  is inside an operator 24 ms of each 30 ms step — Python between operators.
* ``decode_python_graph`` — six decode steps (H100) of an inference engine that replays a
  CUDA graph (issue 29): each 30.49 ms step opens ``engine.py(210): step``
  (``python_function``), in it ``model.py(88): forward`` whose ``model.py(95):
  prepare_inputs`` runs one 200 µs ``aten::to``, then 1,207 ``dict.__getitem__`` calls of
  20 µs, 20.5 µs apart (24.14 ms of their own a step), then ``cuda_graphs.py(40): replay``
  calls ``cudaGraphLaunch``, whose graph runs one 5 ms kernel; the GPU is idle until then.
  ``decode_python_graph_stripped``: the same trace with its ``python_function`` events
  dropped.
* ``sync_waits_for_gpu`` — six steps (A100); each launches GEMM kernels and ends in
  ``aten::item`` → ``cudaStreamSynchronize`` until they finish; steps 2 and 4 run 12
  GEMMs of 2 ms instead of 6 (24 ms of compute instead of 12): the synchronisation grows
  with the GPU work it waits for, which is what makes the slow steps slow.
* ``legacy_optimizer`` — a 2021 trace (capitalised categories, no ``ProfilerStep``): six
  iterations marked only by ``Optimizer.step#SGD.step`` operators; iteration 0 takes
  4.5 s (warm-up), the others 100 ms of which 40 ms in ``enumerate(DataLoader)…``
  with the GPU idle: data-bound 40%.

``python tests/accuracy/make_host_causes.py OUT_DIR`` writes every case; the tests build
them in a temporary directory.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

BASE_NS = 1_790_000_000_000_000_000
H100 = {"name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "numSms": 108}
MI300X = {"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "numSms": 304}


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


class Rank:
    """One rank's events: host calls on the training thread, GPU work linked to them."""

    def __init__(self, rank: int = 0, hip: bool = False) -> None:
        self.rank, self.pid, self.corr, self.hip = rank, 3000 + rank, 1, hip
        self.ev: list[dict[str, Any]] = [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": self.pid,
                "tid": self.pid,
                "args": {"name": "python3"},
            },
        ]

    def host(self, cat: str, name: str, ts: float, dur: float, **args: Any) -> None:
        self.ev.append(_x(cat, name, self.pid, self.pid, ts, dur, **args))

    def launch(
        self,
        at: float,
        name: str,
        start: float,
        dur: float,
        stream: int = 7,
        api: str = "",
        cat: str = "kernel",
        **args: Any,
    ) -> None:
        api = api or ("hipLaunchKernel" if self.hip else "cudaLaunchKernel")
        self.host("cuda_runtime", api, at, 3.0, correlation=self.corr)
        self.ev.append(
            _x(
                cat,
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

    def doc(self, device: dict[str, Any], world: int = 1) -> dict[str, Any]:
        dist = {"backend": "nccl", "rank": self.rank, "world_size": world}
        return {
            "schemaVersion": 1,
            "baseTimeNanoseconds": BASE_NS,
            "distributedInfo": dist,
            "deviceProperties": [dict(device, id=i) for i in range(max(world, 1))],
            "traceEvents": self.ev,
        }


def allocator_rocm() -> dict[str, Any]:
    g = Rank(hip=True)
    t = 1_000.0
    for s in range(8):
        dur = 10_000.0 if s < 4 else 90_000.0
        g.host("user_annotation", f"ProfilerStep#{s}", t, dur - 10.0)
        h = t + 10.0
        if s >= 4:
            g.host("cuda_runtime", "hipFree", h, 40_000.0)
            g.host("cuda_runtime", "hipMalloc", h + 40_000.0, 40_000.0)
            h += 80_000.0
        for k in range(20):
            g.launch(h + 5.0 * k, "Cijk_Ailk_Bljk_SB_MT64x16x32", h + 100.0 + 400.0 * k, 400.0)
        t += dur
    return g.doc(MI300X)


def blocking_copy_decode() -> dict[str, Any]:
    g = Rank()
    t = 1_000.0
    for s in range(5):
        dur = 11_000.0 + (463_000.0 if s == 3 else 0.0)
        g.host("user_annotation", f"ProfilerStep#{s}", t, dur - 10.0)
        g.host(
            "user_annotation", f"execute_context_0(1_128)_generation_{s}(0)", t + 5.0, dur - 20.0
        )
        for k in range(20):
            g.launch(
                t + 10.0 + 5.0 * k,
                "vllm::paged_attention_v2_kernel<__nv_bfloat16>",
                t + 200.0 + 500.0 * k,
                500.0,
            )
        if s == 3:
            c0 = t + 10_300.0
            g.host("cpu_op", "aten::copy_", c0, 463_100.0)
            g.launch(
                c0 + 50.0,
                "Memcpy DtoH (Device -> Pageable)",
                c0 + 100.0,
                3_000.0,
                api="cudaMemcpyAsync",
                cat="gpu_memcpy",
                bytes=1 << 30,
            )
            g.ev[-2]["dur"] = 463_000.0  # the call blocks until the pageable copy is staged
        t += dur
    return g.doc(H100)


def graphs_launched() -> dict[str, Any]:
    g = Rank()
    t = 1_000.0
    for s in range(6):
        g.host("user_annotation", f"ProfilerStep#{s}", t, 6_500.0)
        g.launch(t + 10.0, "graph_gemm_kernel", t + 50.0, 8.0, api="cudaGraphLaunch")
        for k in range(49):  # the rest of the graph's kernels (one launch replays them)
            g.ev.append(
                _x(
                    "kernel",
                    "graph_elementwise_kernel",
                    0,
                    7,
                    t + 60.0 + 9.0 * k,
                    8.0,
                    correlation=g.corr - 1,
                    device=0,
                    stream=7,
                )
            )
        for k in range(100):
            at = t + 600.0 + 60.0 * k
            g.launch(at, "void at::native::vectorized_elementwise_kernel<4>", at + 20.0, 10.0)
        t += 6_600.0
    return g.doc(H100)


def jit_compile() -> dict[str, Any]:
    g = Rank()
    t = 1_000.0
    g.host("user_annotation", "ProfilerStep#0", t, 648_000.0)
    g.host("cuda_driver", "cuModuleLoadData", t + 100.0, 346_000.0)
    h = t + 346_200.0
    for k in range(200):
        g.launch(h + 10.0 * k, "nvfuser_pointwise_f0_c1_r0_g0", h + 100.0 + 1_000.0 * k, 1_000.0)
    g.host("cpu_op", "aten::item", t + 547_000.0, 100_500.0)
    g.host("cuda_runtime", "cudaStreamSynchronize", t + 547_100.0, 100_000.0)
    return g.doc(H100)


def sync_straggler(rank: int) -> dict[str, Any]:
    g = Rank(rank)
    late = 6_000.0 if rank == 2 else 0.0
    t = 1_000.0
    for s in range(6):
        g.host("user_annotation", f"ProfilerStep#{s}", t, 11_900.0)
        h = t + 10.0
        if late:
            g.host("python_function", "train.py(88): preprocess", h, late)
            h += late
        g.launch(h, "sm80_xmma_gemm_f32f32_tf32f32_f32_nn", h + 50.0, 4_000.0)
        ready = h + 4_050.0
        last = t + 10.0 + 6_000.0 + 4_050.0  # rank 2's all-reduce is ready then
        args = {
            "Collective name": "allreduce",
            "dtype": "Float",
            "In msg nelems": 1 << 20,
            "Out msg nelems": 1 << 20,
            "Group size": 4,
            "Process Group Name": "0",
            "Seq": s + 1,
            "Comms Id": 5_000_000 + s,
        }
        g.launch(
            h + 20.0,
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            ready,
            last + 1_000.0 - ready,
            stream=40,
            **args,
        )
        g.host("cpu_op", "aten::item", h + 40.0, last + 1_000.0 - h - 30.0)
        g.host("cuda_runtime", "cudaStreamSynchronize", h + 50.0, last + 1_000.0 - h - 50.0)
        t += 12_000.0
    return g.doc(A100, world=4)


def _op_with_kernels(g: Rank, tid: int, name: str, at: float, dur: float, n: int) -> None:
    """An operator on thread ``tid`` launching ``n`` kernels of 16 µs near its end."""
    g.ev.append(_x("cpu_op", name, g.pid, tid, at, dur))
    for k in range(n):
        call = at + dur - 50.0 - 20.0 * (n - k)
        g.ev.append(
            _x("cuda_runtime", "cudaLaunchKernel", g.pid, tid, call, 3.0, correlation=g.corr)
        )
        g.ev.append(
            _x(
                "kernel",
                "void at::native::vectorized_elementwise_kernel<4>",
                0,
                7,
                call + 10.0,
                16.0,
                correlation=g.corr,
                device=0,
                stream=7,
            )
        )
        g.corr += 1


def eager_autograd() -> dict[str, Any]:
    g = Rank()
    auto = g.pid + 1
    g.ev.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": g.pid,
            "tid": auto,
            "args": {"name": "pt_autograd_0"},
        }
    )
    t = 1_000.0
    for s in range(5):
        g.host("user_annotation", f"ProfilerStep#{s}", t, 30_000.0)
        for k in range(40):
            _op_with_kernels(g, g.pid, "aten::convolution", t + 100.0 + 350.0 * k, 300.0, 1)
        for k in range(40):
            _op_with_kernels(
                g,
                auto,
                "autograd::engine::evaluate_function: ConvolutionBackward0",
                t + 14_100.0 + 350.0 * k,
                300.0,
                1,
            )
        _op_with_kernels(g, g.pid, "Optimizer.step#SGD.step", t + 28_100.0, 1_700.0, 5)
        t += 30_000.0
    return g.doc(A100)


def python_gaps() -> dict[str, Any]:
    g = Rank()
    t = 1_000.0
    for s in range(5):
        g.host("user_annotation", f"ProfilerStep#{s}", t, 30_000.0)
        for k in range(60):
            _op_with_kernels(g, g.pid, "aten::add", t + 100.0 + 500.0 * k, 100.0, 1)
        t += 30_000.0
    return g.doc(A100)


def sync_waits_for_gpu() -> dict[str, Any]:
    g = Rank()
    t = 1_000.0
    for s in range(6):
        n = 12 if s in (2, 4) else 6
        g.host("user_annotation", f"ProfilerStep#{s}", t, 2_000.0 * n + 1_000.0)
        for k in range(n):
            g.launch(t + 10.0 + 5.0 * k, "ampere_sgemm_128x64_nn", t + 100.0 + 2_000.0 * k, 2_000.0)
        g.host("cpu_op", "aten::item", t + 200.0, 2_000.0 * n - 50.0)
        g.host("cuda_runtime", "cudaStreamSynchronize", t + 250.0, 2_000.0 * n - 150.0)
        t += 2_000.0 * n + 1_000.0
    return g.doc(A100)


# decode_python_graph's construction (µs from the step's start), the tests' known answer
DECODE_STEP_US = 30_490.0
DECODE_LOOKUPS = 1_207
DECODE_LOOKUP_US = 20.0
DECODE_OP_US = 200.0
DECODE_GRAPH_AT_US = 25_220.0
DECODE_KERNEL_US = 5_000.0


def decode_python_graph(stripped: bool = False) -> dict[str, Any]:
    g = Rank()
    t = 1_000.0

    def py(name: str, ts: float, dur: float) -> None:
        if not stripped:
            g.host("python_function", name, ts, dur)

    for s in range(6):
        g.host("user_annotation", f"ProfilerStep#{s}", t, DECODE_STEP_US)
        py("engine.py(210): step", t + 10.0, 30_290.0)
        py("model.py(88): forward", t + 50.0, 25_150.0)
        py("model.py(95): prepare_inputs", t + 60.0, 300.0)
        g.host("cpu_op", "aten::to", t + 100.0, DECODE_OP_US)
        for k in range(DECODE_LOOKUPS):
            py("dict.__getitem__", t + 400.0 + 20.5 * k, DECODE_LOOKUP_US)
        py("cuda_graphs.py(40): replay", t + 25_210.0, 30.0)
        g.launch(
            t + DECODE_GRAPH_AT_US,
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
            t + 25_240.0,
            DECODE_KERNEL_US,
            api="cudaGraphLaunch",
        )
        g.ev[-2]["dur"] = 10.0
        t += DECODE_STEP_US + 10.0
    return g.doc(H100)


def legacy_optimizer() -> dict[str, Any]:
    pid, t0 = 4242, 1_620_000_000_000_000
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": "python3"}},
    ]
    dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    corr, t = 100, t0
    for s in range(6):
        dur = 4_500_000 if s == 0 else 100_000
        ev.append(_x("Operator", dl, pid, pid, t + 10, 40_000))
        h = t + 40_100
        ev.append(_x("Runtime", "cudaLaunchKernel", pid, pid, h, 10, correlation=corr))
        ev.append(
            _x(
                "Kernel",
                "volta_sgemm_128x64_nn",
                0,
                "stream 7",
                h + 100,
                dur - 40_300 - 100,
                correlation=corr,
                device=0,
                stream=7,
            )
        )
        ev.append(_x("Operator", "Optimizer.step#SGD.step", pid, pid, t + dur - 150, 100))
        corr += 1
        t += dur
    return {
        "schemaVersion": 1,
        "traceEvents": ev,
        "deviceProperties": [
            {"id": 0, "name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0}
        ],
    }


CASES = {
    "allocator_rocm": allocator_rocm,
    "blocking_copy_decode": blocking_copy_decode,
    "graphs_launched": graphs_launched,
    "jit_compile": jit_compile,
    "legacy_optimizer": legacy_optimizer,
    "eager_autograd": eager_autograd,
    "python_gaps": python_gaps,
    "decode_python_graph": decode_python_graph,
    "decode_python_graph_stripped": lambda: decode_python_graph(stripped=True),
    "sync_waits_for_gpu": sync_waits_for_gpu,
}


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0))
    return path


def build(out: Path) -> Path:
    """Every case under ``out``: ``<case>/rank-0.json.gz``; ``sync_straggler`` has four ranks."""
    for name, make in CASES.items():
        write(out / name / "rank-0.json.gz", make())
    for r in range(4):
        write(out / "sync_straggler" / f"rank-{r}.json.gz", sync_straggler(r))
    return out


if __name__ == "__main__":
    build(Path(sys.argv[1]))
