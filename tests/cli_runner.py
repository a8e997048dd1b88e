"""Run the gpudiag CLI in a subprocess exactly as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from testpaths import ROOT


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for gpudiag and the jobs it runs in tests.

    One intra-op thread per rank (steadier timings on a 2-core box), this checkout first on
    PYTHONPATH, and no run directory inherited from a gpudiag that runs pytest itself.
    """
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("GPUDIAG_RUN_DIR", None)
    e.pop("GPUDIAG_RANK_PID", None)
    e.update(extra or {})
    return e


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpudiag ARGS`` as a user would, capturing both streams."""
    from noisy_host import retry_teardown_crash

    e = job_env(env)
    return retry_teardown_crash(
        list(args),
        lambda: subprocess.run(
            [sys.executable, "-m", "gpudiag", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=e,
            timeout=timeout,
            check=False,
        ),
    )
