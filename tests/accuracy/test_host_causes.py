"""Issue 20: host-side causes, root-cause verdicts, fitted remedies, steps and outliers.

Truth comes from outside gpudiag: the construction of make_host_causes.py (each case's
timeline is written out there), the independent reader reference.py (host calls per
class and step, plain loops over the JSON), plain sqlite3 reads of the shared Nsight
exports, and the shared traces' README (devices, workload).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import make_host_causes
import make_merged
import pytest
import reference

import gpudiag
from gpudiag.analysis.model.diagnosis import Diagnosis, FindingKind

MS = 1_000_000


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_host_causes.build(tmp_path_factory.mktemp("host_causes"))


def _analyze(path: Path) -> Diagnosis:
    return gpudiag.analyze(path, jobs=1)


def _finding(d: Diagnosis, kind: FindingKind):  # type: ignore[no-untyped-def]
    found = [f for f in d.findings if f.kind == kind]
    assert found, [f.kind for f in d.findings]
    return found[0]


def _text(d: Diagnosis) -> str:
    return " ".join(r.title + " " + r.detail for r in d.recommendations)


def test_allocator_without_cache_is_named_with_its_steps(cases: Path) -> None:
    path = cases / "allocator_rocm" / "rank-0.json.gz"
    d = _analyze(path)
    assert d.verdict.bottleneck == "host"
    assert "memory allocator (hipFree)" in d.verdict.headline
    host = _finding(d, FindingKind.HOST_BOUND)
    cause = host.metrics.cause
    assert cause.kind == "allocator" and cause.steps == [4, 5, 6, 7]
    # independent: 80 ms of hipFree + hipMalloc in each of steps 4–7, none before
    ref = reference.host_calls(path)
    assert [ref[n].get("allocator", 0) for n in range(8)] == [0] * 4 + [80 * MS] * 4
    api = d.ranks[0].evidence.host_api["allocator"]
    got = dict(zip(api["steps"], api["ns_per_step"], strict=True))
    assert all(got.get(n, 0) == ref[n].get("allocator", 0) for n in range(8))
    assert "hipFree and hipMalloc 80.0 ms in each of steps 4–7" in host.message
    # the ×9 regime change, by step number
    var = _finding(d, FindingKind.STEP_VARIABILITY)
    assert var.metrics.pattern == "regime_change" and var.metrics.change_at_step == 4
    assert var.metrics.regime_ratio == pytest.approx(9.0, rel=0.01)
    first = d.recommendations[0]
    assert first.id == "caching-allocator" and "PYTORCH_HIP_ALLOC_CONF" in first.detail
    assert not any(r.id in ("host-sync", "launch-bound") for r in d.recommendations)


def test_one_blocking_copy_in_a_decode_step_is_named(cases: Path) -> None:
    path = cases / "blocking_copy_decode" / "rank-0.json.gz"
    d = _analyze(path)
    ref = reference.host_calls(path)
    assert ref[3]["copy"] == 463 * MS and all("copy" not in ref[n] for n in (0, 1, 2, 4))
    var = _finding(d, FindingKind.STEP_VARIABILITY)
    assert var.steps == [3] and var.metrics.pattern == "outlier"
    assert "cudaMemcpyAsync 463.0 ms in aten::copy_" in var.message
    assert d.verdict.bottleneck == "variability" and "step 3" in d.verdict.headline
    first = d.recommendations[0]
    assert first.id == "blocking-copies"
    # 463 ms once in 5 steps: ~92.6 ms a step on average, not the whole window
    assert first.estimated_gain_ns == pytest.approx(463 * MS / 5, rel=0.01)
    assert "inference" in d.ranks[0].evidence.workload
    assert "GradScaler" not in _text(d) and "DataLoader" not in _text(d)


def test_graphs_are_not_suggested_to_a_job_that_launches_them(cases: Path) -> None:
    path = cases / "graphs_launched" / "rank-0.json.gz"
    d = _analyze(path)
    ref = reference.host_calls(path)
    assert all(v.get("graph", 0) > 0 for v in ref.values())
    host = _finding(d, FindingKind.HOST_BOUND)
    assert host.metrics.cause.kind == "launch"
    assert host.metrics.cause.graphs_launched is True
    launch = next(r for r in d.recommendations if r.id == "launch-bound")
    assert "CUDA graphs" not in launch.title and "already launched" in launch.detail
    assert "torch.compile" in launch.title


def test_jit_compilation_before_the_first_kernel_is_start_up_not_a_step_gain(cases: Path) -> None:
    """A one-off compile before any kernel ran is start-up (the reading), named with its call
    and share of the window; the steady host time is the sync the reference reads."""
    path = cases / "jit_compile" / "rank-0.json.gz"
    d = _analyze(path)
    ref = reference.host_calls(path)
    assert ref[0]["jit"] == 346 * MS and ref[0]["sync"] == 100 * MS
    assert "this window is 53% start-up (cuModuleLoadData 346 ms)" in d.verdict.headline
    host = _finding(d, FindingKind.HOST_BOUND)
    assert host.metrics.cause.kind == "sync"
    assert "cudaStreamSynchronize 100.0 ms in step 0" in host.message
    # no remedy claims the 346 ms compile as time a step could recover
    assert all((r.estimated_gain_ns or 0) <= 100 * MS for r in d.recommendations)


@pytest.mark.parametrize("merged", [False, True])
def test_verdict_names_the_straggler_the_others_wait_for(
    cases: Path, merged: bool, tmp_path: Path
) -> None:
    paths = [cases / "sync_straggler" / f"rank-{r}.json.gz" for r in range(4)]
    target: Path = cases / "sync_straggler"
    if merged:
        target = make_merged.write(tmp_path / "merged.json.gz", paths, "tracefusion")
    d = _analyze(target)
    assert [r.rank for r in d.ranks] == [0, 1, 2, 3]
    assert d.verdict.bottleneck == "straggler" and d.verdict.ranks == [2]
    # the others' synchronising calls wait on the collective, by the reference's reading
    for r in (0, 1, 3):
        ref = reference.host_calls(paths[r])
        assert all(v["sync"] >= 10 * MS for v in ref.values())


def _periods(d: Diagnosis) -> dict[int, tuple[int, int]]:
    return {s.step: (s.start_ns, s.start_ns + s.duration_ns) for s in d.steps}


def _agrees_with_reference(d: Diagnosis, path: Path, periods: bool = False) -> None:
    """Per analysed step, the Python time gpudiag gives each frame equals reference.py's."""
    ref = reference.python_self_idle(path, _periods(d) if periods else None)
    sites = d.ranks[0].evidence.python_sites
    assert sites is not None
    for k, n in enumerate(sites["steps"]):
        framed = sum(ns for name, (ns, _) in ref[n].items() if name)
        assert sites["ns_per_step"][k] == framed
        assert d.ranks[0].evidence.host_ops["between_idle_ns_per_step"][k] == ref[n][""][0]
        for site in sites["sites"]:
            got = (site["ns_per_step"][k], site["calls_per_step"][k])
            assert got == ref[n].get(site["name"], (0, 0)), (n, site["name"])


