"""Run conditions typed (gpudiag.rundir.conditions): one merge, one contention judgment with the
configured limits (gate and analyze alike), one throttle-bit table with two named masks.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from builders import gpu_run

from gpudiag.api.load import diagnose
from gpudiag.config import GateConfig, Thresholds
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.conditions import (
    CLOCK_SLOWDOWN_MASK,
    CLOCKS_LIMITED_MASK,
    THROTTLE_REASONS,
    RunConditions,
    contention,
    merge,
)

NOTE = "host busy during the run"


def _busy_notes(other_cpu: float, th: Thresholds) -> list[str]:
    run = gpu_run(ranks=2, steps=4)
    cond = RunConditions({"other_cpu_ratio_mean": other_cpu, "steal_ratio_mean": 0.0, "gpus": {}})
    run = dataclasses.replace(run, manifest=rundir.RunManifest(conditions=cond))
    return [n for n in diagnose(run, th).notes if n.startswith(NOTE)]


def test_analyze_judges_contention_with_the_configured_gate_limits() -> None:
    # GIVEN other processes at 20% of the CPUs: under the default limit (25%), over a
    # configured [tool.gpudiag.gate] max_other_cpu_ratio of 10%
    assert _busy_notes(0.20, Thresholds()) == []
    configured = Thresholds(extra={"gate": {"max_other_cpu_ratio": 0.10}})
    (note,) = _busy_notes(0.20, configured)
    assert "other processes used 20% of the CPUs (limit 10%)" in note
    # and the gate says the same with the same table
    cond = RunConditions({"other_cpu_ratio_mean": 0.20})
    assert contention(cond, GateConfig(max_other_cpu_ratio=0.10)) == [
        "other processes used 20% of the CPUs (limit 10%)"
    ]


def test_the_two_masks_differ_by_the_software_power_cap_only() -> None:
    names = {bit: n for bit, (n, _) in THROTTLE_REASONS.items()}
    assert CLOCKS_LIMITED_MASK & ~CLOCK_SLOWDOWN_MASK == 0x4 and names[0x4] == "sw_power_cap"
    # the run-conditions meaning: a name with "slowdown" or the power cap
    assert sum(b for b, n in names.items() if "slowdown" in n or "cap" in n) == CLOCKS_LIMITED_MASK
    assert sum(b for b, n in names.items() if "slowdown" in n) == CLOCK_SLOWDOWN_MASK


def test_merge_takes_the_worst_node_and_every_gpu() -> None:
    a = RunConditions(
        {
            "other_cpu_ratio_mean": 0.1,
            "steal_ratio_mean": None,
            "gpus": {"GPU-a": {"samples": 4, "slowdown_samples": 2}},
        }
    )
    b = RunConditions(
        {"other_cpu_ratio_mean": 0.3, "top_other": [{"pid": 7}], "gpus": {"GPU-b": {"samples": 2}}}
    )
    m = merge([a, None, b])
    assert m is not None and merge([None, RunConditions({})]) is None
    assert m.to_json() == {
        "gpus": {"GPU-a": {"samples": 4, "slowdown_samples": 2}, "GPU-b": {"samples": 2}},
        "other_cpu_ratio_mean": 0.3,
        "steal_ratio_mean": None,
        "cpu_busy_ratio_mean": None,
        "top_other": [{"pid": 7}],
    }
    assert m.gpus["GPU-a"].slowdown_ratio == 0.5 and m.gpus["GPU-b"].shared_ratio == 0.0


def test_a_manifest_keeps_its_conditions_byte_for_byte(tmp_path: Path) -> None:
    raw = {
        "samples": 3,
        "file": "conditions/h.jsonl",
        "gpus": {"GPU-1": {"samples": 3}},
        "unknown_later_key": [1, 2],
    }
    rundir.write_manifest(tmp_path, rundir.RunManifest(conditions=RunConditions(raw)))
    text = (tmp_path / rundir.MANIFEST).read_text()
    assert json.loads(text)["conditions"] == raw
    back = rundir.read_manifest(tmp_path / rundir.MANIFEST)
    assert back.conditions is not None and back.conditions.to_json() == raw
    rundir.write_manifest(tmp_path, back)
    assert (tmp_path / rundir.MANIFEST).read_text() == text


@pytest.mark.parametrize(
    ("conditions", "problem"),
    [
        ([], "conditions: expected an object"),
        ({"other_cpu_ratio_mean": "high"}, "conditions.other_cpu_ratio_mean: expected a number"),
        ({"gpus": {"GPU-1": 3}}, "conditions.gpus.GPU-1: expected an object"),
    ],
)
def test_a_damaged_conditions_field_is_named(tmp_path: Path, conditions, problem) -> None:
    doc = rundir.RunManifest().to_json() | {"conditions": conditions}
    (tmp_path / rundir.MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=problem):
        rundir.read_manifest(tmp_path / rundir.MANIFEST)


def test_window_share_is_the_worst_hosts_time_weighted_share_of_the_window():
    from gpudiag.rundir.conditions import ContentionSample, window_share

    rng = np.random.default_rng(3)
    samples = []
    for host in ("a", "b"):
        t = int(rng.integers(0, 300))
        for _ in range(40):
            dt = int(rng.integers(100, 600))
            samples.append(ContentionSample(host, t, t + dt, float(rng.uniform(0, 1))))
            t += dt + int(rng.integers(0, 50))  # gaps: time no sample covers
    for lo, hi in ((0, 20_000), (1234, 5678), (5000, 5001), (17_000, 40_000)):
        want = []
        for host in ("a", "b"):
            # brute force: the share at every nanosecond of the window a sample covers
            share = np.full(hi - lo, np.nan)
            for s in samples:
                if s.host == host:
                    a, b = max(s.start_ns, lo), min(s.end_ns, hi)
                    share[max(a - lo, 0) : max(b - lo, 0)] = s.ratio
            if not np.isnan(share).all():
                want.append(float(np.nanmean(share)))
        got = window_share(samples, lo, hi)
        assert got == (pytest.approx(max(want)) if want else None), (lo, hi)
    assert window_share(samples, 10**9, 10**9 + 5) is None
    assert window_share([], 0, 10) is None
