"""One classification of communication, MPI and clocks: gpudiag against answers known without it.

Truth comes from construction (make_evidence_cases.py: DeepEP, multimem, MPI and
clock-offset cases whose timings are written by hand) and from the independent reader
(reference.py: its own communication classification over the raw JSON and SQLite).
"""

from __future__ import annotations

from pathlib import Path

import make_evidence_cases as cases
import pytest
import reference
from testpaths import nonempty

import gpudiag
from gpudiag.analysis.rank.kernels import display_name, family
from gpudiag.config import SteadyRules
from gpudiag.traces.load import load_run
from gpudiag.traces.schema import Kind

EVERY_STEP = gpudiag.Thresholds(steady=SteadyRules(include_warmup=True))
MS = 1_000_000


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> dict[str, Path]:
    return cases.build_all(tmp_path_factory.mktemp("evidence_cases"))


def _per_step(d, attr):
    return [getattr(s, attr) for s in d.steps]


def test_deepep_kernels_are_communication_and_a_combine_named_compute_kernel_is_not(built):
    # GIVEN per 10 ms step: GEMM [0.5, 4.5) + moe combineKernel [4.5, 5.0) on stream 7,
    # DeepEP notify [0.5, 0.7), dispatch [0.7, 2.7), combine [4.0, 6.0) on stream 20
    d = gpudiag.analyze(built["deepep"], jobs=1, thresholds=EVERY_STEP)
    assert _per_step(d, "compute_ns") == [int(4.5 * MS)] * 4
    assert _per_step(d, "comm_wait_ns") == [1 * MS] * 4  # [5.0, 6.0)
    assert _per_step(d, "comm_overlapped_ns") == [int(3.2 * MS)] * 4
    ref = reference.kineto(built["deepep"])
    assert [r.comm_wait for r in ref] == _per_step(d, "comm_wait_ns")
    fams = {e.name: e.family for e in d.kernels.top}
    # the kernel table shows demangled, normalised names (issue 24)
    assert {fams[display_name(n)] for n in cases.DEEPEP.values()} == {"communication"}
    assert fams[display_name(cases.DECOY)] != "communication"


def test_deepep_in_an_nsight_export_is_told_by_its_demangled_namespace(built):
    # short names "combine" and "combineKernel": only demangledName says deep_ep::intranode
    d = gpudiag.analyze(built["deepep_nsys"], jobs=1, thresholds=EVERY_STEP)
    assert _per_step(d, "comm_wait_ns") == [1 * MS] * 10  # [5.0, 6.0)
    assert _per_step(d, "comm_overlapped_ns") == [1 * MS] * 10  # [4.0, 5.0)
    assert _per_step(d, "compute_ns") == [int(4.5 * MS)] * 10


def test_multimem_on_the_compute_stream_is_exposed_communication(built):
    d = gpudiag.analyze(built["multimem"], jobs=1, thresholds=EVERY_STEP)
    assert _per_step(d, "comm_wait_ns") == [int(1.5 * MS)] * 4
    assert _per_step(d, "compute_ns") == [6 * MS] * 4
    assert d.verdict.bottleneck == "communication"


def test_mpi_calls_are_communication_and_mpi_init_is_not(built):
    # GIVEN 10 steps of 10 ms, each with an MPI range [5, 8) ms around MPI_Sendrecv and
    # MPI_Allreduce rows of Nsight's MPI table, and a 2 s MPI_Init before the first step
    d = gpudiag.analyze(built["mpi"], jobs=1, thresholds=EVERY_STEP)
    assert len(d.steps) == 10
    assert _per_step(d, "comm_wait_ns") == [3 * MS] * 10
    lo = d.steps[0].start_ns
    hi = d.steps[-1].start_ns + d.steps[-1].duration_ns
    assert sum(_per_step(d, "comm_wait_ns")) == reference.mpi_time(built["mpi"], lo, hi)


def test_jacobi_mpi_ranges_count_as_communication(shared_traces):
    # 931 ms of NVTX 'MPI' ranges (+ MPI_Sendrecv/MPI_Allreduce rows) were host overhead
    path = shared_traces / "nsys" / "jacobi-mpi" / "report1.sqlite"
    d = gpudiag.analyze(path, jobs=1, thresholds=EVERY_STEP)
    comm = sum(s.comm_wait_ns + s.comm_overlapped_ns for s in d.steps)
    lo = d.steps[0].start_ns
    hi = d.steps[-1].start_ns + d.steps[-1].duration_ns
    want = reference.mpi_time(path, lo, hi)
    assert want > 930 * MS
    assert comm == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize("name", ["clock_plus", "clock_minus"])
