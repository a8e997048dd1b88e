"""Issue 10: steps from the user's own NVTX ranges, data-wait between them, warm-up, remedies.

Every expected number follows from the construction in make_nsys_cases.py: an iteration is
a 10 ms ``step i`` range holding 8 ms of kernels, then a 15 ms gap in which the training
thread waits in ``pthread_cond_timedwait`` with the GPU idle; the last step has no gap.
"""

from __future__ import annotations

import pytest
from cli_runner import run_cli

import gpudiag
from gpudiag.config import SteadyRules

MS = 1_000_000
N = 20


def test_user_step_ranges_are_found_without_options(nsys_cases):
    d = gpudiag.analyze(nsys_cases / "user_steps_loader.sqlite", jobs=1)
    (r,) = d.ranks
    assert (r.step_source, r.steps) == ("user_range", N)
    assert [s.step for s in d.steps] == list(range(N))
    assert (
        "steps from NVTX range 'step N' (20 ranges, 100% of the thread's launches inside)"
        in d.notes
    )
    # not 'forward' (nested in it) nor a source_missing finding
    assert not [f for f in d.findings if f.kind == "source_missing"]


def test_loader_gap_is_data_wait_with_the_loader_remedy_first(nsys_cases):
    d = gpudiag.analyze(nsys_cases / "user_steps_loader.sqlite", jobs=1)
    total = (N - 1) * 25 + 10  # ms: 19 periods of 25 ms, the last one 10 ms
    assert d.run.shares.data_wait == pytest.approx((N - 1) * 15 / total, abs=1e-6)
    assert d.run.shares.compute == pytest.approx(N * 8 / total, abs=1e-6)
    for s in d.steps[:-1]:
        assert (s.duration_ns, s.compute_ns, s.data_wait_ns) == (25 * MS, 8 * MS, 15 * MS)
    (data,) = [f for f in d.findings if f.kind == "data_bound"]
    assert data.severity == "error" and "between step ranges" in data.message
    assert "pthread_cond_timedwait" in data.message
    assert d.recommendations[0].id == "dataloader"
    # on the median step (the what-if's): the typical step waits its 15 ms (the mean step,
    # with the last step's none, would be 19 × 15 / 20 ms)
    assert d.recommendations[0].estimated_gain_ns == 15 * MS
    ev = d.ranks[0].evidence.between_steps
    assert ev is not None and ev.gap_ns == (N - 1) * 15 * MS
    assert ev.blocked_in["pthread_cond_timedwait"] == pytest.approx(14.9 / 15, abs=1e-3)


def test_gpu_busy_between_ranges_is_not_data_wait(nsys_cases):
    # DALI-like: a decoding thread keeps the GPU busy for 14 of the 15 ms between ranges
    d = gpudiag.analyze(nsys_cases / "user_steps_dali.sqlite", jobs=1)
    assert d.ranks[0].step_source == "user_range"
    for s in d.steps:
        assert s.data_wait_ns == 1 * MS  # 0.5 ms before the first decode kernel, 0.5 after
    assert d.run.shares.data_wait == pytest.approx(1 / 25, abs=1e-6)
    assert not [f for f in d.findings if f.kind == "data_bound"]


def test_warmup_step_is_named_and_left_out(nsys_cases):
    d = gpudiag.analyze(nsys_cases / "user_steps_warmup.sqlite", jobs=1)
    assert [s.step for s in d.steps] == list(range(1, N))
    (w,) = [f for f in d.findings if f.kind == "warmup"]
    assert w.steps == [0] and w.severity == "info"
    assert "step 0: 208.0 ms, warm-up" in w.message
    total = (N - 2) * 25 + 10
    assert d.run.shares.data_wait == pytest.approx((N - 2) * 15 / total, abs=1e-6)
    keep = gpudiag.analyze(
        nsys_cases / "user_steps_warmup.sqlite",
        jobs=1,
        thresholds=gpudiag.Thresholds(steady=SteadyRules(include_warmup=True)),
    )
    assert [s.step for s in keep.steps] == list(range(N))
    assert not [f for f in keep.findings if f.kind == "warmup"]


def test_include_warmup_flag(nsys_cases):
    r = run_cli(
        "analyze", str(nsys_cases / "user_steps_warmup.sqlite"), "-f", "json", "--include-warmup"
    )
    assert r.returncode == 0, r.stderr
    assert '"step": 0,' in r.stdout


def test_epochs_are_phases_not_steps(nsys_cases):
    d = gpudiag.analyze(nsys_cases / "user_steps_epochs.sqlite", jobs=1)
    assert (d.ranks[0].step_source, d.ranks[0].steps) == ("user_range", 21)
    assert "'step N' (21 ranges" in d.notes[0]


def test_launch_gaps_get_the_cuda_graphs_remedy(nsys_cases):
    # 400 kernels of 10 µs launched every 25 µs: the GPU idles 15 µs between launches
    d = gpudiag.analyze(nsys_cases / "launch_bound.sqlite", jobs=1)
    (host,) = [f for f in d.findings if f.kind == "host_bound"]
    assert host.ranks == [0]
    (rec,) = [r for r in d.recommendations if r.finding == "host_bound"]
    assert rec.id == "launch-bound"
    assert rec.evidence["launch_gap_share"] > 0.8


def test_explicit_marker_and_automatic_detection_agree(nsys_cases):
    path = nsys_cases / "user_steps_loader.sqlite"
    auto = gpudiag.analyze(path, jobs=1)
    marked = gpudiag.analyze(path, jobs=1, step_marker=r"^step (\d+)$")
    assert marked.ranks[0].step_source == "marker"
    assert [(s.step, s.duration_ns, s.data_wait_ns) for s in marked.steps] == [
        (s.step, s.duration_ns, s.data_wait_ns) for s in auto.steps
    ]


def test_explicit_marker_problems_are_one_line_each(nsys_cases):
    path = str(nsys_cases / "user_steps_loader.sqlite")
    r = run_cli("analyze", path, "--step-marker", r"^(step|forward)")
    assert r.returncode == 4 and "overlap each other" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("analyze", path, "--step-marker", r"^iteration (\d+)$")
    assert r.returncode == 4 and "matches no range" in r.stderr and "'step N' ×20" in r.stderr