def test_python_before_the_first_graph_launch_is_named_with_its_call_sites(cases: Path) -> None:
    """Issue 29: a decode step's Python before its graph replay, by the innermost frame."""
    path = cases / "decode_python_graph" / "rank-0.json.gz"
    d = _analyze(path)
    host = _finding(d, FindingKind.HOST_BOUND)
    cause = host.metrics.cause
    assert cause.kind == "python" and cause.graphs_launched is True
    us = 1_000
    # by construction: 1,207 lookups of 20 µs a step, nothing else running meanwhile
    top = cause.call_sites[0]
    assert top.name == "dict.__getitem__"
    assert top.calls_per_step == make_host_causes.DECODE_LOOKUPS == 1_207
    assert top.ns_per_step == 1_207 * round(make_host_causes.DECODE_LOOKUP_US * us)
    # the step's start to its cudaGraphLaunch, less the one operator (aten::to) in it
    before = make_host_causes.DECODE_GRAPH_AT_US - make_host_causes.DECODE_OP_US
    assert cause.before_graph_ns_per_step == round(before * us) == 25_020_000
    assert [c.name for c in cause.call_sites[:3]] == [
        "dict.__getitem__",
        "model.py(88): forward",
        "engine.py(210): step",
    ]
    assert cause.call_sites[1].ns_per_step == 710 * us  # 25,150 µs less its children
    assert "Python before the first graph launch: 25.0 ms a step (steps 0–5" in host.message
    assert "mostly in dict.__getitem__ (1,207 calls a step, 24.1 ms)" in host.message
    _agrees_with_reference(d, path)
    rec = next(r for r in d.recommendations if r.id == "host-stalls")
    assert rec.title == "Cut the per-step Python before the graph replay"
    assert "dict" in rec.detail and "torch.compile the pre-processing" in rec.detail
    assert 0 < (rec.estimated_gain_ns or 0) <= cause.before_graph_ns_per_step
    assert (rec.estimated_gain_ns or 0) <= (cause.ns_per_step or 0)
    # graphs are in use: no remedy proposes capturing them again
    assert not any("CUDA graph" in r.title for r in d.recommendations)
    assert "capture the step in a CUDA graph" not in _text(d)


