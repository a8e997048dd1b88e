"""Helpers for tests that run ``python -m gpudiag`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from noisy_host import retry_teardown_crash

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "gpudiag" / "demo" / "train.py"


def gpudiag_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.pop("GPUDIAG_RUN_DIR", None)
    env.pop("GPUDIAG_RANK_PID", None)
    return env


def run_gpudiag(
    args: list[str], timeout: float = 120, **kw: object
) -> subprocess.CompletedProcess[str]:
    cwd = kw.pop("cwd", ROOT)
    return retry_teardown_crash(
        args,
        lambda: subprocess.run(
            [sys.executable, "-m", "gpudiag", *args],
            env=gpudiag_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,  # type: ignore[arg-type]
            **kw,  # type: ignore[arg-type]
        ),
    )


def start_gpudiag(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpudiag", *args],
        env=gpudiag_env(),
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
