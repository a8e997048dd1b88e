"""Iterations without markers (issue 29, scope 2): hand-built traces whose steps are known.

No ProfilerStep, no user range: the iterations are the Python function that repeats on the
training thread, never inside itself, and holds most of the launches — the outermost one
(not the per-layer frames inside it, not a recursive ``_call_impl``). A repeating function
that holds most launches but little GPU time, or few launches, is no iteration: the window
is analysed as one phase and the reading says so.
"""

from __future__ import annotations

import pytest
from make_kineto_cases import MS, Kineto

import gpudiag

STEP_MS = 20.0
# per iteration: (launch, kernel start, kernel end) in ms from the iteration's start
KERNELS = [(3.0, 3.1, 5.0), (7.0, 7.1, 10.0), (12.5, 12.6, 15.0), (14.0, 15.0, 17.0)]


def _training(n: int = 6) -> Kineto:
    """``n`` calls of ``train.py(30): train_step`` inside one ``main``, with frames inside."""
    k = Kineto().host("python_function", "train.py(50): main", 0, n * STEP_MS + 5)
    for i in range(n):
        t = i * STEP_MS
        k.host("python_function", "train.py(30): train_step", t, t + STEP_MS - 0.5)
        # a recursive module call (overlaps itself) and two layer frames, each half the work
        k.host("python_function", "torch/nn/modules/module.py(1500): _call_impl", t + 1, t + 12)
        k.host("python_function", "torch/nn/modules/module.py(1500): _call_impl", t + 2, t + 11)
        k.host("python_function", "model.py(10): forward", t + 2, t + 6)
        k.host("python_function", "model.py(20): forward", t + 6, t + 11)
        k.host("python_function", "nn.Module: Layer_0", t + 2, t + 6)
        k.host("python_function", "nn.Module: Layer_1", t + 6, t + 11)
        k.host("python_function", "optim.py(5): step", t + 13.5, t + 18)
        for launch, s, e in KERNELS:
            k.host("cpu_op", "aten::mm", t + launch - 0.05, t + launch + 0.05)
            k.kernel(t + launch, t + s, t + e)
    return k


def test_the_repeating_outermost_python_function_is_the_iteration(tmp_path):
    d = gpudiag.analyze(_training().save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.source == "user_range" and r.steps_found == 6
    assert "'train.py(30): train_step'" in r.line
    busy = sum(e - s for _, s, e in KERNELS)  # 9.2 ms of kernels in each 20 ms iteration
    durations = [s.duration_ns for s in d.steps]
    assert durations[:-1] == [round(STEP_MS * MS)] * (len(durations) - 1)
    assert [s.compute_ns for s in d.steps] == [pytest.approx(busy * MS, abs=1)] * len(d.steps)
    assert d.run.shares.compute == pytest.approx(busy / STEP_MS, abs=0.01)


def test_a_repeating_function_with_little_gpu_time_is_refused(tmp_path):
    # ten calls of a logger that each launch a 0.1 ms kernel (10 of 11 launches), then a
    # 400 ms kernel launched outside them: 1 of 401 ms of GPU time inside
    k = Kineto()
    for i in range(10):
        t = 2.0 * i
        k.host("python_function", "metrics.py(7): log", t, t + 1)
        k.host("cpu_op", "aten::add", t + 0.2, t + 0.3).kernel(t + 0.25, t + 0.3, t + 0.4)
    k.host("cpu_op", "aten::mm", 21, 22).kernel(21.5, 22, 422)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.source == "whole" and len(d.steps) == 1
    assert "found ranges refused: one window" in r.line
    assert any(
        "'metrics.py(7): log' (10) hold only 0% of the GPU time" in f.message for f in d.findings
    )


def test_a_function_that_holds_few_launches_is_no_iteration(tmp_path):
    # a checkpoint call every 50 ms holds 1 of each 5 launches: the window is one phase
    k = Kineto()
    for i in range(5):
        t = 50.0 * i
        k.host("python_function", "ckpt.py(3): save", t, t + 5)
        k.host("cpu_op", "aten::copy_", t + 1, t + 2).kernel(t + 1.5, t + 2, t + 4)
        for j in range(4):
            u = t + 10 + 10 * j
            k.host("cpu_op", "aten::mm", u, u + 1).kernel(u + 0.5, u + 1, u + 8)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.source == "whole" and "no iterations: one window" in r.line
    assert d.ranks[0].step_source == "whole"


def _layers(between: bool) -> Kineto:
    """One forward (a call that starts and ends in the trace) of 6 layer calls of 8 ms each.

    Every layer launches four 1.5 ms kernels; ``between``: a 0.2 ms kernel is launched
    between two layers (a residual add of the forward's own), 5 of 29 launches.
    """
    k = Kineto().host("cpu_op", "aten::empty", 0, 0.1)
    k.host("python_function", "model.py(90): forward", 5, 5 + 6 * 10 + 1)
    for i in range(6):
        t = 5 + 10.0 * i
        k.host("python_function", "model.py(40): forward", t + 0.5, t + 8.5)
        for j in range(4):
            u = t + 1 + 1.6 * j
            k.host("cpu_op", "aten::mm", u, u + 0.2).kernel(u + 0.1, u + 0.2, u + 1.7)
        if between and i < 5:
            k.host("cpu_op", "aten::add", t + 9, t + 9.2).kernel(t + 9.1, t + 9.2, t + 9.4, "add")
    return k.host("cpu_op", "aten::empty", 80, 80.1)


@pytest.mark.parametrize("between", [False, True])
def test_layers_of_one_forward_are_not_iterations(tmp_path, between):
    d = gpudiag.analyze(_layers(between).save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.source == "whole" and len(d.steps) == 1
    why = [f.message for f in d.findings if "is not the iteration" in f.message]
    assert why, [f.message for f in d.findings]
    if between:  # 5 of 5 gaps launch a kernel
        assert "kernels are launched between its calls in 5 of 5 gaps" in why[0]
    else:
        assert "all lie in one call of 'model.py(90): forward'" in why[0]
