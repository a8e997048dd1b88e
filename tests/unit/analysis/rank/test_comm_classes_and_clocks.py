"""One classification of communication, GPU/CPU clock checks and evidence limits, on small inputs."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from testpaths import ACCURACY

from gpudiag.analysis.rank.evidence import QUALIFY, WITHHOLD, limits
from gpudiag.analysis.rank.kernels import family
from gpudiag.config import DEFAULT_COMM_HOST_RE, DEFAULT_COMM_KERNEL_RE, EvidenceRules
from gpudiag.traces.core.common import RawColumns
from gpudiag.traces.core.rank_builder import check_clocks
from gpudiag.traces.schema import Kind, RankMeta

sys.path.insert(0, str(ACCURACY))
import reference

COMM = [
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclSymDevKernel_AllReduce_AGxLLMC_R_sum_bf16",
    "ncclDevKernel_Generic",  # RCCL
    "void ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "mscclKernel_Sum_float_LL128",
    "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)",
    "void c10d::symmetric_memory::multimem_all_gather_kernel<16>(char*, unsigned long)",
    "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>(float**)",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*)",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)",
    "void deep_ep::internode::combine<true, 2, 8>(int4*)",
    "void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)",
    "void deep_ep::intranode::cached_notify_combine<8>(void**, int*)",
    "nvshmemi_barrier_all_kernel",
]
NOT_COMM = [
    "void moe::dev::finalize::combineKernel<float, 4>(moe::dev::finalize::KernelParams)",
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)",
    "ampere_sgemm_128x64_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
    "combine_kernel",
    "dispatch_kernel",
]


@pytest.mark.parametrize("name", COMM)
def test_communication_kernels_of_every_library(name):
    assert re.search(DEFAULT_COMM_KERNEL_RE, name)
    assert reference.is_comm_kernel(name)  # the independent reader agrees
    assert family(name, Kind.COMM) == "communication"


@pytest.mark.parametrize("name", NOT_COMM)
def test_kernels_named_like_communication_are_compute(name):
    assert not re.search(DEFAULT_COMM_KERNEL_RE, name)
    assert not reference.is_comm_kernel(name)
    # the kernel families never call a compute kernel communication by its name
    assert family(name, Kind.COMPUTE) != "communication"


@pytest.mark.parametrize(
    ("name", "comm"),
    [
        ("MPI", True),
        ("MPI_Sendrecv", True),
        ("MPI_Allreduce", True),
        ("PMPI_Wait", True),
        ("MPI_Comm_split", True),
        ("MPI_Init", False),
        ("MPI_Init_thread", False),
        ("MPI_Finalize", False),
        ("MPI_Comm_rank", False),
        ("MPI Rank 3", False),
        ("gloo:all_reduce", True),
        ("nccl:all_reduce", True),
        ("Jacobi solve", False),
    ],
)
def test_mpi_and_host_collectives(name, comm):
    assert bool(re.search(DEFAULT_COMM_HOST_RE, name)) == comm


def _cols(gpu_start, gpu_dur, launch, call_dur, names):
    """One GPU op per launch call: kernel i on gpu:0:7 launched by runtime call i."""
    n = len(gpu_start)
    start = np.array(list(gpu_start) + list(launch), np.int64)
    end = np.array(
        [s + d for s, d in zip(gpu_start, gpu_dur, strict=True)]
        + [s + d for s, d in zip(launch, call_dur, strict=True)],
        np.int64,
    )
    kind = np.array([Kind.COMPUTE] * n + [Kind.RUNTIME] * n, np.int64)
    lane = np.array([0] * n + [1] * n, np.int64)
    all_names = ["Memcpy DtoH (Device -> Pageable)", *sorted(set(names))]
    name = np.array([0] * n + [all_names.index(x) for x in names], np.int64)
    launch_ns = np.array(list(launch) + [-1] * n, np.int64)
    return RawColumns(
        start,
        end,
        kind,
        lane,
        name,
        ["gpu:0:7", "cpu:1"],
        all_names,
        launch_ns,
        np.full(2 * n, -1, np.int64),
    )


MS = 1_000_000


def test_kernels_that_start_before_their_launch_are_shifted_back():
    # true latency 10 µs, GPU clock 129 ms behind the host's
    launch = [i * 10 * MS for i in range(20)]
    cols = _cols(
        [t + 10_000 - 129 * MS for t in launch],
        [MS] * 20,
        launch,
        [5_000] * 20,
        ["cudaLaunchKernel"] * 20,
    )
    meta = RankMeta()
    check_clocks(cols, cols.kind, meta)
    assert meta.clock_shift_ns == {0: -129 * MS + 10_000}
    assert int((cols.start_ns[:20] - np.array(launch)).min()) == 0
    assert any("GPU clock offset on device 0" in n for n in meta.notes)


def test_blocking_copies_that_end_after_their_call_returned_reveal_an_offset():
    launch = [i * 10 * MS for i in range(10)]
    # a 1 ms copy inside a blocking call of 2 ms, GPU clock 325 ms ahead
    cols = _cols(
        [t + 500_000 + 325 * MS for t in launch],
        [MS] * 10,
        launch,
        [2 * MS] * 10,
        ["cudaMemcpy"] * 10,
    )
    meta = RankMeta()
    check_clocks(cols, cols.kind, meta)
    assert meta.clock_shift_ns[0] == pytest.approx(325 * MS - 500_000, abs=1)
    assert not meta.clock_unreliable


def test_no_offset_is_left_alone_and_a_drift_is_refused():
    launch = [i * 10 * MS for i in range(10)]
    cols = _cols(
        [t + 20_000 for t in launch], [MS] * 10, launch, [2 * MS] * 10, ["cudaMemcpy"] * 10
    )
    meta = RankMeta()
    check_clocks(cols, cols.kind, meta)
    assert not meta.clock_shift_ns and not meta.notes
    drift = _cols(
        [t + 20_000 + i * 20 * MS for i, t in enumerate(launch)],
        [MS] * 10,
        launch,
        [2 * MS] * 10,
        ["cudaMemcpy"] * 10,
    )
    meta = RankMeta()
    before = drift.start_ns.copy()
    check_clocks(drift, drift.kind, meta)
    assert meta.clock_unreliable and not meta.clock_shift_ns
    assert np.array_equal(drift.start_ns, before)


BASE = {
    "steps": 6,
    "step_ns": 80 * MS,
    "gpu_ops": 9000,
    "gpu_ops_in_steps": 9000,
    "compute_kernels": 8500,
    "comm_kernels": 60,
    "gpu_ops_linked": 9000,
}


def test_evidence_limits_from_facts():
    rules = EvidenceRules()
    assert limits({3: BASE}, rules) == []
    sampled = {**BASE, "host_op_ids": 2000, "host_op_id_span": 150_000, "host_op_id_holes": 1400}
    (lim,) = limits({0: sampled, 1: sampled}, rules)
    assert (lim.kind, lim.effect, lim.ranks) == ("sampled", WITHHOLD, [0, 1])
    assert lim.message.startswith("ranks 0–1: the trace is sampled or filtered (1.3%")
    cpu = {
        **BASE,
        "gpu_ops": 0,
        "gpu_ops_in_steps": 0,
        "compute_kernels": 0,
        "comm_kernels": 0,
        "gpu_ops_linked": 0,
        "gpu_signs": ["deviceProperties lists 8 GPUs"],
    }
    (lim,) = limits({0: cpu}, rules)
    assert lim.kind == "no_gpu_activity" and "deviceProperties lists 8 GPUs" in lim.message
    gloo = {**cpu, "gpu_signs": []}  # a CPU job: nothing missing
    assert limits({0: gloo}, rules) == []
    only_comm = {**BASE, "compute_kernels": 0}
    assert [x.kind for x in limits({0: only_comm}, rules)] == ["comm_only"]
    short = {**BASE, "steps": 1, "gpu_ops": 14, "gpu_ops_in_steps": 14, "gpu_ops_linked": 14}
    (lim,) = limits({0: short}, rules)
    assert (lim.kind, lim.effect) == ("short", QUALIFY)
    assert lim.message == "only 14 GPU ops in 1 step of 80.0 ms: too little to generalise"
