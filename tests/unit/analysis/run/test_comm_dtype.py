"""Issue 20 item 9: the collectives' element type reaches the analysis, and traffic that is
already 16-bit gets no advice to compress it to 16 bits.

Truth from outside gpudiag: hand-built Kineto traces laid out like PyTorch's (a
``record_param_comms`` range and an NCCL kernel that both carry ``Collective name`` and
``dtype``), whose all-reduces are BFloat16 or Float by construction; and the shared
``mi300x_ddp8_r0_rccl`` trace, whose all-reduces' ``dtype`` is read by a plain loop here.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import gpudiag
from gpudiag.analysis.run.collectives import collective_dtype

PID, TID = 100, 100


def _ddp_trace(dtype: str, steps: int = 6) -> dict[str, Any]:
    """A DDP rank: forward, backward, then an exposed all-reduce of ``dtype`` each step."""
    ev: list[dict[str, Any]] = []
    corr = 0

    def op(name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": PID,
                "tid": TID,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )

    def launch(kernel: str, ts: float, at: float, dur: float, stream: int, **args: Any) -> None:
        nonlocal corr
        corr += 1
        op("cudaLaunchKernel", ts, 0.01, cat="cuda_runtime", correlation=corr)
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": stream,
                "ts": at,
                "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": corr, **args},
            }
        )

    coll = {
        "Collective name": "allreduce",
        "dtype": dtype,
        "In msg nelems": 1 << 22,
        "Out msg nelems": 1 << 22,
        "Group size": 8,
    }
    for s in range(steps):
        t0 = 1000.0 + s * 20_000.0  # µs: a 20 ms step
        op(f"ProfilerStep#{s}", t0, 19_900.0, cat="user_annotation")
        op("aten::mm", t0 + 10, 100.0)
        launch("ampere_sgemm_128x64_nn", t0 + 20, t0 + 100, 4_000.0, 7)
        op("autograd::engine::evaluate_function: MmBackward0", t0 + 4_200, 100.0)
        launch("ampere_sgemm_128x64_tn", t0 + 4_210, t0 + 4_200, 4_000.0, 7)
        op("record_param_comms", t0 + 8_300, 50.0, **coll)
        launch(
            "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
            t0 + 8_310,
            t0 + 8_300,
            10_000.0,
            13,
            **coll,
        )
        op("Optimizer.step#SGD.step", t0 + 18_400, 50.0)
        launch("multi_tensor_apply_kernel", t0 + 18_410, t0 + 18_400, 1_000.0, 7)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
        "traceEvents": ev,
    }


def _analyze(tmp_path: Path, dtype: str) -> Any:
    d = tmp_path / dtype
    d.mkdir()
    (d / "rank-0.json").write_text(json.dumps(_ddp_trace(dtype)))
    return gpudiag.analyze(d, jobs=1, cache=False)


def test_bf16_gradients_get_no_16_bit_compression_advice(tmp_path: Path) -> None:
    diag = _analyze(tmp_path, "BFloat16")
    ev = diag.ranks[0].evidence
    assert ev.comm_dtypes == {"allreduce": {"bf16": 1.0}}
    recs = {r.id: r for r in diag.recommendations}
    assert "comm-overlap" in recs  # the run is a DDP run, comm-bound
    text = " ".join(r.title + " " + r.detail for r in diag.recommendations)
    assert "bf16_compress_hook" not in text and "fp16_compress_hook" not in text
    comp = recs.get("grad-compression")
    assert comp is None or (comp.estimated_gain_ns is None and "already carry bf16" in comp.detail)


def test_fp32_gradients_keep_the_16_bit_hook(tmp_path: Path) -> None:
    diag = _analyze(tmp_path, "Float")
    assert diag.ranks[0].evidence.comm_dtypes == {"allreduce": {"fp32": 1.0}}
    comp = {r.id: r for r in diag.recommendations}["grad-compression"]
    assert "bf16_compress_hook" in comp.detail


def test_kernel_names_give_the_type_when_no_arg_does() -> None:
    assert (
        collective_dtype("", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)")
        == "bf16"
    )
    assert collective_dtype("", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "fp32"
    assert collective_dtype("", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)") == ""
    assert collective_dtype("BFloat16", "ncclDevKernel_Generic") == "bf16"


def test_mi300x_bf16_allreduces_get_no_16_bit_hook(kineto_sets: Path) -> None:
    path = kineto_sets / "mi300x_ddp8_r0_rccl"
    with gzip.open(next(path.glob("*.json.gz"))) as fh:
        ev = json.load(fh)["traceEvents"]
    types = {
        e["args"]["dtype"] for e in ev if e.get("args", {}).get("Collective name") == "allreduce"
    }
    assert types == {"BFloat16"}  # every all-reduce that names its type: bf16
    diag = gpudiag.analyze(path, jobs=1, cache=False)
    assert diag.ranks[0].evidence.comm_dtypes["allreduce"] == {"bf16": 1.0}
    text = " ".join(r.title + " " + r.detail for r in diag.recommendations)
    assert "bf16_compress_hook" not in text and "comm-overlap" in {
        r.id for r in diag.recommendations
    }
