"""Classification on tiny synthetic timelines whose answers are known by construction."""

import numpy as np
import pytest
from builders import MS, TimelineBuilder, gpu_run

from gpudiag.analysis.rank.classify import classify_steps
from gpudiag.analysis.reading.steps import find_steps
from gpudiag.api.load import diagnose
from gpudiag.config import Thresholds


def parts(b: TimelineBuilder):
    tl = b.build()
    win = find_steps(tl)
    return win, classify_steps(tl, win)


def test_compute_then_exposed_comm_then_gap():
    # GIVEN three 10 ms steps: 6 ms kernel, then 2 ms NCCL with nothing beside it
    run = gpu_run(ranks=1, steps=3)
    tl = run.ranks[0]
    win = find_steps(tl)
    p = classify_steps(tl, win)
    # THEN each period is split exactly
    assert win.duration.tolist() == [10 * MS, 10 * MS, int(9.5 * MS)]
    assert p.compute.tolist() == [6 * MS] * 3
    assert p.comm_wait.tolist() == [2 * MS] * 3
    assert p.overlapped.tolist() == [0, 0, 0]
    assert p.data_wait.tolist() == [0, 0, 0]
    assert (p.compute + p.comm_wait + p.data_wait + p.other == win.duration).all()


def test_comm_hidden_under_compute_counts_as_overlap_not_wait():
    b = TimelineBuilder().step(0, 0, 10)
    b.kernel(1, 7, launch=0.5).nccl(5, 9, launch=0.6)
    _, p = parts(b)
    assert p.compute[0] == 6 * MS
    assert p.overlapped[0] == 2 * MS
    assert p.comm_wait[0] == 2 * MS


def test_data_wait_only_while_the_gpu_is_idle():
    # DataLoader 0-4 ms; the previous step's kernel still runs 0-1 ms; own kernel 4-9 ms
    b = TimelineBuilder().step(0, 0, 10).step(1, 10, 20)
    b.kernel(0, 1).data(0, 4).kernel(4, 9, launch=3.9)
    b.data(10, 11).kernel(11, 19, launch=10.5)
    win, p = parts(b)
    assert p.data_wait.tolist() == [3 * MS, 1 * MS]
    # the unlinked 0-1 ms kernel is backlog from before the trace: step 0 starts after it
    assert win.start[0] == 1 * MS
    assert p.compute.tolist() == [5 * MS, 8 * MS]


def test_gpu_work_belongs_to_the_step_that_launched_it_when_the_gpu_lags():
    # The host races ahead (1 ms steps) while each step's kernel takes 10 ms on the GPU.
    b = TimelineBuilder()
    for s in range(3):
        b.step(s, s, s + 1)
        b.kernel(10 * s + 0.5, 10 * s + 10.5, launch=s + 0.2)
    win, p = parts(b)
    # step 0 starts with its host step (the GPU is idle until 0.5 ms), the others when
    # their own kernel can start; the idle 0-0.5 ms belongs to step 0
    assert win.duration.tolist() == [int(10.5 * MS), 10 * MS, 10 * MS]
    assert p.compute.tolist() == [10 * MS, 10 * MS, 10 * MS]
    assert win.gpu_ops.tolist() == [1, 1, 1]


def test_backlog_launched_before_the_profiler_is_no_step_work():
    b = TimelineBuilder()
    b.kernel(0, 30)  # no launch record: launched before the trace window
    for s in range(2):
        b.step(s, s * 2, s * 2 + 2)
        b.kernel(30 + 10 * s, 40 + 10 * s, launch=s * 2 + 0.1)
    win, p = parts(b)
    assert win.start.tolist() == [30 * MS, 40 * MS]
    assert p.compute.tolist() == [10 * MS, 10 * MS]


def test_cpu_gloo_sync_gap_is_comm_wait_and_gloo_beside_backward_is_overlap():
    b = TimelineBuilder(main_tid=1).step(0, 0, 10)
    b.op("aten::mm", 0, 5)  # forward + backward on the main thread
    b.host_comm("gloo:all_reduce", 3, 8, tid=7)  # bucket allreduce on gloo's thread
    b.op("torch.distributed.ddp.reducer::copy_bucket_to_grad", 8, 8.5)
    b.op("Optimizer.step#SGD.step", 8.5, 9.5)
    _, p = parts(b)
    assert p.mode == "cpu"
    assert p.comm_wait[0] == 3 * MS  # the silent gap 5-8 ms
    assert p.overlapped[0] == 2 * MS  # gloo 3-5 ms beside backward
    assert p.compute[0] == 5 * MS + int(1.5 * MS)


def test_blocking_collective_inside_an_op_is_not_compute():
    b = TimelineBuilder(main_tid=1).step(0, 0, 10)
    b.op("autograd::engine::evaluate_function: AccumulateGrad", 1, 9)
    b.host_comm("c10d::allreduce_", 2, 8)
    _, p = parts(b)
    assert p.compute[0] == 2 * MS
    assert p.comm_wait[0] == 6 * MS


def test_no_step_markers_gives_one_window_and_a_finding():
    b = TimelineBuilder().kernel(0, 4, launch=0).kernel(6, 10, launch=5)
    tl = b.build()
    from gpudiag.traces.schema import RunTimeline

    d = diagnose(RunTimeline.of([tl]))
    assert len(d.steps) == 1 and d.steps[0].duration_ns == 10 * MS
    assert d.ranks[0].step_source == "whole"
    assert any(f.kind == "source_missing" and "one window" in f.message for f in d.findings)


@pytest.mark.parametrize("seed", range(4))
def test_parts_always_sum_to_the_period(seed: int):
    rng = np.random.default_rng(seed)
    b = TimelineBuilder()
    for s in range(5):
        b.step(s, s * 10, s * 10 + rng.uniform(5, 10))
    for _ in range(60):
        t = rng.uniform(0, 55)
        kind = rng.integers(0, 4)
        if kind == 0:
            b.kernel(t, t + rng.uniform(0, 4), launch=t - rng.uniform(0, 3))
        elif kind == 1:
            b.nccl(t, t + rng.uniform(0, 4), launch=t - rng.uniform(0, 3))
        elif kind == 2:
            b.data(t, t + rng.uniform(0, 3))
        else:
            b.memcpy(t, t + rng.uniform(0, 1), launch=t - 0.1)
    win, p = parts(b)
    total = p.compute + p.comm_wait + p.data_wait + p.other
    assert (total == win.duration).all()
    assert (p.other >= 0).all() and (p.data_wait >= 0).all()
    assert (win.start[1:] >= win.end[:-1]).all()


def test_diagnosis_flags_idle_and_names_the_bound():
    d = diagnose(gpu_run(ranks=2, steps=3))
    r = d.ranks[0]
    assert r.shares.compute == pytest.approx(18 / 29.5)
    kinds = {f.kind for f in d.findings}
    assert {"idle_ratio", "comm_bound"} <= kinds
    assert "data_bound" not in kinds
    strict = diagnose(gpu_run(ranks=2, steps=3), Thresholds(idle_ratio_max=0.5))
    assert "idle_ratio" not in {f.kind for f in strict.findings}
