"""Issue 29, items 3–5, on hand-built Kineto traces whose answer is known by construction.

* communication by what launched it: a kernel with no communication name launched inside
  ``nccl:all_reduce`` is communication, the same kernel launched elsewhere is compute;
* a filtered trace (half the launch calls lost their kernels) is withheld, not judged;
* blame follows the GPU: a synchronisation that blocks while the GPU computes is the GPU's
  time — only its GPU-idle tail is the host's, and it names no cause.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from make_host_causes import A100, Rank

import gpudiag

STEP_US = 10_000.0
STEPS = 4


def _comm_case(kernel: str, drop_every_other: bool = False) -> dict[str, Any]:
    """Per 10 ms step: 4 ms of GEMMs, then a 3 ms exchange kernel launched inside
    ``nccl:all_reduce`` (stream 20), then 1 ms of the same kernel outside it (stream 7)."""
    g = Rank()
    t = 1_000.0
    for s in range(STEPS):
        g.host("user_annotation", f"ProfilerStep#{s}", t, STEP_US - 10.0)
        for k in range(40):  # 40 GEMMs of 100 µs: 4 ms
            g.launch(t + 5.0 + 2.0 * k, "ampere_sgemm_128x64_nn", t + 100.0 + 100.0 * k, 100.0)
        g.host("cpu_op", "nccl:all_reduce", t + 4_150.0, 300.0)
        g.launch(t + 4_200.0, kernel, t + 4_300.0, 3_000.0, stream=20)
        g.launch(t + 7_400.0, kernel, t + 7_500.0, 1_000.0)
        t += STEP_US
    doc = g.doc(A100)
    if drop_every_other:
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        gone = {id(e) for e in kernels[::2]}
        doc["traceEvents"] = [e for e in doc["traceEvents"] if id(e) not in gone]
    return doc


def _write(tmp: Path, name: str, doc: dict[str, Any]) -> Path:
    p = tmp / name
    p.mkdir()
    (p / "rank-0.json").write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize(
    ("kernel", "compute", "comm"),
    [
        # a kernel named NCCL is communication wherever it was launched (names: the fallback)
        ("ncclDevKernel_AllReduce_Sum_f32", 0.4, 0.4),
        # a kernel with no such name: 4 ms of GEMMs + the 1 ms launched outside the
        # collective are compute, the 3 ms launched inside it communication
        ("fused_exchange_kernel", 0.5, 0.3),
    ],
)
def test_communication_is_what_a_collective_launched(
    tmp_path: Path, kernel: str, compute: float, comm: float
) -> None:
    d = gpudiag.analyze(_write(tmp_path, "comm", _comm_case(kernel)), jobs=1)
    r = d.ranks[0]
    assert r.shares.compute == pytest.approx(compute, abs=0.01)
    assert r.shares.comm_wait == pytest.approx(comm, abs=0.01)
    assert d.verdict is not None and d.verdict.bottleneck == "communication"


def test_launch_calls_without_kernels_withhold_the_verdict(tmp_path: Path) -> None:
    doc = _comm_case("fused_exchange_kernel", drop_every_other=True)
    d = gpudiag.analyze(_write(tmp_path, "filtered", doc), jobs=1)
    assert d.verdict is not None and d.verdict.bottleneck == "unknown"
    assert "filtered" in d.verdict.headline
    assert "84 of 168 kernel launch calls have no GPU op" in d.verdict.headline
    assert all(r.estimated_gain_ns is None for r in d.recommendations)


def _sync_case() -> dict[str, Any]:
    """Per 25 ms step: a 14 ms kernel from 1 ms; ``aten::item`` → ``cudaStreamSynchronize``
    from 1 ms to 15.2 ms (the GPU busy all but its last 0.2 ms); Python to the end."""
    g = Rank()
    t = 1_000.0
    for s in range(STEPS):
        g.host("user_annotation", f"ProfilerStep#{s}", t, 25_000.0 - 10.0)
        g.launch(t + 500.0, "ampere_sgemm_128x64_nn", t + 1_000.0, 14_000.0)
        g.host("cpu_op", "aten::item", t + 990.0, 14_220.0)
        g.host("cuda_runtime", "cudaStreamSynchronize", t + 1_000.0, 14_200.0)
        t += 25_000.0
    return g.doc(A100)


def test_a_sync_while_the_gpu_computes_is_gpu_time(tmp_path: Path) -> None:
    d = gpudiag.analyze(_write(tmp_path, "sync", _sync_case()), jobs=1)
    sync = d.ranks[0].evidence.host_api["sync"]
    assert sync["ns_per_step"] == [200_000] * STEPS  # only the GPU-idle 0.2 ms is the host's
    assert sync["gpu_busy_ns"] == 14_000_000 * STEPS
    host = [f for f in d.findings if f.kind == "host_bound"]
    assert host, "10.8 ms of 25 ms with the GPU idle is host time"
    assert host[0].metrics.cause.kind != "sync"
    assert not [r for r in d.recommendations if r.id == "host-sync"]


def _per_element_case(pytorch: bool) -> dict[str, Any]:
    """Per step: a 5 ms kernel, then a loop reading 4,096 values of 4 B to the host, one
    blocking ``cudaMemcpyAsync`` each (10 µs call, 2 µs copy), the GPU idle meanwhile."""
    g = Rank()
    t = 1_000.0
    for s in range(3):
        step = f"ProfilerStep#{s}" if pytorch else f"solve iteration {s}"  # C: an NVTX range
        g.host("user_annotation", step, t, 50_000.0 - 10.0)
        g.launch(t + 10.0, "ampere_sgemm_128x64_nn", t + 50.0, 5_000.0)
        h = t + 5_100.0
        for _ in range(4_096):
            if pytorch:
                g.host("cpu_op", "aten::_local_scalar_dense", h - 1.0, 10.5)
            g.launch(
                h,
                "Memcpy DtoH (Device -> Pageable)",
                h + 4.0,
                2.0,
                api="cudaMemcpyAsync",
                cat="gpu_memcpy",
                bytes=4,
            )
            g.ev[-2]["dur"] = 10.0  # the call returns once the copy is done
            h += 10.5
        t += 50_000.0
    return g.doc(A100)


@pytest.mark.parametrize("pytorch", [True, False])
def test_a_per_element_copy_loop_is_told_to_vectorise(tmp_path: Path, pytorch: bool) -> None:
    marker = None if pytorch else r"^solve iteration (\d+)$"
    d = gpudiag.analyze(
        _write(tmp_path, "loop", _per_element_case(pytorch)), jobs=1, step_marker=marker
    )
    rec = next(r for r in d.recommendations if r.id == "blocking-copies")
    assert "4,096 copies of 4 B a step" in rec.detail
    assert "pin" not in rec.title.lower()
    if pytorch:
        assert "vectorise" in rec.detail and ".item()" in rec.detail
    else:  # a C/CUDA program gets no PyTorch advice
        assert "one cudaMemcpy" in rec.detail and "torch" not in rec.detail.lower()