def test_a_gpu_clock_offset_is_corrected_from_the_launch_links(built, name):
    # GIVEN the same export as clock_none with every GPU row moved by +325 / -129 ms
    bounds = reference.clock_bounds(built[name])[0]
    assert bounds[0] < -100_000 or (bounds[1] or 0) > 100_000  # the reader sees the offset
    want = gpudiag.analyze(built["clock_none"], jobs=1, thresholds=EVERY_STEP)
    got = gpudiag.analyze(built[name], jobs=1, thresholds=EVERY_STEP)
    for g, w in zip(got.steps, want.steps, strict=True):
        assert g.compute_ns == pytest.approx(w.compute_ns, abs=50_000)
        assert g.duration_ns == pytest.approx(w.duration_ns, abs=50_000)
    (tl,) = load_run(built[name]).ranks
    offset = 325 * MS if name == "clock_plus" else -129 * MS
    assert tl.meta.clock_shift_ns[0] == pytest.approx(offset, abs=50_000)
    assert any("GPU clock offset" in n for n in got.ranks[0].notes)


def test_clocks_that_drift_are_not_corrected_and_the_split_is_refused(built):
    (tl,) = load_run(built["clock_drift"]).ranks
    assert tl.meta.clock_unreliable and not tl.meta.clock_shift_ns
    d = gpudiag.analyze(built["clock_drift"], jobs=1)
    assert any("cannot be split" in n for n in d.ranks[0].notes)


def test_the_shared_exports_have_no_clock_offset(shared_traces):
    for path in nonempty((shared_traces / "nsys").glob("*/*.sqlite"), "shared Nsight exports"):
        if path.name == "healthy_1pct.sqlite":
            continue  # synthetic: no runtime table
        for tl in load_run(path).ranks:
            assert not tl.meta.clock_shift_ns and not tl.meta.clock_unreliable, path


COMM_SETS = [
    "b200x8_r0_infer/rank-0.json.gz",
    "a100x8_r3/rank-3.json.gz",
    "mi300x_ddp8_r0_rccl/rank-0.json.gz",
    "sampled_2rank_a2a/rank-0.json.gz",
]


@pytest.mark.parametrize("rel", COMM_SETS)
def test_a_kernel_of_the_communication_family_counts_as_communication(rel, kineto_sets):
    # Property: the kernel table's communication family and the shares' communication are
    # one classification: every such kernel is a COMM interval, and the steps' comm time
    # (exposed + overlapped) holds the union of those kernels inside the steps.
    path = kineto_sets / rel
    d = gpudiag.analyze(path, jobs=1, thresholds=EVERY_STEP)
    comm_names = {e.name for e in d.kernels.top if e.family == "communication"}
    (tl,) = load_run(path).ranks
    gpu = tl.gpu_lane_mask()[tl.lane]
    for i in range(len(tl.names)):
        sel = gpu & (tl.name == i) & ((tl.kind == Kind.COMPUTE) | (tl.kind == Kind.COMM))
        if sel.any():
            kind = int(tl.kind[sel][0])
            assert (family(tl.names[i], kind) == "communication") == (kind == Kind.COMM)
            assert (kind == Kind.COMM) == reference.is_comm_kernel(tl.names[i]), tl.names[i]
    comm = sum(s.comm_wait_ns + s.comm_overlapped_ns for s in d.steps)
    raw = reference.comm_kernel_time(path)
    if comm_names:
        assert comm > 0
    assert comm <= raw + 1_000  # what lies in the analysed steps only


def test_b200_multimem_counts_as_communication_in_the_shares(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "b200x8_r0_infer", jobs=1)
    fam = d.kernels.families["communication"]
    assert fam > 0.15
    assert d.run.shares.comm_wait + d.run.comm_overlapped_ratio > 0.01


def test_gloo_collective_sizes_come_from_the_recorded_inputs(kineto_sets):
    # gloo's ranges carry no collective args, only Input Dims / Input type (record_shapes)
    import gzip
    import json
    import statistics

    path = kineto_sets / "edge_cpu_only" / "rank-34.json.gz"
    sizes = []
    for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]:
        if e.get("name") == "gloo:all_reduce":
            (dims,), (tp,) = e["args"]["Input Dims"], e["args"]["Input type"]
            assert tp == "float"
            n = 1
            for x in dims:
                n *= x
            sizes.append(4 * n)
    d = gpudiag.analyze(path, jobs=1)
    (row,) = d.collectives.by_type
    assert row.type == "allreduce" and row.count == len(sizes) == 10
    assert row.bytes_median == statistics.median(sizes)
    assert row.algbw_gbps is not None
