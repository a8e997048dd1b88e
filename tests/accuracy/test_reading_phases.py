"""Issue 29, failure kinds 1, 3, 4 and 8: hand-built traces whose reading is known by construction.

1. one-off start-up read as the steady state (context creation before the first kernel, a
   first-step allocation), and its contrast: an allocation that repeats every step is not
   start-up;
3. the capture's idle edges around inference steps, and Python functions as steps;
4. per-layer ranges taken for steps while the largest GPU item lies outside them;
8. what a trace without kernels holds, said exactly (Kineto copies only, a capture that
   ended in start-up, Kineto ranges only, Nsight exports with copies only and with NVTX
   ranges only: the ranges' breakdown is a Diagnosis).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from cli_runner import run_cli
from make_kineto_cases import MS, Kineto

import gpudiag
from gpudiag.config import Thresholds

# --- kind 1: start-up ---------------------------------------------------------------------


def test_context_creation_before_the_first_kernel_is_start_up(tmp_path):
    # 2 s of context creation, then ten 10 ms iterations without markers: an 8 ms kernel
    # each, launched 0.1 ms before it runs. The GPU work spans 9 × 10 + 8 = 98 ms.
    k = Kineto().host("cuda_runtime", "cudaStreamCreateWithPriority", 0, 2000)
    for i in range(10):
        t = 2000 + 10 * i
        k.host("cpu_op", "aten::mm", t, t + 1).kernel(t + 0.4, t + 0.5, t + 8.5)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    assert d.run.shares.compute == pytest.approx(80 / 98, abs=1e-6)
    r = d.reading
    assert r is not None and r.startup_calls == {"cudaStreamCreateWithPriority": 2000 * MS}
    assert r.startup_dominant
    share = 2000 / (2000 + 10 * 9 + 8.5)
    assert f"this window is {share:.0%} start-up (cudaStreamCreateWithPriority 2.0 s)" in (
        d.verdict.headline
    )
    assert "profile after" in d.verdict.headline
    assert d.verdict.bottleneck == "none"  # 82% compute once the start-up is left out


def _stepped(alloc_every_step: bool) -> Kineto:
    """Six 10 ms ProfilerSteps of 8 ms kernels; a 1.5 s cudaFree opens step 0 (or each step)."""
    k, t = Kineto(), 0.0
    for i in range(6):
        free = 1500.0 if (i == 0 or alloc_every_step) else 0.0
        k.host("user_annotation", f"ProfilerStep#{i}", t, t + free + 10)
        if free:
            k.host("cuda_runtime", "cudaFree", t + 0.1, t + 0.1 + free)
        k.kernel(t + free + 0.4, t + free + 0.5, t + free + 8.5)
        t += free + 10
    return k


def test_a_first_step_allocation_is_start_up_and_left_out(tmp_path):
    d = gpudiag.analyze(_stepped(False).save(tmp_path / "t.json.gz"), jobs=1)
    assert [s.step for s in d.steps] == [1, 2, 3, 4, 5]
    assert d.run.shares.compute == pytest.approx(0.8, abs=1e-6)
    r = d.reading
    assert r is not None and r.startup_calls == {"cudaFree": 1500 * MS}
    assert "(1 in start-up left out)" in r.line


def test_an_allocation_in_every_step_is_not_start_up(tmp_path):
    d = gpudiag.analyze(_stepped(True).save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.startup_ns == 0 and not r.startup_calls
    assert len(d.steps) == 6 and "start-up" not in d.verdict.headline
    assert d.verdict.bottleneck == "host"  # 1.5 s of cudaFree in every 1.51 s step


# --- kind 3: the capture's edges ----------------------------------------------------------


def _inference(cat: str = "user_annotation") -> Kineto:
    """19 ms idle, ten 10 ms ``execute_model`` calls with 8.5 ms of kernels each, 97 ms idle."""
    k = Kineto().host("cpu_op", "aten::empty", 0, 0.01)
    for i in range(10):
        t = 19 + 10 * i
        k.host(cat, "worker.py(88): execute_model", t, t + 10)
        k.kernel(t + 0.4, t + 0.5, t + 9)
    return k.host("cpu_op", "aten::empty", 119 + 97, 119 + 97.01)


def test_idle_edges_of_an_inference_capture_do_not_decide(tmp_path):
    # no markers, no ranges (the calls are operators): one window, cut to the GPU work
    # (19.5 … 118 ms): 85 ms of kernels in 98.5
    d = gpudiag.analyze(_inference("cpu_op").save(tmp_path / "t.json.gz"), jobs=1)
    assert d.run.shares.compute == pytest.approx(85 / 98.5, abs=1e-6)
    assert d.verdict.bottleneck == "none"  # was host-bound 61%: 85 ms of kernels in 216 ms
    r = d.reading
    assert r is not None and r.source == "whole"
    assert r.idle_head_ns == pytest.approx(19.5 * MS, abs=0.02 * MS)
    assert r.idle_tail_ns == pytest.approx(98 * MS, abs=0.02 * MS)


def test_python_function_ranges_are_steps_with_a_step_marker(tmp_path):
    path = _inference("python_function").save(tmp_path / "t.json.gz")
    d = gpudiag.analyze(path, jobs=1, thresholds=Thresholds(step_re="execute_model"))
    assert d.ranks[0].step_source == "marker" and len(d.steps) == 10
    assert d.run.shares.compute == pytest.approx(0.85, abs=1e-6)
    r = run_cli("analyze", str(path), "--step-marker", "execute_model")
    assert r.returncode == 0 and "matches no range" not in r.stderr


# --- kind 4: ranges that are not iterations -----------------------------------------------


def test_per_layer_ranges_leaving_the_largest_gpu_item_out_are_not_steps(tmp_path):
    # five 'layer N' ranges of 10 ms kernels, then a 441 ms all-gather launched after them:
    # 5 of 6 launches are inside the ranges (enough by count), 50 of 491 ms of GPU time
    k = Kineto()
    for i in range(5):
        t = 10.0 * i
        k.host("user_annotation", f"layer {i}", t, t + 10).kernel(t + 0.1, t + 0.2, t + 9.9)
    k.host("cpu_op", "nccl:all_gather", 50, 51)
    k.kernel(50.1, 50.2, 491.2, name="ncclDevKernel_AllGather_RING_LL")
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.source == "whole" and len(d.steps) == 1
    assert "found ranges refused: one window" in r.line
    assert any("hold only 10% of the GPU time" in f.message for f in d.findings)
    assert d.run.shares.compute == pytest.approx(48.5 / 491.0, abs=1e-3)
    assert d.verdict.bottleneck == "communication"


# --- kind 8: what the trace holds ---------------------------------------------------------


def test_copies_without_kernels_are_said_as_such(tmp_path):
    k = Kineto().host("cpu_op", "aten::to", 0, 5)
    for i in range(3):
        k.gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", i, i + 0.1, i + 0.9)
    for i in range(2):
        k.gpu("gpu_memset", "Memset (Device)", 4 + i, 4.1 + i, 4.2 + i)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    assert d.verdict.headline.startswith(
        "withheld: the trace holds 3 copies and 2 memsets but no kernel: tracing was on"
    )
    assert "CUDA tracing" not in d.verdict.headline


def test_a_capture_that_ended_during_start_up_says_so(tmp_path):
    # 470 ms: a 400 ms cudaFree, a 30 ms cudaMalloc, Python-level operators, no GPU work
    k = Kineto().host("cpu_op", "aten::empty", 0, 1)
    k.host("cuda_runtime", "cudaFree", 10, 410).host("cuda_runtime", "cudaMalloc", 420, 450)
    k.host("cpu_op", "aten::to", 460, 470)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    assert d.verdict.headline.startswith("start-up only: the capture ended during start-up")
    assert "cudaFree 400 ms" in d.verdict.headline and "no kernel ran" in d.verdict.headline


def test_a_kineto_trace_of_ranges_only_gets_their_breakdown(tmp_path):
    # ten 13 ms frames, each a 6.77 ms find_centers and a 4 ms draw: 67.7 of 130 ms
    k = Kineto()
    for i in range(10):
        t = 13.0 * i
        k.host("user_annotation", "frame", t, t + 13)
        k.host("user_annotation", "find_centers", t + 1, t + 7.77)
        k.host("user_annotation", "draw", t + 8, t + 12)
    d = gpudiag.analyze(k.save(tmp_path / "t.json.gz"), jobs=1)
    r = d.reading
    assert r is not None and r.holds == {"ranges": 30} and r.ranges_span_ns == 130 * MS
    assert r.ranges == {
        "frame": 130 * MS,
        "find_centers": pytest.approx(67.7 * MS, abs=10),
        "draw": 40 * MS,
    }
    assert "find_centers 68 ms of 130 ms (52%)" in d.verdict.headline
    assert d.verdict.headline.startswith("ranges only: the trace holds 30 host ranges")


def _nsys(src: Path, dst: Path, drop: list[str]) -> Path:
    shutil.copy(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst)
    for t in drop:
        con.execute(f"DROP TABLE IF EXISTS {t}")
    con.commit()
    con.close()
    return dst


def test_nsys_export_with_copies_but_no_kernels(tmp_path, shared_traces):
    src = shared_traces / "nsys" / "ai-profiler" / "baseline_nvtx.sqlite"
    p = _nsys(src, tmp_path / "copies.sqlite", ["CUPTI_ACTIVITY_KIND_KERNEL"])
    con = sqlite3.connect(p)
    (copies,) = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    (memsets,) = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()
    con.close()
    r = run_cli("analyze", str(p))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"holds {copies} copies and {memsets} memsets but no kernel" in r.stderr
    assert "CUDA tracing was on" in r.stderr


def test_nsys_export_with_nvtx_ranges_only_gives_their_breakdown(tmp_path, shared_traces):
    src = shared_traces / "nsys" / "ai-profiler" / "baseline_nvtx.sqlite"
    p = _nsys(
        src,
        tmp_path / "nvtx.sqlite",
        [
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
        ],
    )
    con = sqlite3.connect(p)
    top = con.execute(
        "SELECT COALESCE(n.text, s.value) AS nm, SUM(n.end - n.start) AS d, COUNT(*) "
        "FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.end > n.start "
        "GROUP BY nm ORDER BY d DESC LIMIT 4"
    ).fetchall()
    con.close()
    d = gpudiag.analyze(p, jobs=1)  # a Diagnosis, not a failure
    r = d.reading
    assert r is not None and r.holds.keys() == {"ranges"} and r.ranges
    # each named range's time is its ranges' total read from the raw rows (none overlaps
    # another of its name)
    raw = {name: total for name, total, _ in top}
    for name, ns in r.ranges.items():
        if name in raw:
            assert ns == raw[name], name
    assert next(iter(r.ranges)) == top[0][0]
    assert d.verdict.headline.startswith("ranges only: the trace holds")
    assert f"by range: {top[0][0]} " in d.verdict.headline
    cli = run_cli("analyze", str(p))
    assert cli.returncode == 0 and "Traceback" not in cli.stderr
