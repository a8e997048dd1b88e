"""Issue 29, the reading before the rules: transformations of every shared Kineto trace.

Each transformation (metamorphic_phases.py) has an effect known without gpudiag:

* a multi-second one-off runtime call prepended before everything (context creation):
  the steady figures (steps, their durations, the shares) are unchanged, the start-up is
  named with its call and exact time, and the verdict says the window is mostly start-up
  exactly when the call is at least half of the new window (measured from the raw events);
* idle padding before and after the capture: same steps, shares and verdict; the edges
  are named as left out;
* ``ProfilerStep#N`` renamed to a user range (found without options), or to a Python
  function picked with ``--step-marker``: the same steps.
"""

from __future__ import annotations

import functools
from pathlib import Path

import metamorphic_phases as mp
import pytest

import gpudiag
from gpudiag.config import ReadingRules, Thresholds

SETS = [
    "a100x2_r0_pgcfg",
    "a100x8_r3",
    "b200x8_r0_infer",
    "edge_amd_mi250",
    "edge_cpu_only",
    "edge_distinfo_no_rank",
    "edge_h100_infer_1step",
    "edge_mi210_gpu_only",
    "edge_mi300x_infer_1step",
    "edge_mi300x_triton_tiny",
    "edge_no_distinfo",
    "mi300x_ddp8_r0_rccl",
    "rtx2080ti_dataloader_nostep",
    "sampled_2rank_a2a",
    "v100x2_r1",
]
# sets with at least three ProfilerStep ranges (a found user range must recur three times)
STEPPED = ["a100x2_r0_pgcfg", "a100x8_r3", "mi300x_ddp8_r0_rccl", "v100x2_r1"]
STARTUP_S = 3.0
STARTUP_CALL = "cudaStreamCreateWithPriority"


def _transformed(src: Path, out: Path, fn) -> tuple[Path, list[tuple[float, float]]]:
    """Every file of the set transformed into ``out``; each file's span before and after (µs)."""
    out.mkdir()
    spans = []
    for f in sorted(src.glob("*.json.gz")):
        doc = mp.load(f)
        before = mp.span(doc)
        new = fn(doc)
        spans.append((before, mp.span(new)))
        mp.save(new, out / f.name)
    return out, spans


@functools.cache
def _before(sets: Path, name: str) -> gpudiag.Diagnosis:
    """The untransformed set's diagnosis, read once for the module's four transformations."""
    return gpudiag.analyze(sets / name, jobs=1)


def _figures(d: gpudiag.Diagnosis) -> tuple:
    return (
        d.run.steps,
        [(s.rank, s.duration_ns, s.compute_ns, s.comm_wait_ns, s.data_wait_ns) for s in d.steps],
        d.run.shares.as_dict(),
    )


@pytest.mark.parametrize("name", SETS)
def test_prepended_startup_leaves_steady_figures_and_is_named(name, kineto_sets, tmp_path):
    before = _before(kineto_sets, name)
    path, spans = _transformed(
        kineto_sets / name,
        tmp_path / name,
        lambda d: mp.prepend_startup(d, STARTUP_S, STARTUP_CALL),
    )
    after = gpudiag.analyze(path, jobs=1)
    assert _figures(after) == _figures(before)
    r = after.reading
    assert r is not None and r.startup_calls[STARTUP_CALL] == round(STARTUP_S * 1e9)
    assert f"{STARTUP_CALL} {STARTUP_S:.1f} s" in r.line
    # dominant exactly when the call is half of its rank's new window (raw events' span)
    ratio = ReadingRules().startup_dominant_ratio
    dominant = any(ratio * (t1 - t0) <= STARTUP_S * 1e6 for _, (t0, t1) in spans)
    assert r.startup_dominant == dominant
    if not dominant:
        assert after.verdict.headline == before.verdict.headline
    elif r.holds.get("kernels"):
        assert after.verdict.headline.startswith(before.verdict.headline + " — this window is ")
        assert "start-up" in after.verdict.headline and "profile after" in after.verdict.headline
    else:  # no kernel in the trace: it ended during start-up
        assert after.verdict.headline.startswith("start-up only: the capture ended during start-up")


@pytest.mark.parametrize("name", SETS)
def test_idle_padding_at_the_edges_changes_nothing(name, kineto_sets, tmp_path):
    before = _before(kineto_sets, name)
    path, _ = _transformed(kineto_sets / name, tmp_path / name, lambda d: mp.pad_edges(d, 0.2, 0.5))
    after = gpudiag.analyze(path, jobs=1)
    assert _figures(after) == _figures(before)
    assert after.verdict.headline == before.verdict.headline
    r = after.reading
    assert r is not None and r.startup_ns == (before.reading.startup_ns if before.reading else 0)
    assert r.idle_head_ns >= 200_000_000 and r.idle_tail_ns >= 500_000_000
    assert "left out" in r.line


def _durations(d: gpudiag.Diagnosis) -> list[tuple[int, int]]:
    return [(s.duration_ns, s.compute_ns) for s in d.steps]


@pytest.mark.parametrize("name", STEPPED)
def test_renamed_step_markers_give_the_same_steps(name, kineto_sets, tmp_path):
    before = _before(kineto_sets, name)
    path, _ = _transformed(
        kineto_sets / name, tmp_path / name, lambda d: mp.rename_markers(d, "train iteration {n}")
    )
    after = gpudiag.analyze(path, jobs=1)
    assert after.ranks[0].step_source == "user_range"
    assert [s.step for s in after.steps] == [s.step for s in before.steps]
    assert _durations(after) == _durations(before)
    assert after.verdict.bottleneck == before.verdict.bottleneck
    assert after.run.shares.compute == pytest.approx(before.run.shares.compute, abs=1e-9)


@pytest.mark.parametrize("name", STEPPED)
def test_python_function_steps_by_step_marker(name, kineto_sets, tmp_path):
    before = _before(kineto_sets, name)
    path, _ = _transformed(
        kineto_sets / name,
        tmp_path / name,
        lambda d: mp.rename_markers(
            d, "metamorphic.py(1): renamed_iteration", cat="python_function"
        ),
    )
    plain = gpudiag.analyze(path, jobs=1)  # Python functions are not steps by themselves
    assert plain.ranks[0].step_source != "marker"
    after = gpudiag.analyze(path, jobs=1, thresholds=Thresholds(step_re="renamed_iteration"))
    assert after.ranks[0].step_source == "marker"
    assert _durations(after) == _durations(before)
    assert after.verdict.bottleneck == before.verdict.bottleneck
