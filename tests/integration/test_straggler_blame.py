"""A real compute straggler beside a CPU hog is the job's, and its story holds (issue 30).

A 2-rank gloo job under ``gpudiag run`` whose rank 1 does 150 ms of extra matrix products
every step (the injected truth), while a busy loop started by the test takes a core of
this 2-core host. One run, shared by every assertion: the verdict names rank 1 as the
straggler (not "busy host"), no communication remedy claims more than the transfer (the
least comm-wait of any rank, a step), and "all together" is not below rank 0's own work
(40 ms of injected matrix products a step, and its median compute in the profiled window).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ROOT, run_cli

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

JOB = str(Path(__file__).parent / "scripts" / "alert_job.py")
WORK_MS = 40  # every rank's matrix products a step
EXTRA_S = 0.15  # rank 1's extra matrix products a step
COMM_REMEDIES = ("comm-overlap", "grad-accumulation", "grad-compression")


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("blame") / "run"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], cwd=ROOT)
    try:
        r = run_cli(
            "run",
            "--no-analyze",
            "--quiet",
            "--out",
            str(out),
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            JOB,
            "--steps",
            "24",
            "--onset",
            "0",
            "--work-ms",
            str(WORK_MS),
            "--compute",
            "--straggle-rank",
            "1",
            "--straggle-s",
            str(EXTRA_S),
            "--straggle-compute",
            timeout=240,
        )
    finally:
        hog.kill()
        hog.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    a = run_cli("analyze", str(out), "--format", "json")
    assert a.returncode == 0, a.stderr
    d: dict[str, Any] = json.loads(a.stdout)
    print("verdict:", d["verdict"]["headline"])
    print("what-if:", d["what_if"])
    for f in d["findings"]:
        if f["kind"] == "straggler":
            print("straggler:", f["message"])
            print("blame over time:", f["metrics"].get("contention_follow"))
    print("recommendations:", [(x["id"], x["estimated_gain_ns"]) for x in d["recommendations"]])
    return d


def test_the_compute_straggler_is_the_jobs_not_the_hosts(doc: dict[str, Any]) -> None:
    head = doc["verdict"]["headline"]
    assert head.startswith("straggler: rank 1"), head
    assert "busy host" not in head and "likely the host" not in head
    (f,) = [f for f in doc["findings"] if f["kind"] == "straggler"]
    assert f["ranks"] == [1] and f["persistent"] is True and f["severity"] == "error"
    assert "host_contention" not in f["metrics"]
    assert "investigate-rank-1" in [r["id"] for r in doc["recommendations"]]


def test_no_communication_remedy_claims_the_stragglers_time(doc: dict[str, Any]) -> None:
    recs = {r["id"]: r["estimated_gain_ns"] or 0 for r in doc["recommendations"]}
    strag = recs["investigate-rank-1"]
    assert strag >= 0.5 * EXTRA_S * 1e9  # most of the injected 150 ms
    # The last rank to arrive waits for the transfer alone: per profiled step, the least
    # comm-wait of any rank, read from the steps here. Rank 0's wait holds the straggler's
    # 150 ms; a communication remedy may claim the transfer, never that (beside the hog the
    # transfer itself took ~16 ms a step once: a tenth of the straggler's gain is no bound)
    by_step: dict[int, list[int]] = {}
    for x in doc["steps"]:
        by_step.setdefault(x["step"], []).append(x["comm_wait_ns"] or 0)
    least = sorted(min(w) for w in by_step.values() if len(w) == 2)
    transfer = least[len(least) // 2]
    waits0 = sorted(x["comm_wait_ns"] or 0 for x in doc["steps"] if x["rank"] == 0)
    assert waits0[len(waits0) // 2] >= 0.5 * EXTRA_S * 1e9  # rank 0 waits for rank 1
    for rid in COMM_REMEDIES:
        assert recs.get(rid, 0) <= max(1.25 * transfer, transfer + 2e6), (rid, recs, transfer)


def test_the_phase_that_holds_the_others_back_is_rank_1s_pre_forward(doc: dict[str, Any]) -> None:
    # the job's extra work runs between the batch and the forward pass: the step
    # telemetry's phases name the rank and the phase the others wait for
    fr = doc["whole_run"]["frontier"]
    assert fr is not None and (fr["rank"], fr["phase"]) == (1, "pre_forward"), fr
    assert fr["steps"] >= 0.8 * fr["steps_compared"]
    assert fr["excess_ns_median"] >= 0.5 * EXTRA_S * 1e9
    # constant from the first step, it is no input wait: no data-bound finding
    assert not [f for f in doc["findings"] if f["kind"] == "data_bound"]


def test_all_together_is_not_below_rank_0s_work(doc: dict[str, Any]) -> None:
    w = doc["what_if"]
    assert w["statistic"] == "median"
    computes = sorted(s["compute_ns"] for s in doc["steps"] if s["rank"] == 0)
    median = computes[len(computes) // 2]
    assert w["if_all_ns"] >= WORK_MS * 1e6, w  # the injected work alone
    assert w["if_all_ns"] >= median * 0.99, (w, median)
    assert w["critical_rank"] == 0
