"""Real ``gpudiag run -- torchrun`` jobs on CPU with gloo: traces, telemetry and manifest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from run_helpers import DEMO, run_gpudiag

from gpudiag.rundir import layout as rundir
from gpudiag.traces.runfiles.telemetry import load_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2"]
SMALL = ["--hidden", "64", "--layers", "2", "--batch", "16"]


def test_two_ranks_traces_telemetry_manifest_and_straggler(tmp_path: Path) -> None:
    # GIVEN a 2-rank job where rank 1 sleeps 50 ms before each forward
    out = tmp_path / "run"
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--profile-steps",
            "3:6",
            "--",
            *TORCHRUN,
            str(DEMO),
            "--steps",
            "10",
            "--sleep-rank",
            "1",
            "--sleep-s",
            "0.05",
            *SMALL,
        ]
    )
    # THEN the job succeeded and the diagnosis is on stdout after it
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank" in r.stdout
    m = rundir.read_manifest(out / "manifest.json")
    assert m.exit_code == 0
    assert m.world_size == 2
    assert [x.rank for x in m.ranks] == [0, 1]
    assert m.sources["kineto"].captured
    assert m.sources["telemetry"].captured
    assert m.sources["nvml"].captured is False
    assert m.sources["nvml"].reason
    for rank in (0, 1):
        with gzip.open(rundir.trace_path(out, rank)) as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {f"ProfilerStep#{s}" for s in (3, 4, 5)} <= names
    df = load_steps(out)
    assert sorted(set(df["rank"])) == [0, 1]
    assert all(sorted(g["step"]) == list(range(10)) for _, g in df.groupby("rank"))
    assert set(df.loc[df["profiled"], "step"]) == {3, 4, 5}
    # AND the straggler shows: the fast rank waits for it inside backward (DDP all-reduce)
    steady = df[df["step"] >= 2]
    bw = steady.groupby("rank")["backward_ns"].median()
    assert bw[0] - bw[1] > 30_000_000, bw


def test_rank_raising_mid_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--no-analyze",
            "--",
            *TORCHRUN,
            str(DEMO),
            "--steps",
            "10",
            "--raise-at",
            "4",
            *SMALL,
        ]
    )
    assert r.returncode != 0
    m = rundir.read_manifest(out / "manifest.json")
    assert m.exit_code == r.returncode
    errors = m.extra["rank_errors"]
    assert any(e["rank"] == 1 and "injected failure at step 4" in e["message"] for e in errors)
    df = load_steps(out)
    assert sorted(df.loc[df["rank"] == 1, "step"]) == [0, 1, 2, 3]
