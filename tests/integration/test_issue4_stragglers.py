"""Real 2-rank CPU DDP jobs under `gpudiag run` with injected stragglers.

The demo job sleeps, reads slowly or stalls on one rank; gpudiag must name that rank, the
cause and (for the intermittent stall) the steps, and must stay silent on a balanced run.
"""

import json
import sys

import pytest
from cli_runner import run_cli
from noisy_host import first_clean

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

JOBS = {
    "balanced": [],
    "sleepy_rank": ["--sleep-rank", "1", "--sleep-s", "0.1"],
    "slow_data_rank": ["--slow-data", "0.00002", "--slow-data-rank", "1"],
    "stall_every_4th": ["--sleep-rank", "1", "--sleep-s", "0.25", "--sleep-every", "4"],
}


def diagnose_job(tmp_path_factory, name: str) -> dict:
    d = tmp_path_factory.mktemp(name) / "run"
    r = run_cli("run", "--no-analyze", "--quiet", "--out", str(d), "--",
                sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", "-m", "gpudiag.demo.train", "--steps", "16", "--pin",
                *JOBS[name], timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    a = run_cli("analyze", str(d), "--format", "json")
    assert a.returncode == 0, a.stderr
    return json.loads(a.stdout)


@pytest.fixture(scope="module")
def diagnoses(tmp_path_factory) -> dict[str, dict]:
    return {name: diagnose_job(tmp_path_factory, name) for name in JOBS if name != "balanced"}


def stragglers(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == "straggler"]


def test_balanced_run_has_no_straggler(tmp_path_factory):
    # a balanced job can still be unbalanced by the shared host: see tests/noisy_host.py
    first_clean(
        lambda i: diagnose_job(tmp_path_factory, "balanced"),
        lambda doc: [f["message"] for f in stragglers(doc)],
    )


def test_rank_that_sleeps_every_step_is_a_persistent_host_straggler(diagnoses):
    (f,) = stragglers(diagnoses["sleepy_rank"])
    assert f["ranks"] == [1] and f["persistent"] is True and f["cause"] == "host"
    assert f["wait_caused_ns"] > 0
    recs = diagnoses["sleepy_rank"]["recommendations"]
    assert recs[0]["id"] == "investigate-rank-1"


def test_rank_with_a_slow_dataset_is_a_data_straggler(diagnoses):
    (f,) = stragglers(diagnoses["slow_data_rank"])
    assert f["ranks"] == [1] and f["cause"] == "data" and f["persistent"] is True
    ids = [r["id"] for r in diagnoses["slow_data_rank"]["recommendations"]]
    assert "investigate-rank-1" in ids and "dataloader" in ids


def test_rank_that_stalls_every_4th_step_is_intermittent_with_its_steps(diagnoses):
    (f,) = stragglers(diagnoses["stall_every_4th"])
    assert f["ranks"] == [1] and f["persistent"] is False
    assert f["steps"] == [3, 7, 11, 15]
    assert "every 4th step" in f["message"]
    assert f["cause"] == "host"  # the profiled window (steps 5-9) saw step 7's sleep
