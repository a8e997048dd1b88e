"""Iterations from a repeating kernel sequence (issue 29, scope 2): hand-built traces.

No ProfilerStep, no range, no Python function: the iterations are the period of the kernel
names in launch order, when it repeats at least 3 times over most of the GPU time, cut
where the host waits between launches (the loop fetching the next input). A sequence that
does not repeat, or repeats over little of the GPU time, is one window, and the reading says
so. The answers are the builder's own: the iterations it wrote, their period and kernels.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from make_kineto_cases import MS, Kineto

import gpudiag

STEP_MS = 20.0
GAP_MS = 4.0  # the host's input fetch at the start of every iteration: no launches
# one iteration's kernels, in launch order: names repeat inside it (not a period of 1 or 2)
SEQUENCE = ["embed", "gemm", "gemm", "softmax", "gemm", "gemm", "norm", "gemm"]
RUN_MS = 1.2


def _loop(n: int, seed: int = 1, warmup: int = 0) -> tuple[Kineto, float]:
    """``n`` iterations of SEQUENCE with ±0.1 ms jitter; before them ``warmup`` one-off kernels."""
    rnd = random.Random(seed)
    k, t0, busy = Kineto(), 0.0, 0.0
    for j in range(warmup):
        k.host("cpu_op", "aten::setup", t0 + 0.1 * j, t0 + 0.1 * j + 0.05)
        k.kernel(t0 + 0.1 * j, t0 + 0.1 * j + 0.01, t0 + 0.1 * j + 0.02, name=f"setup_{j}")
    t0 = 1.0 if warmup else 0.0
    for i in range(n):
        t = t0 + i * STEP_MS + GAP_MS
        for name in SEQUENCE:
            launch = t + rnd.uniform(-0.1, 0.1)
            run = RUN_MS + rnd.uniform(-0.1, 0.1)
            k.host("cpu_op", "aten::op", launch - 0.05, launch + 0.05)
            k.kernel(launch, launch + 0.1, launch + 0.1 + run, name=name)
            busy += run
            t += 1.5
    return k, busy


@pytest.mark.parametrize("warmup", [0, 5])
def test_n_repeats_of_one_kernel_sequence_are_n_iterations(tmp_path, warmup):
    n = 8
    k, busy = _loop(n, warmup=warmup)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.source == "kernels" and r.steps_found == n
    said = f"{n} iterations from a repeating sequence of {len(SEQUENCE)} kernels (from 'embed'"
    assert any(said in f.message for f in d.findings), [f.message for f in d.findings]
    # every iteration but the first and last is one period: the fetch gap, then its kernels
    middle = [s.duration_ns for s in d.steps if 0 < s.step < n - 1]
    assert middle and all(abs(x - STEP_MS * MS) < 0.5 * MS for x in middle)
    per_step = busy / n
    assert [s.compute_ns for s in d.steps] == [
        pytest.approx(per_step * MS, rel=0.1) for _ in d.steps
    ]


def test_a_sequence_that_does_not_repeat_is_one_window(tmp_path):
    rnd = random.Random(3)
    k = Kineto()
    for i in range(64):
        t = 1.5 * i
        k.host("cpu_op", "aten::op", t - 0.05, t + 0.05)
        k.kernel(t, t + 0.1, t + 1.2, name=f"k{rnd.randrange(8)}")
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    assert d.reading is not None and d.reading.source == "whole"
    said = "no sequence of kernels repeats 3 times"
    assert any(said in f.message for f in d.findings), [f.message for f in d.findings]
    said = "no sequence of kernels repeats 3 times over 80% of the GPU time"
    assert any(said in f.message for f in d.findings), [f.message for f in d.findings]


def test_a_repeating_sequence_with_little_of_the_gpu_time_is_one_window(tmp_path):
    k, busy = _loop(6)
    end = 6 * STEP_MS + 1
    k.host("cpu_op", "aten::op", end, end + 0.1)
    k.kernel(end, end + 0.1, end + 0.1 + 4 * busy, name="solve")  # 80% of the GPU time
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    assert d.reading is not None and d.reading.source == "whole"
    said = "no sequence of kernels repeats 3 times"
    assert any(said in f.message for f in d.findings), [f.message for f in d.findings]


def test_the_kernel_period_of_a_real_loop_is_its_annotated_batch(shared_traces):
    # the same training program exported with and without its 'Batch N' NVTX ranges: on
    # the annotated export, with the ranges ignored, the kernel sequence's iterations are
    # the periods between the program's own batches (59 ranges bound 58 periods)
    from gpudiag.config import LoaderRules
    from gpudiag.traces.core.kernel_period import kernel_steps
    from gpudiag.traces.nsys import load_nsys

    (tl,) = load_nsys(shared_traces / "nsys" / "ai-profiler" / "baseline_nvtx.sqlite")
    batches = tl.steps.start_ns
    assert tl.steps.source == "user_range" and batches.size == 59
    cols = (tl.start_ns, tl.end_ns, tl.kind, tl.lane, tl.name, tl.names, tl.lanes, tl.launch_ns)
    found = kernel_steps(*cols, LoaderRules())
    assert not isinstance(found, str) and found.start_ns.size == batches.size - 1
    period = float(np.median(np.diff(found.start_ns)))
    assert period == pytest.approx(float(np.median(np.diff(batches))), rel=0.05)
    # and the export without ranges is read the same way
    d = gpudiag.analyze(shared_traces / "nsys" / "ai-profiler" / "baseline.sqlite", jobs=1)
    assert d.ranks[0].step_source == "kernels" and d.ranks[0].steps == batches.size - 1
