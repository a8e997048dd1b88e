"""Real 2-rank CPU DDP jobs under `gpudiag run` with injected stragglers.

The demo job sleeps, reads slowly or stalls on one rank; gpudiag must name that rank, the
cause and (for the intermittent stall) the steps, and must stay silent on a balanced run.
"""

import json
import sys
from collections.abc import Callable

import pytest
from cli_runner import run_cli
from noisy_host import first_clean

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

# The injected delay is larger than a step's compute (batch 2048: ~65 ms here), so it stays
# the straggler's largest excess even where the host runs one rank's core at half speed
# (seen in CI: rank 1 computing 100+ ms longer than rank 0 in every step of a job).
JOBS = {
    "balanced": ["--batch", "2048"],  # the others' size: a quarter of the demo's compute
    "sleepy_rank": ["--batch", "2048", "--sleep-rank", "1", "--sleep-s", "0.1"],
    "slow_data_rank": ["--batch", "2048", "--slow-data", "0.00005", "--slow-data-rank", "1"],
    "stall_every_4th": [
        "--batch",
        "2048",
        "--sleep-rank",
        "1",
        "--sleep-s",
        "0.5",
        "--sleep-every",
        "4",
    ],
}


def diagnose_job(tmp_path_factory, name: str) -> dict:
    d = tmp_path_factory.mktemp(name) / "run"
    r = run_cli(
        "run",
        "--no-analyze",
        "--quiet",
        "--out",
        str(d),
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "gpudiag.demo.train",
        "--steps",
        "16",
        "--pin",
        *JOBS[name],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a = run_cli("analyze", str(d), "--format", "json")
    assert a.returncode == 0, a.stderr
    return json.loads(a.stdout)


def stragglers(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == "straggler"]


def verdict(tmp_path_factory, name: str, check: Callable[[dict], None]) -> None:
    """``check`` (asserts) the diagnosis of job ``name``, up to 3 runs.

    A host whose other processes slow one rank's core makes that rank a real straggler
    too; see tests/noisy_host.py for the re-runs (logged, never skipped).
    """

    def problems(doc: dict) -> list[str]:
        try:
            check(doc)
        except (AssertionError, ValueError) as e:  # ValueError: `(f,) = ...` found none
            found = "; ".join(f["message"] for f in stragglers(doc))
            said = " ".join(str(e).split())[:120]
            return [f"{said} [stragglers: {found}]"]
        return []

    first_clean(lambda i: diagnose_job(tmp_path_factory, name), problems)


def test_balanced_run_has_no_straggler_and_is_compute_bound_without_flags(tmp_path_factory):
    def check(doc: dict) -> None:
        assert not stragglers(doc)
        assert doc["run"]["mode"] == "cpu" and doc["run"]["ranks"] == 2
        flagged = [
            f"{f['kind']} flagged ({f['message']})"
            for f in doc["findings"]
            if f["kind"] in ("idle_ratio", "data_bound")
            # a rank waiting at the all-reduce for a rank the host slowed down is not
            # communication cost, and gpudiag says so: that is the right answer here
            or (f["kind"] == "comm_bound" and f["metrics"].get("sync_wait_share", 0) <= 0.5)
        ]
        assert not flagged, flagged
        assert doc["run"]["shares"]["compute"] > 0.7, doc["run"]["shares"]
        assert doc["run"]["idle_ratio"] < 0.3

    verdict(tmp_path_factory, "balanced", check)


def test_rank_that_sleeps_every_step_is_a_persistent_host_straggler(tmp_path_factory):
    def check(doc: dict) -> None:
        (f,) = stragglers(doc)
        assert f["ranks"] == [1] and f["persistent"] is True and f["cause"] == "host"
        assert f["wait_caused_ns"] > 0
        assert doc["recommendations"][0]["id"] == "investigate-rank-1"

    verdict(tmp_path_factory, "sleepy_rank", check)


def test_rank_with_a_slow_dataset_is_a_data_straggler(tmp_path_factory):
    def check(doc: dict) -> None:
        (f,) = stragglers(doc)
        assert f["ranks"] == [1] and f["cause"] == "data" and f["persistent"] is True
        ids = [r["id"] for r in doc["recommendations"]]
        assert "investigate-rank-1" in ids and "dataloader" in ids

    verdict(tmp_path_factory, "slow_data_rank", check)


def test_rank_that_stalls_every_4th_step_is_intermittent_with_its_steps(tmp_path_factory):
    def check(doc: dict) -> None:
        (f,) = stragglers(doc)
        assert f["ranks"] == [1] and f["persistent"] is False
        assert f["steps"] == [3, 7, 11, 15]
        assert "every 4th step" in f["message"]
        assert f["cause"] == "host"  # the profiled window (steps 5-9) saw step 7's sleep

    verdict(tmp_path_factory, "stall_every_4th", check)
