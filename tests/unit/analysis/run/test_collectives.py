"""Cross-rank matching of collectives, transfer/sync split, bandwidth, pipeline bubbles."""

import numpy as np
import pytest
from testpaths import DATA

import gpudiag
from gpudiag.analysis.model.diagnosis import RankSync
from gpudiag.analysis.run.collectives import (
    Collectives,
    collective_type,
    match,
    summarize_collectives,
)
from gpudiag.analysis.run.pipeline import ideal_bubble

MS = 1_000_000


def colls(rank, types, durs, nbytes=None, keys=None, device="NVIDIA H100 80GB HBM3"):
    n = len(types)
    return Collectives(
        rank=rank,
        type=list(types),
        key=np.array(keys if keys else [-1] * n, np.int64),
        nbytes=np.array(nbytes if nbytes else [-1] * n, np.int64),
        start=np.arange(n, dtype=np.int64) * 10 * MS,
        dur=np.array(durs, np.int64),
        step=np.zeros(n, np.int32),
        devices=8,
        device_name=device,
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "allreduce"),
        ("ncclDevKernel_AllGather_RING_LL", "allgather"),
        ("ncclDevKernel_SendRecv", "sendrecv"),
        ("ncclSymDevKernel_AllReduce_RSxLD_bf16", "allreduce"),
        ("nccl:all_to_all", "alltoall"),
        ("gloo:all_reduce", "allreduce"),
        ("_reduce_scatter_base", "reducescatter"),
        ("ncclDevKernel_Generic", "unknown"),
    ],
)
def test_collective_type_from_any_name(name, kind):
    assert collective_type(name) == kind


def test_comms_id_matching_splits_transfer_from_sync_wait():
    d = gpudiag.analyze(DATA / "straggler_comms_id", jobs=1)
    c = d.collectives
    assert (c.method, c.matched) == ("comms_id", 4)
    # nothing computes beside these collectives: all of the wait held the steps
    assert c.per_rank["0"] == RankSync(
        sync_wait_ns=4 * 5 * MS, transfer_ns=4 * 2 * MS, exposed_wait_ns=4 * 5 * MS
    )
    assert c.per_rank["1"].sync_wait_ns == 0
    (f,) = [f for f in d.findings if f.kind == "straggler"]
    assert (f.ranks, f.cause, f.persistent) == ([1], "compute", True)
    assert f.wait_caused_ns == 20 * MS
    assert f.metrics.wait_attribution == "synchronisation wait of matched collectives"


def test_side_by_side_collectives_wait_for_the_late_rank_once():
    """Two buckets' all-reduces on one rank run at once (gloo's threads): rank 0 enters both
    ([0, 503] and [20, 529] ms), rank 1 (late) enters at 500 and 525 ms and both end with 3 ms
    of transfer. Rank 0 waited 526 ms, not 500 + 506: the union of its wait intervals."""
    a = colls(0, ["allreduce", "allreduce"], [503 * MS, 509 * MS], [100, 200])
    a.start[:] = [0, 20 * MS]
    b = colls(1, ["allreduce", "allreduce"], [3 * MS, 3 * MS], [100, 200])
    b.start[:] = [500 * MS, 525 * MS]
    section, by_step = summarize_collectives([a, b])
    assert section.per_rank["0"].sync_wait_ns == 526 * MS
    assert by_step[(0, 0)] == 526 * MS
    assert section.per_rank["1"].sync_wait_ns == 0
    late = section.late_arrival["1"]
    assert (late.last, late.waited_ns) == (2, 526 * MS)
    assert (late.waited_ns_min, late.waited_ns_max) == (500 * MS, 506 * MS)  # per collective


def test_order_matching_drops_size_mismatches():
    a = colls(0, ["allreduce", "allreduce", "broadcast"], [5 * MS, 3 * MS, 1 * MS], [100, 200, 8])
    b = colls(1, ["allreduce", "allreduce", "broadcast"], [2 * MS, 3 * MS, 2 * MS], [100, 999, 8])
    method, pairs = match([a, b])
    assert method == "order"
    assert pairs == [{0: 0, 1: 0}, {0: 2, 1: 2}]  # the 200 vs 999 bytes pair is dropped