def test_python_call_sites_with_an_explicit_step_marker(cases: Path) -> None:
    """--step-marker keeps the Python frames it does not match as frames, never as steps."""
    path = cases / "decode_python_graph" / "rank-0.json.gz"
    d = gpudiag.analyze(path, jobs=1, step_marker=r"^ProfilerStep#(\d+)$")
    assert d.ranks[0].step_source == "marker" and len(d.steps) == 6
    cause = _finding(d, FindingKind.HOST_BOUND).metrics.cause
    top = cause.call_sites[0]
    assert (top.name, top.calls_per_step, top.ns_per_step) == (
        "dict.__getitem__",
        1_207,
        24_140_000,
    )
    # the frames' figures as without the marker (its steps end at the ranges' ends, 10 µs
    # before the next: time with no frame open, counted in neither)
    plain = _finding(_analyze(path), FindingKind.HOST_BOUND).metrics.cause
    assert cause.call_sites == plain.call_sites


def test_python_cause_without_python_frames_is_as_before(cases: Path) -> None:
    """The same trace without its python_function events: the same cause, no call sites."""
    with_frames = _finding(
        _analyze(cases / "decode_python_graph" / "rank-0.json.gz"), FindingKind.HOST_BOUND
    ).metrics.cause
    d = _analyze(cases / "decode_python_graph_stripped" / "rank-0.json.gz")
    cause = _finding(d, FindingKind.HOST_BOUND).metrics.cause
    assert cause.kind == "python"
    for field in ("share", "ns_per_step", "step_share", "other_ns_per_step", "graphs_launched"):
        assert getattr(cause, field) == getattr(with_frames, field), field
    assert cause.call_sites is None and cause.before_graph_ns_per_step is None
    assert "call_sites" not in cause.to_json() and "mostly in" not in cause.text
    assert d.ranks[0].evidence.python_sites is None
    assert "python_sites" not in d.ranks[0].evidence.to_json()
    rec = next(r for r in d.recommendations if r.id == "host-stalls")
    assert rec.title == "Cut Python overhead between operators"


@pytest.mark.parametrize(
    ("name", "periods"),
    [
        ("b200x8_r0_infer/rank-0.json.gz", True),  # no ProfilerStep: gpudiag's one window
        ("edge_h100_infer_1step/h100.json.gz", False),
        ("edge_mi300x_infer_1step/mi300x.json.gz", False),
        ("mi300x_ddp8_r0_rccl/rank-0.json.gz", False),
    ],
    ids=["b200x8_r0_infer", "edge_h100_infer_1step", "edge_mi300x_infer_1step", "mi300x_ddp8"],
)
def test_python_frames_of_shared_traces_agree_with_the_reference(
    kineto_sets: Path, name: str, periods: bool
) -> None:
    """Every shared Kineto trace with python_function events (the others have none)."""
    path = kineto_sets / name
    _agrees_with_reference(_analyze(path), path, periods)


def test_legacy_optimizer_operators_are_steps(cases: Path) -> None:
    d = _analyze(cases / "legacy_optimizer" / "rank-0.json.gz")
    assert d.ranks[0].step_source == "optimizer"
    warm = _finding(d, FindingKind.WARMUP)
    assert warm.steps == [0]
    assert d.verdict.bottleneck == "data"
    assert d.verdict.share == pytest.approx(0.40, abs=0.01)


# ---- shared traces ----------------------------------------------------------------------


def test_volta_gets_fp16_with_a_grad_scaler_not_bf16(kineto_sets: Path) -> None:
    d = _analyze(kineto_sets / "v100x2_r1")
    assert d.ranks[0].evidence.device["generation"] == "Volta"
    text = _text(d)
    # never told to use them (the text may say the GPU lacks them)
    assert "torch.bfloat16" not in text and "allow_tf32" not in text and "in bf16" not in text
    assert "float32_matmul_precision" not in text
    prec = next(r for r in d.recommendations if r.id == "reduced-precision")
    assert "GradScaler" in prec.title + prec.detail


