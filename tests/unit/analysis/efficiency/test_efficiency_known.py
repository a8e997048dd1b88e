"""Compute and communication efficiency on hand-built traces whose answers are known.

Truth from outside gpudiag: Kineto traces laid out as PyTorch writes them (a host operator
with its recorded ``Input Dims``/``Input type``/``Concrete Inputs``, the runtime call that
launched a kernel inside it, the kernel), with shapes and durations chosen here, and the
FLOPs, rates and bus bandwidth computed by hand in this file from those numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import gpudiag
from gpudiag.analysis.efficiency.flops import op_work
from gpudiag.analysis.efficiency.peaks import peak_of

PID, TID = 100, 100
STEP_US = 20_000.0


class _Trace:
    def __init__(self, rank: int, device: str, world: int) -> None:
        self.ev: list[dict[str, Any]] = []
        self.corr = 0
        self.rank, self.device, self.world = rank, device, world

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        self.ev.append(
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

    def launch(
        self, kernel: str, ts: float, at: float, dur: float, stream: int = 7, **args: Any
    ) -> None:
        self.corr += 1
        self.op("cudaLaunchKernel", ts, 0.01, cat="cuda_runtime", correlation=self.corr)
        self.ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": stream,
                "ts": at,
                "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": self.corr, **args},
            }
        )

    def doc(self) -> dict[str, Any]:
        gpus = [{"id": i, "name": self.device} for i in range(self.world)]
        return {
            "schemaVersion": 1,
            "deviceProperties": gpus,
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
            "traceEvents": self.ev,
        }


MM = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float", "float"]}
CONV = {
    "Input Dims": [[32, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []],
    "Input type": [
        "c10::BFloat16",
        "c10::BFloat16",
        "",
        "ScalarList",
        "ScalarList",
        "ScalarList",
        "Scalar",
        "ScalarList",
        "Scalar",
    ],
    "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"],
}
ADD = {"Input Dims": [[4096, 4096], [4096, 4096], []], "Input type": ["float", "float", "Scalar"]}
MM_FLOPS = 2 * 4096**3  # 2·M·K·N
CONV_FLOPS = 2 * 32 * 128 * (28 * 28) * 64 * 9  # stride 2, pad 1: 56 → 28
ADD_BYTES = 3 * 4096 * 4096 * 4  # two inputs read, one output written
MM_US, CONV_US, ADD_US = 16_000.0, 500.0, 200.0


def _compute_trace(steps: int = 5) -> dict[str, Any]:
    t = _Trace(0, "NVIDIA A100-SXM4-80GB", 1)
    for s in range(steps):
        t0 = 1_000.0 + s * STEP_US
        t.op(f"ProfilerStep#{s}", t0, STEP_US - 100, cat="user_annotation")
        # aten::linear would be outermost; here the matmul is an mm inside a module range
        t.op("aten::mm", t0 + 10, 100.0, **MM)
        t.launch("ampere_sgemm_128x64_nn", t0 + 20, t0 + 100, MM_US)
        t.op("aten::conv2d", t0 + 200, 60.0)
        t.op("aten::convolution", t0 + 205, 50.0, **CONV)
        t.launch("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32", t0 + 210, t0 + 16_200, CONV_US)
        t.op("aten::add_", t0 + 300, 20.0, **ADD)
        t.launch("vectorized_elementwise_kernel", t0 + 305, t0 + 16_800, ADD_US)
    return t.doc()


@pytest.fixture(scope="module")
def compute(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("compute")
    (d / "rank-0.json").write_text(json.dumps(_compute_trace()))
    return gpudiag.analyze(d, jobs=1, cache=False)


def test_flops_bytes_and_rates_equal_the_hand_computed_figures(compute: Any) -> None:
    eff = compute.efficiency
    fam = {f.family: f for f in eff.families}
    steps = eff.steps  # the analysed steps (a last step the capture cut is left out)
    assert steps in (4, 5)
    assert fam["GEMM"].flops == pytest.approx(MM_FLOPS * steps)
    assert fam["GEMM"].tflops == pytest.approx(MM_FLOPS / (MM_US * 1e-6) / 1e12)  # 8.59
    assert fam["GEMM"].path == "fp32"
    assert fam["GEMM"].peak_share == pytest.approx(8.589934592 / 19.5, rel=1e-6)
    assert fam["convolution"].flops == pytest.approx(CONV_FLOPS * steps)
    assert fam["convolution"].tflops == pytest.approx(CONV_FLOPS / (CONV_US * 1e-6) / 1e12)
    assert fam["convolution"].path == "bf16"
    assert fam["convolution"].peak == 312
    assert fam["elementwise"].bytes == pytest.approx(ADD_BYTES * steps)
    assert fam["elementwise"].gbps == pytest.approx(ADD_BYTES / (ADD_US * 1e-6) / 1e9)
    assert fam["elementwise"].peak == 2039
    # model figure: FLOPs of one step over the median step
    per_step = MM_FLOPS + CONV_FLOPS
    assert eff.flops_per_step == pytest.approx(per_step)
    step_s = compute.run.step_time_ns_median * 1e-9  # the headline's median step
    assert step_s == pytest.approx(STEP_US * 1e-6, rel=0.01)
    assert eff.model_tflops == pytest.approx(per_step / step_s / 1e12, rel=1e-6)
    assert eff.mfu == pytest.approx(eff.model_tflops / 312, rel=1e-6)
    assert eff.coverage == pytest.approx(1.0)


def test_the_compute_held_verdict_says_its_share_of_peak(compute: Any) -> None:
    head = compute.verdict.headline
    assert compute.verdict.bottleneck == "none", head
    assert "GEMM fp32 at 44% of its peak" in head  # 8.59 of 19.5 TFLOP/s
    assert "bf16 would offer 16.0× that peak" in head  # 312 / 19.5


def test_an_operator_inside_another_counts_once() -> None:
    lin = {
        "Input Dims": [[8, 512, 1024], [4096, 1024], [4096]],
        "Input type": ["c10::BFloat16"] * 3,
    }
    w = op_work(
        "aten::linear",
        "\n".join([json.dumps(lin["Input Dims"]), json.dumps(lin["Input type"]), ""]),
    )
    assert w is not None and w.flops == 2 * 8 * 512 * 1024 * 4096 and w.path == "bf16"
    # a convolution without concrete inputs is not modelled (its stride is unknown)
    assert (
        op_work(
            "aten::convolution",
            json.dumps(CONV["Input Dims"]) + "\n" + json.dumps(CONV["Input type"]) + "\n",
        )
        is None
    )


def _comm_trace(rank: int) -> dict[str, Any]:
    """Two RTX 4090s, a 128 MiB fp32 reduce-scatter of 13.7 ms each step, no NCCL sizes."""
    t = _Trace(rank, "NVIDIA GeForce RTX 4090", 2)
    for s in range(5):
        t0 = 1_000.0 + s * STEP_US
        t.op(f"ProfilerStep#{s}", t0, STEP_US - 100, cat="user_annotation")
        t.op(
            "c10d::reduce_scatter_tensor",
            t0 + 10,
            80.0,
            **{"Input Dims": [[2048, 8, 1024], [4096, 8, 1024]], "Input type": ["float", "float"]},
        )
        t.op(
            "record_param_comms",
            t0 + 20,
            50.0,
            **{"Collective name": "reduce_scatter", "Comms Id": 1000 + s, "Group size": 2},
        )
        t.launch(
            "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
            t0 + 30,
            t0 + 100,
            13_700.0,
            stream=13,
            **{"Collective name": "reduce_scatter", "Comms Id": 1000 + s, "Group size": 2},
        )
    return t.doc()


def test_collective_sizes_come_from_the_operators_inputs(tmp_path: Path) -> None:
    for r in (0, 1):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(_comm_trace(r)))
    d = gpudiag.analyze(tmp_path, jobs=1, cache=False)
    rows = [r for r in d.collectives.by_type if r.type == "reducescatter"]
    assert len(rows) == 1, d.collectives.by_type
    row = rows[0]
    size = 4096 * 8 * 1024 * 4  # 128 MiB: the input, nccl-tests' size of a reduce-scatter
    assert row.bytes_median == size
    algbw = size / 13.7e6  # bytes per ns = GB/s
    assert row.algbw_gbps == pytest.approx(algbw)
    assert row.busbw_gbps == pytest.approx(algbw * 1 / 2)  # (n−1)/n, n = 2: ≈ 4.9 GB/s
    assert row.peak_gbps == pytest.approx(31.5) and row.link == "PCIe 4.0 x16"
    assert row.efficiency == pytest.approx(algbw / 2 / 31.5)
    assert "peer-to-peer" in (row.likely_cause or "")
    low = [f for f in d.findings if f.kind == "low_bandwidth"]
    assert low and "PCIe 4.0 x16 peak; likely a consumer card" in low[0].message


def test_the_peak_table_knows_the_parts_traces_name() -> None:
    for name, model in [
        ("NVIDIA A100-PG509-200", "A100 SXM4"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM5"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ]:
        p = peak_of(name)
        assert p is not None and p.model == model, name
    assert peak_of("AMD Radeon Graphics") is None