def test_bus_bandwidth_follows_nccl_tests():
    gb = 1_000_000_000
    ranks = [colls(r, ["allreduce"], [10 * MS if r else 12 * MS], [gb]) for r in range(8)]
    section, _ = summarize_collectives(ranks)
    (row,) = section.by_type
    assert row.transfer_ns_median == 10 * MS
    assert row.algbw_gbps == pytest.approx(100.0)
    assert row.busbw_gbps == pytest.approx(100.0 * 2 * 7 / 8)
    assert row.efficiency == pytest.approx(175.0 / 450.0)
    assert section.per_rank["0"].sync_wait_ns == 2 * MS


def test_single_rank_bandwidth_is_a_lower_bound_and_no_finding(kineto_sets):
    d = gpudiag.analyze(kineto_sets / "a100x2_r0_pgcfg", jobs=1)
    assert d.collectives.bandwidth_is_lower_bound is True
    assert not [f for f in d.findings if f.kind == "low_bandwidth"]


def test_pipeline_bubble_matches_the_schedule():
    d = gpudiag.analyze(DATA / "pipeline_4stage", jobs=1)
    pipe = d.collectives.pipeline
    assert (pipe.stages, pipe.micro_batches) == (4, 4)
    assert pipe.ideal_bubble_ratio == pytest.approx(3 / 7)
    # each stage idles 9 of 21 ms; all of it is receive wait but the drain at the end of
    # the step (stage s finishes its backward s·B = 2s ms early), which is not waiting
    for s in range(4):
        assert pipe.stage_bubble_ratio[str(s)] == pytest.approx((9 - 2 * s) / 21, abs=0.005)
    (f,) = [f for f in d.findings if f.kind == "pipeline_bubble"]
    assert "with 16 it would be 16%" in f.message
    assert not [f for f in d.findings if f.kind == "host_bound"]  # the bubble explains it
    (rec,) = [r for r in d.recommendations if r.id == "pipeline-microbatches"]
    # one 21 ms step of 16-24 GPU ops: too little to generalise, so the schedule's figures
    # stay in the detail and no gain is given (docs/definitions.md, "Evidence first")
    assert rec.estimated_gain_ns is None and "too little to generalise" in rec.detail
    assert f"{ideal_bubble(4, 16):.0%}" in rec.detail


def test_data_parallel_run_is_not_a_pipeline():
    d = gpudiag.analyze(DATA / "straggler_comms_id", jobs=1)
    assert d.collectives.pipeline is None


def test_all_to_all_over_sendrecv_kernels_is_not_a_pipeline(kineto_sets):
    # NCCL runs all-to-all with SendRecv kernels; only explicit send/recv make stages
    d = gpudiag.analyze(kineto_sets / "sampled_2rank_a2a", jobs=1)
    assert d.collectives.pipeline is None
    assert not [f for f in d.findings if f.kind == "pipeline_bubble"]


def test_the_wait_for_the_last_rank_that_compute_hid_is_not_exposed():
    # rank 0 waits 100 ms at the collective in each of 2 steps, but computes beside it:
    # its comm-wait (the step's exposed wait) is 60 ms, then 120 ms
    from gpudiag.analysis.model.diagnosis import CollectivesSummary, StepBreakdown
    from gpudiag.analysis.run.collectives import with_exposed_waits

    coll = CollectivesSummary(
        method="order",
        matched=2,
        bandwidth_is_lower_bound=False,
        by_type=[],
        per_rank={"0": RankSync(200 * MS, 0), "1": RankSync(0, 0)},
    )
    steps = [
        StepBreakdown(0, 0, 0, 300 * MS, 240 * MS, 60 * MS, 0, 0, 0),
        StepBreakdown(0, 1, 300 * MS, 300 * MS, 180 * MS, 120 * MS, 0, 0, 0),
        StepBreakdown(1, 0, 0, 300 * MS, 300 * MS, 0, 0, 0, 0),
        StepBreakdown(1, 1, 300 * MS, 300 * MS, 300 * MS, 0, 0, 0, 0),
    ]
    out = with_exposed_waits(coll, {(0, 0): 100 * MS, (0, 1): 100 * MS}, steps)
    assert out is not None
    assert out.per_rank["0"].exposed_wait_ns == (60 + 100) * MS  # min(wait, comm-wait) a step
    assert out.per_rank["1"].exposed_wait_ns == 0