def test_v100_jitter_named_by_step(kineto_sets: Path) -> None:
    d = _analyze(kineto_sets / "v100x2_r1")
    var = _finding(d, FindingKind.STEP_VARIABILITY)
    assert var.metrics.pattern == "jitter"
    assert "82.2 ms to 166.5 ms" in var.message
    assert var.metrics.p90_median_ratio == pytest.approx(1.45, abs=0.01)


def test_torchrec_all_to_all_gets_embedding_advice_not_moe(kineto_sets: Path) -> None:
    d = _analyze(kineto_sets / "a100x8_r3")
    ids = [r.id for r in d.recommendations]
    assert "embedding-all-to-all" in ids and "moe-all-to-all" not in ids
    assert "capacity factor" not in _text(d)


def test_jacobi_solve_bounds_the_phase(shared_traces: Path) -> None:
    path = shared_traces / "nsys" / "jacobi-mpi" / "report1.sqlite"
    d = _analyze(path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    solves = sorted(
        (s, e)
        for s, e in con.execute(
            "SELECT start, \"end\" FROM NVTX_EVENTS WHERE text = 'Jacobi solve'"
        )
    )
    assert len(solves) == 2
    assert len(d.steps) == 2
    for step, (a, b) in zip(sorted(d.steps, key=lambda s: s.start_ns), solves, strict=True):
        assert a - 1_000 <= step.start_ns <= b
    assert sum(s.duration_ns for s in d.steps) < 1.05 * sum(e - s for s, e in solves)
    assert any("Jacobi solve" in n for n in d.notes)


def test_pinned_htod_copies_are_a_copy_bound_verdict(shared_traces: Path) -> None:
    path = shared_traces / "nsys" / "nsys-ai" / "h100_2gpu_1s.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kinds = dict(
        con.execute(
            'SELECT srcKind, SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 '
            "GROUP BY srcKind"
        ).fetchall()
    )
    assert set(kinds) == {0, 1} and kinds[1] > 0.99 * sum(kinds.values())  # pinned, not pageable
    kernel_ns = dict(
        con.execute(
            'SELECT deviceId, SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1'
        )
    )
    htod_ns = dict(
        con.execute(
            'SELECT deviceId, SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 '
            "GROUP BY 1"
        )
    )
    d = _analyze(path)
    assert d.verdict.bottleneck == "copy"
    host = _finding(d, FindingKind.HOST_BOUND)
    assert "pinned or device memory" in host.message
    recs = {r.id: r for r in d.recommendations}
    # the copies (~920 ms) dwarf the kernels (~22 ms): moving less is the remedy, its gain
    # at most the copies' own time; overlap hides at most the compute there is
    assert d.recommendations[0].id == "copy-less"
    assert 0 < (recs["copy-less"].estimated_gain_ns or 0) <= max(htod_ns.values())
    assert 0 < (recs["exposed-copies"].estimated_gain_ns or 0) <= 1.01 * max(kernel_ns.values())
    # the source is pinned already: no pinning advice, and the detail says so
    overlap = recs["exposed-copies"]
    assert "pin_memory" not in overlap.detail and "pinned memory" not in overlap.title
    assert "already pinned" in overlap.detail
    assert "copy-less" in overlap.overlaps_with


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_innermost_frame_matches_the_reference_on_ragged_frames(seed: int) -> None:
    """Frames that start together, end together, are empty or overlap without nesting."""
    import random

    import numpy as np

    from gpudiag.analysis.rank.hostcause import innermost

    rng = random.Random(seed)
    frames = []
    for k in range(400):
        a = rng.randrange(0, 5_000) * 10
        frames.append((a, a + rng.choice([0, 10, 20, 50, 500, 3_000]), f"f{k % 17}"))
    s, e, i = innermost(
        np.array([f[0] for f in frames], np.int64), np.array([f[1] for f in frames], np.int64)
    )
    got: dict[str, int] = {}
    for a, b, k in zip(s.tolist(), e.tolist(), i.tolist(), strict=True):
        got[frames[k][2]] = got.get(frames[k][2], 0) + b - a
    want: dict[str, int] = {}
    for a, b, name in reference._innermost_pieces(frames):
        want[name] = want.get(name, 0) + b - a
    assert got == want
    assert all(b > a for a, b in zip(s.tolist(), e.tolist(), strict=True))
    assert all(b <= a for a, b in zip(s[1:].tolist(), e[:-1].tolist(), strict=True))
