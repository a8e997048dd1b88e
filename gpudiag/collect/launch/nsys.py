"""Optional: prefixes the launch with `nsys profile`, then exports to SQLite.

``gpudiag run --nsys`` wraps the whole job in ``nsys profile`` (CUDA, NVTX and OS runtime
tracing). With ``--nsys-range window`` (the default) collection is limited to gpudiag's
profiled window through the CUDA profiler API: each rank's hook calls
``cudaProfilerStart``/``Stop`` around the window, so reports stay small; ``all`` records
the whole run (needed for jobs that do not use CUDA). One report per node lands in
``nsys/``; it is exported to SQLite beside it when the job ends, so ``gpudiag analyze
RUN_DIR`` can read it. Export failures are recorded in the manifest, never raised.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpudiag._support import nsysbin
from gpudiag.errors import EnvironmentProblem
from gpudiag.rundir import layout as rundir

RANGES = ("window", "all")
ENV_RANGE = "GPUDIAG_NSYS_RANGE"
EXPORT_TIMEOUT_S = 600


def resolve() -> tuple[str, str]:
    """(nsys path, version), or EnvironmentProblem before anything is launched."""
    path, why = nsysbin.locate()
    if path is None:
        raise EnvironmentProblem(
            f"--nsys: {why}",
            "install Nsight Systems (NVIDIA's nsight-systems-cli, or Debian's "
            "nsight-systems-target) or run without --nsys",
        )
    return path, nsysbin.version(path)


def report_base(run_dir: Path, node_rank: int) -> Path:
    """The report's path without extension: ``nsys/node-<k>``."""
    return run_dir / rundir.NSYS_DIR / f"node-{node_rank}"


def profile_command(nsys: str, base: Path, command: list[str], range_: str) -> list[str]:
    """``nsys profile … COMMAND`` writing ``base.nsys-rep``."""
    if range_ not in RANGES:
        raise ValueError(f"nsys range {range_!r} not in {RANGES}")
    cmd = [
        nsys,
        "profile",
        "--trace=cuda,nvtx,osrt",
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=true",
        f"--output={base}",
    ]
    if range_ == "window":
        cmd += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    return [*cmd, *command]


def collect(nsys: str, run_dir: Path, node_rank: int) -> rundir.SourceStatus:
    """Export the node's report to SQLite; what was captured, or why not."""
    base = report_base(run_dir, node_rank)
    reports = [
        p for p in (base.with_suffix(".nsys-rep"), base.with_suffix(".qdrep")) if p.is_file()
    ]
    if not reports:
        if base.with_suffix(".qdstrm").is_file():
            return rundir.SourceStatus(
                False,
                "this nsys wrote only a raw .qdstrm (it has no importer, e.g. Debian's "
                "nsight-systems-target); install the full Nsight Systems CLI to get a report",
                files=[str(base.with_suffix(".qdstrm").relative_to(run_dir))],
            )
        return rundir.SourceStatus(
            False, "nsys produced no report (did the job reach the profiled window on CUDA?)"
        )
    report = reports[0]
    out = base.with_suffix(".sqlite")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.sqlite")
    files = [str(report.relative_to(run_dir))]
    try:
        r = subprocess.run(
            nsysbin.export_command(report, tmp, nsys),
            capture_output=True,
            text=True,
            timeout=EXPORT_TIMEOUT_S,
            check=False,
        )
        if r.returncode != 0 or not tmp.is_file():
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            return rundir.SourceStatus(False, f"nsys export failed: {tail[0]}", files=files)
        os.replace(tmp, out)
    except (OSError, subprocess.TimeoutExpired) as e:
        return rundir.SourceStatus(False, f"nsys export failed: {e}", files=files)
    finally:
        tmp.unlink(missing_ok=True)
    return rundir.SourceStatus(True, files=[*files, str(out.relative_to(run_dir))])
