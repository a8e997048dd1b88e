"""The host's contention over time: ``conditions/<host>.jsonl`` samples read for the blame rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.errors import InputError
from gpudiag.rundir.conditions import ContentionSample, rank_samples
from gpudiag.rundir.layout import RankInfo, RunManifest
from gpudiag.traces.runfiles.contention import load_contention


def _write(run: Path, host: str, lines: list[dict | str]) -> Path:
    p = run / "conditions" / f"{host}.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


def test_samples_are_other_plus_steal_over_their_interval(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "h1",
        [
            {"type": "header", "format": "gpudiag.conditions", "version": 1},
            {"type": "sample", "time_ns": 100, "interval_ns": None, "other_cpu_ratio": None},
            {
                "type": "sample",
                "time_ns": 200,
                "interval_ns": 100,
                "other_cpu_ratio": 0.5,
                "steal_ratio": 0.1,
            },
            {
                "type": "sample",
                "time_ns": 300,
                "interval_ns": 100,
                "other_cpu_ratio": 0.25,
                "steal_ratio": None,
            },
        ],
    )
    assert load_contention(tmp_path) == [
        ContentionSample("h1", 100, 200, 0.6),
        ContentionSample("h1", 200, 300, 0.25),
    ]
    assert load_contention(tmp_path / "missing") == []


def test_a_bad_sample_is_one_line_naming_the_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "h1", [{"type": "sample", "time_ns": "soon", "interval_ns": 1}])
    with pytest.raises(InputError) as e:
        load_contention(tmp_path)
    assert str(p) in str(e.value) and "line 1: time_ns is not an integer" in str(e.value)


def test_each_rank_gets_its_hosts_samples() -> None:
    a, b = ContentionSample("a", 0, 1, 0.1), ContentionSample("b", 0, 1, 0.9)
    m = RunManifest(ranks=[RankInfo(0, host="a"), RankInfo(1, host="b"), RankInfo(2, host="c")])
    assert rank_samples([a, b], m) == {0: [a], 1: [b]}
    # one host sampled, a rank's host unnamed: that host's samples
    assert rank_samples([a], RunManifest(ranks=[RankInfo(0)])) == {0: [a]}
    assert rank_samples([a], None) == {}
