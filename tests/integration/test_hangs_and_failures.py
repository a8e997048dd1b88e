"""Issue 21: real stuck and failing 2-rank gloo jobs under ``gpudiag run``.

Truth by construction (tests/integration/scripts/hang_job.py): rank 1 blocks in its
loader, spins in pure Python, skips a collective or all-reduces another size at step 5
(7 for the size mismatch, inside the default profiler window 5:10). Small timeouts keep
each job well under a minute: --hang-timeout 15 (8 for the spinning rank, which burns a
core until then, and for the cases beyond the two named ones), and a gloo timeout above it
so the watchdog, not gloo, finds the hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, job_env
from run_helpers import TORCHRUN, run_gpudiag, step_lines, wait_for

from gpudiag.rundir import layout as rundir

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

JOB = ROOT / "tests" / "integration" / "scripts" / "hang_job.py"
HANG = ["--hang-timeout", "15", "--on-hang", "kill", "--no-nvml"]
# the cases beyond the two named ones find the hang sooner (CI time)
HANG_SOON = ["--hang-timeout", "8", "--on-hang", "kill", "--no-nvml"]


def _run(
    tmp_path: Path, cause: str, *extra: str, gloo_timeout: int = 100, job: tuple = ()
) -> tuple:
    out = tmp_path / "run"
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            *extra,
            "--",
            *TORCHRUN,
            str(JOB),
            "--cause",
            cause,
            "--gloo-timeout",
            str(gloo_timeout),
            *job,
        ],
        timeout=150,
    )
    return out, r


def _diagnosis(out: Path) -> dict:
    r = run_gpudiag(["analyze", str(out), "-f", "json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _stall_to_report_s(out: Path) -> float:
    """From the last step any rank finished to the printed hang report."""
    last = max(s["end_ns"] for r in (0, 1) for s in step_lines(rundir.steps_path(out, r)))
    m = json.loads((out / "manifest.json").read_text())
    return (m["extra"]["hang"]["report_ns"] - last) / 1e9


@pytest.mark.parametrize(
    ("cause", "function"), [("loader", "load_batch"), ("spin", "spin_forever")]
)
def test_stuck_rank_is_named_with_where_it_is(tmp_path: Path, cause: str, function: str) -> None:
    # the spinning rank burns a core until the watchdog fires: it gets the shorter timeout
    watchdog = HANG_SOON if cause == "spin" else HANG
    out, r = _run(tmp_path, cause, "--profile-steps", "off", *watchdog)
    assert r.returncode == 124, r.stderr[-3000:]
    line = next(x for x in r.stderr.splitlines() if "STUCK:" in x)
    assert "all_reduce #" in line and "on the default group (pg 0, 2 ranks" in line
    assert "rank 1 never entered it; rank 0 has waited in it" in line
    assert f"rank 1 is in {function} (hang_job.py:" in line
    assert "since step 5" in line
    assert _stall_to_report_s(out) < 60
    d = _diagnosis(out)
    assert d["verdict"]["bottleneck"] == "hang" and d["verdict"]["ranks"] == [1]
    (hang,) = [f for f in d["findings"] if f["kind"] == "hang"]
    m = hang["metrics"]
    assert hang["ranks"] == [1] and hang["steps"] == [5]
    assert m["op"] == "all_reduce" and m["waiting_ranks"] == [0]
    assert m["process_group"] == {"name": "0", "desc": "default_pg"}
    timeout_s = int(watchdog[watchdog.index("--hang-timeout") + 1])
    assert m["waited_ns"] >= (timeout_s - 1) * 1e9 and m["evidence"] == "flight recorder"
    assert m["where"]["1"][0]["name"] == function
    # the run says gpudiag ended it; no rank is blamed for that
    (failed,) = [f for f in d["findings"] if f["kind"] == "job_failed"]
    assert failed["metrics"]["how"] == "killed by gpudiag" and failed["ranks"] == []
    assert "first_rank" not in failed["metrics"]


def test_skipped_collective_is_a_mismatch(tmp_path: Path) -> None:
    out, r = _run(tmp_path, "skip", "--profile-steps", "off", *HANG_SOON)
    assert r.returncode == 124, r.stderr[-3000:]
    assert "MISMATCH: rank 1 called all_reduce as collective #" in r.stderr
    d = _diagnosis(out)
    assert d["verdict"]["bottleneck"] == "mismatch"
    (mm,) = [f for f in d["findings"] if f["kind"] == "collective_mismatch"]
    assert mm["ranks"] == [1]
    assert mm["metrics"]["mismatches"][0]["field"] == "op"
    assert mm["metrics"]["mismatches"][0]["found"] == "all_reduce"
    assert mm["metrics"]["mismatches"][0]["expected"] == "broadcast"


def test_size_mismatch_names_the_first_failing_rank_and_step(tmp_path: Path) -> None:
    # gloo aborts rank 1 (SIGABRT) when the sizes meet; rank 0 then loses its peer
    out, r = _run(tmp_path, "mismatch", *HANG, job=("--at-step", "7"))
    assert r.returncode not in (0, 124), r.stderr[-3000:]  # the job's own code
    d = _diagnosis(out)
    v = d["verdict"]
    assert v["bottleneck"] == "failure" and v["ranks"] == [1]
    assert v["headline"].startswith("failed: rank 1 failed first, in step 7")
    (failed,) = [f for f in d["findings"] if f["kind"] == "job_failed"]
    m = failed["metrics"]
    assert (m["first_rank"], m["step"], m["how"], m["collective"]) == (1, 7, "signal", "all_reduce")
    assert "Aborted" in m["error"] and "main (hang_job.py:" in m["where"]
    # rank 0 then loses its peer, or torchrun stops it before it records that
    assert all(o["rank"] == 0 and o["how"] in ("connection", "killed") for o in m["others"]), m
    # the window 5:10 was reached: rank 1's trace is lost, and the partial step is left out
    man = json.loads((out / "manifest.json").read_text())
    # (rank 0 may save its partial window at exit, or die while exporting it too)
    reason = man["sources"]["kineto"]["reason"]
    assert (
        "trace lost: rank 1 in step 7" in reason or "lost: ranks [0, 1] ended in step 7" in reason
    )
    assert all(s["step"] < 7 for s in d["steps"])
    assert not any("not reached" in f["message"] for f in d["findings"])


def test_report_mode_leaves_the_job_to_its_timeout(tmp_path: Path) -> None:
    # the stall at step 7 lies in the default profiler window 5:10; the job dies by its
    # own gloo timeout and the trace saved at exit holds the partial step 7 (20 s)
    out, r = _run(
        tmp_path,
        "loader",
        "--hang-timeout",
        "8",
        "--no-nvml",
        gloo_timeout=20,
        job=("--at-step", "7"),
    )
    assert r.returncode not in (0, 124), r.stderr[-3000:]
    assert "STUCK: all_reduce #" in r.stderr and "rank 1 never entered it" in r.stderr
    d = _diagnosis(out)
    assert d["verdict"]["bottleneck"] == "hang" and d["verdict"]["ranks"] == [1]
    man = json.loads((out / "manifest.json").read_text())
    assert man["extra"]["hang"]["killed"] is False
    # the step that never finished feeds no share and no remedy
    assert d["steps"] and all(s["step"] < 7 for s in d["steps"])
    assert all(s["duration_ns"] < 5e9 for s in d["steps"])
    assert all((r.get("estimated_gain_ns") or 0) < 1e9 for r in d["recommendations"])
    (failed,) = [f for f in d["findings"] if f["kind"] == "job_failed"]
    assert failed["metrics"]["first_rank"] == 0 and failed["metrics"]["how"] == "timeout"


def test_ctrl_c_stops_the_job_diagnoses_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudiag",
            "run",
            "--out",
            str(out),
            "--profile-steps",
            "off",
            "--no-nvml",
            "--",
            *TORCHRUN,
            str(JOB),
            "--cause",
            "loader",
            "--gloo-timeout",
            "100",
        ],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        wait_for(lambda: len(step_lines(rundir.steps_path(out, 0))) >= 5, timeout=90)
        time.sleep(1.0)
        os.kill(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, stderr[-3000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["extra"]["interrupted"]["signal"] == "SIGINT"
    flat = " ".join(stdout.split())  # the verdict wraps at the console's width
    assert "verdict: interrupted in step " in flat and "(Ctrl-C); until then: " in flat


def test_nested_groups_root_stall_explains_the_other(tmp_path: Path) -> None:
    # 3 ranks; group tp = [0, 1]: rank 1 blocks in its loader, rank 0 waits in tp's
    # all_reduce, rank 2 in the default group's all_reduce that ranks 0 and 1 never reach
    out = tmp_path / "run"
    r = run_gpudiag(
        [
            "run",
            "--out",
            str(out),
            "--profile-steps",
            "off",
            *HANG_SOON,
            "--",
            "torchrun",
            "--standalone",
            "--nproc-per-node",
            "3",
            str(JOB),
            "--cause",
            "nested",
            "--gloo-timeout",
            "100",
        ],
        timeout=150,
    )
    assert r.returncode == 124, r.stderr[-3000:]
    d = _diagnosis(out)
    # one finding: the root; the default group's stall is listed under it as an effect
    (root,) = [f for f in d["findings"] if f["kind"] == "hang"]
    assert d["verdict"]["ranks"] == [1] and root["ranks"] == [1]
    assert root["metrics"]["process_group"]["desc"] == "tp"
    assert root["metrics"]["waiting_ranks"] == [0]
    assert root["metrics"]["where"]["1"][0]["name"] == "load_batch"
    (effect,) = root["metrics"]["effects"]
    assert effect["op"].startswith("all_reduce #") and effect["op"].endswith("(default_pg, pg 0)")
    assert effect["waiting_ranks"] == [2]
