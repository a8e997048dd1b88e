"""Issue 15, part 1: `gpudiag run` records what else the host was doing.

A CPU hog (one full core) runs beside a job that spins one core for 4 s. The hog's CPU
must land in ``other_cpu_ratio`` (and be named in ``top_other``), the job's in
``job_cpu_ratio``, each matching what the test measures of those processes itself. The
shares are checked against the processes' own /proc counters rather than against a run
without the hog, because the other users of this host change between two runs; the hog
is an effect of a quarter to half of all CPUs, the tolerance 0.1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from cli_runner import run_cli

from gpudiag.collect.samplers.conditions import TOP_OTHER, TOP_OTHER_MIN_RATIO, ProcFS, parse_stat
from gpudiag.rundir import layout as rundir

SPIN = (
    "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\nprint(time.process_time())\n"
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _own_jiffies(pid: int) -> int:
    st = ProcFS().processes()[pid]
    return st.own


def _total_jiffies() -> int:
    cpu = parse_stat(Path("/proc/stat").read_text())
    assert cpu is not None
    return cpu.total


def test_cpu_hog_beside_the_job_is_other_cpu(tmp_path: Path) -> None:
    # GIVEN a hog spinning one core for the whole run
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        h0, t0 = _own_jiffies(hog.pid), _total_jiffies()
        out = tmp_path / "run"
        r = run_cli(
            "run",
            "--out",
            str(out),
            "--no-analyze",
            "--no-nvml",
            "--",
            sys.executable,
            "-c",
            SPIN.format(s=4),
        )
        h1, t1 = _own_jiffies(hog.pid), _total_jiffies()
    finally:
        hog.kill()
        hog.wait()
    assert r.returncode == 0, r.stderr
    hog_share = (h1 - h0) / (t1 - t0)
    # it really ran (on a quiet 2-CPU host it takes ~0.5; beside other tests' jobs far less)
    assert hog_share >= 0.02
    m = rundir.read_manifest(out / "manifest.json")
    assert m.conditions is not None
    c = m.conditions.to_json()
    assert m.sources["conditions"].files == [c["file"]]
    samples = [json.loads(x) for x in (out / c["file"]).read_text().splitlines()][1:]
    assert c["samples"] == len(samples) >= 4
    # THEN the hog is outside the job: in other_cpu_ratio, named among the top others
    assert c["other_cpu_ratio_mean"] >= hog_share - 0.1, (c, hog_share)
    top = {t["pid"]: t for t in c["top_other"]}
    # the three busiest others are named: a hog left out used no more than the least of them
    # (other tests' jobs beside it may outrank or tie a starved hog: seen 0.162 against named
    # 0.160, 0.157, 0.148, all within the two readings' different intervals); named, its
    # share is the one measured here
    # (fewer named: every other above the sampler's floor is)
    named = [t["cpu_ratio_mean"] for t in top.values()]
    least = min(named) if len(named) == TOP_OTHER else TOP_OTHER_MIN_RATIO
    assert hog.pid in top or hog_share < least + 0.1, (top, hog_share)
    if hog.pid in top:
        assert abs(top[hog.pid]["cpu_ratio_mean"] - hog_share) < 0.1, (top[hog.pid], hog_share)
    # AND the job's spinning is the job's: its own CPU time over the sampled window
    window_s = (samples[-1]["time_ns"] - samples[0]["time_ns"]) / 1e9
    job_share = float(r.stdout) / (window_s * c["cpus"])
    assert abs(c["job_cpu_ratio_mean"] - job_share) < 0.1, (c["job_cpu_ratio_mean"], job_share)
    assert c["other_cpu_ratio_mean"] + c["job_cpu_ratio_mean"] <= c["cpu_busy_ratio_mean"] + 0.01
    # the job: one python while it runs; a loaded host may sample it before /proc lists it
    # and, while gpudiag winds down, several times after it ended (0): 1s, 0s only at the edges
    counts = "".join(str(s["job_processes"]) for s in samples)
    assert re.fullmatch(r"0?1{3,}0*", counts), counts
    assert c["sample_cost_us_mean"] < 50_000  # 0.8 ms measured on this host; 5% of a core


JOB = "import sys, time\ntime.sleep(2.5)\nprint('job output')\nsys.exit(7)\n"


def test_conditions_faults_never_reach_the_job(tmp_path: Path) -> None:
    # GIVEN a failing second sample, then (another run) a conditions/ that cannot be written
    failing = run_cli(
        "run",
        "--out",
        str(tmp_path / "a"),
        "--no-analyze",
        "--",
        sys.executable,
        "-c",
        JOB,
        env={"GPUDIAG_FAULT": "conditions:sample@1"},
    )
    blocked = tmp_path / "b"
    blocked.mkdir()
    (blocked / "conditions").write_text("in the way")
    unwritable = run_cli(
        "run", "--out", str(blocked), "--no-analyze", "--", sys.executable, "-c", JOB
    )
    # THEN the job's exit code and output are its own, and each loss is said once
    for r in (failing, unwritable):
        assert r.returncode == 7, r.stderr
        assert r.stdout == "job output\n"
    m = rundir.read_manifest(tmp_path / "a" / "manifest.json")
    assert m.conditions is not None and m.conditions.failed_samples == 1
    assert m.conditions.samples >= 2
    assert sum("run-conditions sample failed" in x for x in m.diagnosis_incomplete) == 1
    assert failing.stderr.count("run-conditions sample failed") == 1
    m = rundir.read_manifest(blocked / "manifest.json")
    assert not m.sources["conditions"].captured
    assert "cannot write" in m.sources["conditions"].reason
    assert sum("run-conditions sampler stopped" in x for x in m.diagnosis_incomplete) == 1
    assert m.exit_code == 7
