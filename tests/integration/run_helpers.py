"""Helpers for tests that run ``python -m gpudiag`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from cli_runner import ROOT, job_env, run_cli

DEMO = ROOT / "gpudiag" / "demo" / "train.py"


def run_gpudiag(
    args: list[str], timeout: float = 120, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=timeout)


def start_gpudiag(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpudiag", *args],
        env=job_env(),
        stdout=open(tmp / "stdout.txt", "w"),
        stderr=open(tmp / "stderr.txt", "w"),
        text=True,
        cwd=ROOT,
    )


def wait_for(pred: object, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def step_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == "step":
            out.append(rec)
    return out


TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "2"]


def run_direct(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a job without gpudiag, in the environment the gpudiag runs of the tests use.

    Like ``run_cli``, it runs the job once more after torch's rare CPU teardown abort (a
    known gloo/Kineto race at interpreter exit, see noisy_host.TEARDOWN_CRASH), and after
    a run that did not exit within ``timeout`` (seen once on a loaded host: a 4-step torch
    script that had printed its last line was still exiting 120 s later). This is the
    reference run without gpudiag, so running it again hides nothing of gpudiag's.
    """
    from noisy_host import TEARDOWN_CRASH

    def once() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=job_env(),
            timeout=timeout,
            cwd=ROOT,
            check=False,
        )

    try:
        r = once()
    except subprocess.TimeoutExpired:
        return once()
    if r.returncode != 0 and TEARDOWN_CRASH in r.stderr:
        r = once()
    return r


def job_stderr_lines(stderr: str) -> list[str]:
    """The lines of a combined stderr that are not gpudiag's own."""
    return [x for x in stderr.splitlines() if not x.startswith("gpudiag:")]
