"""Start-up kinds and teardown (issue 29, scope 1): hand-built traces whose phases are known.

Autotuning (an operator that tries several algorithms, each timed with an event
synchronisation), compilation (a range that compiles, an NVRTC call), a first call far
longer than its later ones, and teardown after the last GPU work: each is read as what it
is by construction, the steady figures stay those of the steps without it.
"""

from __future__ import annotations

import pytest
from make_kineto_cases import MS, Kineto

import gpudiag

TRIALS, TRIAL_MS, TRIAL_GAP = 4, 200.0, 225.0


def _autotuned_forward() -> Kineto:
    """One forward: a convolution trying 4 algorithms (910 ms), then 5 ops of 10 ms kernels."""
    k = Kineto().host("cpu_op", "aten::cudnn_convolution", 0, 910)
    for j in range(TRIALS):
        t = 10 + TRIAL_GAP * j
        k.host("cuda_runtime", "cudaEventRecord", t, t + 0.01)
        k.kernel(t + 0.02, t + 0.05, t + TRIAL_MS, name=f"conv_algo{j}")
        k.host("cuda_runtime", "cudaEventRecord", t + 0.03, t + 0.04)
        k.host("cuda_runtime", "cudaEventSynchronize", t + 0.05, t + TRIAL_MS + 0.1)
    for i in range(5):
        t = 920 + 12.0 * i
        k.host("cpu_op", "aten::relu", t, t + 0.5).kernel(t + 0.1, t + 0.2, t + 10.2, "relu")
    return k


def test_autotuning_in_a_single_forward_is_start_up(tmp_path):
    d = gpudiag.analyze(_autotuned_forward().save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.startup_kinds.get("autotuning") == 910 * MS
    assert r.startup_calls.get("aten::cudnn_convolution") == 910 * MS
    assert "autotuning 910 ms" in r.line
    # the window is 0 … 978.2 ms: 93% start-up, which the verdict says, with what to capture
    assert r.startup_dominant
    assert "start-up (aten::cudnn_convolution 910 ms)" in d.verdict.headline
    assert "profile after" in d.verdict.headline


def test_one_kernel_and_one_sync_per_operator_is_no_autotuning(tmp_path):
    # a steady pattern that syncs after each op (.item()): never several algorithms per op
    k = Kineto()
    for i in range(8):
        t = 100.0 * i
        k.host("cpu_op", "aten::cudnn_convolution", t, t + 90)
        k.kernel(t + 1, t + 2, t + 80, name="conv_algo1")
        k.host("cuda_runtime", "cudaStreamSynchronize", t + 1.1, t + 80.1)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and "autotuning" not in r.startup_kinds and r.startup_ns == 0


def _steps(k: Kineto, first: float, n: int = 5, step: float = 20.0) -> Kineto:
    """``n`` steady ProfilerSteps after ``first`` ms: one 1 ms embedding and a 10 ms kernel."""
    for i in range(n):
        t = first + step * i
        k.host("user_annotation", f"ProfilerStep#{i + 1}", t, t + step)
        k.host("cpu_op", "aten::embedding", t + 0.5, t + 1.5)
        k.kernel(t + 1.0, t + 2.0, t + 12.0)
    return k


def test_compilation_in_the_first_step_is_start_up(tmp_path):
    # step 0 (400 ms): a kernel, then a 300 ms compileFusion range holding an NVRTC call
    k = Kineto().host("user_annotation", "ProfilerStep#0", 0, 400)
    k.kernel(1, 1.1, 5)
    k.host("user_annotation", "compileFusion", 10, 310)
    k.host("cuda_runtime", "nvrtcCompileProgram", 20, 300)
    k.kernel(320, 321, 330)
    d = gpudiag.analyze(_steps(k, 400).save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.startup_kinds.get("compilation") == 300 * MS
    assert "compilation 300 ms" in r.line and "(1 in start-up left out)" in r.line
    assert [s.step for s in d.steps] == [1, 2, 3, 4, 5]
    assert d.run.shares.compute == pytest.approx(10 / 20, abs=1e-6)


def test_a_first_call_far_longer_than_its_later_ones_is_start_up(tmp_path):
    # step 0: the first aten::embedding takes 320 ms (lazy set-up); each later one 1 ms
    k = Kineto().host("user_annotation", "ProfilerStep#0", 0, 400)
    k.kernel(1, 1.1, 5)
    k.host("cpu_op", "aten::embedding", 10, 330)
    k.kernel(329, 330, 340)
    d = gpudiag.analyze(_steps(k, 400).save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.startup_kinds.get("first calls") == 320 * MS
    assert r.startup_calls == {"aten::embedding": 320 * MS}
    assert [s.step for s in d.steps] == [1, 2, 3, 4, 5]


def test_teardown_after_the_last_gpu_work_is_left_out(tmp_path):
    plain = gpudiag.analyze(_steps(Kineto(), 0).save(tmp_path / "a.json.gz"), jobs=1)
    k = _steps(Kineto(), 0).host("cuda_runtime", "cudaFree", 110, 710)
    d = gpudiag.analyze(k.save(tmp_path / "b.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.teardown_calls == {"cudaFree": 600 * MS}
    assert r.teardown_ns == 600 * MS and r.startup_ns == 0
    assert "teardown 600 ms (cudaFree 600 ms) left out" in r.line
    assert [(s.step, s.duration_ns, s.compute_ns) for s in d.steps] == [
        (s.step, s.duration_ns, s.compute_ns) for s in plain.steps
    ]
    assert d.verdict.headline == plain.verdict.headline


def _autotune_mid_window() -> Kineto:
    """Five 10 ms kernels, the convolution's autotuning (910 ms, 4 timed trials), five more.

    Each trial's sync waits 200 ms for a 40 ms kernel: GPU-idle syncs, which in steady work
    would be a sync remedy.
    """
    k = Kineto()
    for i in range(5):
        t = 12.0 * i
        k.host("cpu_op", "aten::relu", t, t + 0.5).kernel(t + 0.1, t + 0.2, t + 10.2, "relu")
    k.host("cpu_op", "aten::cudnn_convolution", 70, 980)
    for j in range(TRIALS):
        t = 80 + TRIAL_GAP * j
        k.host("cuda_runtime", "cudaEventRecord", t, t + 0.01)
        k.kernel(t + 0.02, t + 0.05, t + 40, name=f"conv_algo{j}")
        k.host("cuda_runtime", "cudaEventRecord", t + 0.03, t + 0.04)
        k.host("cuda_runtime", "cudaEventSynchronize", t + 0.05, t + TRIAL_MS + 0.1)
    for i in range(5):
        t = 990 + 12.0 * i
        k.host("cpu_op", "aten::relu", t, t + 0.5).kernel(t + 0.1, t + 0.2, t + 10.2, "relu")
    return k


def test_autotuning_mid_window_is_cut_out_of_the_steady_work(tmp_path):
    d = gpudiag.analyze(_autotune_mid_window().save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.startup_kinds.get("autotuning") == 910 * MS
    assert "autotuning 910 ms" in r.line
    # the window is the GPU work, 0.2 … 1048.2 ms, less the 910 ms of autotuning in it
    assert [s.duration_ns for s in d.steps] == [(1048 - 910) * MS]
    assert d.run.shares.compute == pytest.approx(100 / 138, abs=0.01)  # ten 10 ms kernels
    # the trials' syncs are start-up, not a steady habit: no remedy or finding names them
    said = [f.message for f in d.findings] + [str(x) for x in d.recommendations]
    assert not [m for m in said if "Synchronize" in m or "sync" in m.lower()], said
