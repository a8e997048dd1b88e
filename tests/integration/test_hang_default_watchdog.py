"""A plain ``gpudiag run`` (no --hang-timeout) reports a stuck job while it runs.

Truth by construction (tests/integration/scripts/hang_job.py --cause loader): rank 1 blocks
in its loader at step 5; rank 0 then waits in the step's all_reduce. The default rule
(``Thresholds.hang``: no rank finished a step for the larger of 60 s and 10 × the median
step) must say so on stderr within 2 minutes of the stall, name rank 1, and say how to end
the job or wait; the job itself is left running (``--on-hang report``), so the test ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, job_env
from run_helpers import TORCHRUN, step_lines

from gpudiag.config import Thresholds
from gpudiag.rundir import layout as rundir

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_required")]

JOB = ROOT / "tests" / "integration" / "scripts" / "hang_job.py"


def test_default_rule_is_at_most_a_minute_for_short_steps() -> None:
    h = Thresholds().hang
    assert (h.timeout_s, h.min_timeout_s, h.step_factor) == (0.0, 60.0, 10.0)


def test_plain_run_reports_a_stall_within_two_minutes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = tmp_path / "stderr.txt"
    with err.open("w") as f:
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
                "400",
            ],
            env=job_env(),
            stdout=subprocess.DEVNULL,
            stderr=f,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            stalled_at = None
            end = time.monotonic() + 300
            while time.monotonic() < end and "STUCK:" not in err.read_text():
                if stalled_at is None and len(step_lines(rundir.steps_path(out, 1))) >= 5:
                    stalled_at = time.monotonic()  # rank 1 finished step 4: it stalls in step 5
                assert p.poll() is None, err.read_text()[-3000:]
                time.sleep(0.5)
            reported_at = time.monotonic()
            time.sleep(1.0)
            text = err.read_text()
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    assert "STUCK:" in text, text[-3000:]
    assert stalled_at is not None
    print(f"stall to report: {reported_at - stalled_at:.1f} s")
    assert reported_at - stalled_at < 120, (reported_at - stalled_at, text[-3000:])
    line = next(x for x in text.splitlines() if "STUCK:" in x)
    assert "rank 1 never entered it" in line and "load_batch" in line
    assert "the job looks stuck: no rank finished a step for" in text
    assert "the larger of 60 s and 10 × the median step" in text
    assert "the job is left running (--on-hang report): press Ctrl-C to end it" in text
