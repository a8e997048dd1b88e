"""Finds the Nsight Systems binary and reads its version; shared by collect and traces.

Order: ``GPUDIAG_NSYS`` (set by ``--nsys``), then ``nsys`` on PATH, then the usual install
places (Debian's ``nsight-systems-target``, ``/opt/nvidia/nsight-systems/*``, CUDA's bin).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

USUAL_PLACES = (
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",  # Debian package
    "/usr/local/cuda/bin/nsys",
)


def locate(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(path, "") when nsys is found, else (None, why not)."""
    env = dict(os.environ) if env is None else env
    forced = env.get("GPUDIAG_NSYS")
    if forced:
        if os.path.isfile(forced) and os.access(forced, os.X_OK):
            return forced, ""
        return None, f"GPUDIAG_NSYS={forced} is not an executable file"
    found = shutil.which("nsys", path=env.get("PATH"))
    if found:
        return found, ""
    opt = sorted(map(str, Path("/opt/nvidia/nsight-systems").glob("*/bin/nsys")), reverse=True)
    for p in (USUAL_PLACES[0], *opt, *USUAL_PLACES[1:]):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p, ""
    return None, "nsys not found (not on PATH; set GPUDIAG_NSYS or pass --nsys PATH)"


def version(nsys: str) -> str:
    """``2022.4.2.1`` from ``nsys --version`` (``?`` when it cannot be told)."""
    try:
        r = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    m = re.search(r"(\d{4}\.\d+(?:\.\d+)*)", r.stdout + r.stderr)
    return m.group(1) if m else "?"


def export_command(report: Path, out: Path, nsys: str = "nsys") -> list[str]:
    """``nsys export`` of ``report`` to a SQLite file ``out`` (overwritten, quiet)."""
    return [
        nsys,
        "export",
        "--type",
        "sqlite",
        "--force-overwrite",
        "true",
        "--quiet",
        "true",
        "--output",
        str(out),
        str(report),
    ]
