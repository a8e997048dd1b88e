"""Run the gpudiag CLI in a subprocess exactly as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpudiag ARGS`` as a user would, capturing both streams."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    from noisy_host import retry_teardown_crash

    return retry_teardown_crash(
        list(args),
        lambda: subprocess.run(
            [sys.executable, "-m", "gpudiag", *args],
            capture_output=True, text=True, cwd=cwd, env=e, timeout=timeout, check=False,
        ),
    )  # fmt: skip
