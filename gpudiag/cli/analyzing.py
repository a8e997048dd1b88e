"""What ``gpudiag analyze`` does, without typer: reached from typer's command and the quick path."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpudiag.cli.base import emit, state, thresholds
from gpudiag.config import Thresholds
from gpudiag.errors import EXIT_USAGE, GpudiagError


def run_analyze(
    paths: list[Path],
    *,
    steps: bool = False,
    fmt: str | None = None,
    output: Path | None = None,
    idle_threshold: float | None = None,
    step_marker: str | None = None,
    data_marker: str | None = None,
    jobs: int | None = None,
    nsys: Path | None = None,
    include_warmup: bool = False,
    scheduler: str | None = None,
    timeline: Path | None = None,
    timeline_full: bool = False,
) -> None:
    """Diagnose ``paths`` and render the diagnosis (the options as ``gpudiag analyze --help``)."""
    if timeline_full and timeline is None:
        raise GpudiagError(
            "--timeline-full adds to --timeline", "give --timeline FILE too", EXIT_USAGE
        )
    th = thresholds(idle_ratio_max=idle_threshold, step_re=step_marker, data_re=data_marker)
    if include_warmup:
        th = th.replace(steady=dataclasses.replace(th.steady, include_warmup=True))
    d = _diagnose_paths(paths, th, jobs, nsys, scheduler, timeline, timeline_full)
    emit(d, fmt, output, show_steps=steps)


def _quiet_dask() -> None:
    """Dask's loggers at ERROR (its retries are noise on gpudiag's stderr).

    Importing ``distributed`` sets ``distributed.client`` and others to their configured
    levels, so it is imported first (when installed) and then every one of them is set.
    """
    import importlib.util
    import logging

    if importlib.util.find_spec("distributed") is not None:
        import distributed  # noqa: F401

    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.ERROR)


def _diagnose_paths(
    paths: list[Path],
    th: Thresholds,
    jobs: int | None,
    nsys: Path | None,
    scheduler: str | None,
    timeline: Path | None,
    timeline_full: bool,
) -> Any:
    """``api.analyze`` with the scheduler chosen and a progress bar on a terminal."""
    from gpudiag.api import load as api
    from gpudiag.config import scheduler_address
    from gpudiag.report.live import analysis_progress

    address = scheduler_address(scheduler, th)
    if address is not None:  # stderr carries gpudiag's own lines: Dask's are retried noise
        _quiet_dask()
    if address is not None and jobs is not None:
        raise GpudiagError(
            "--jobs bounds local processes; with a Dask scheduler leave it out",
            f"the cluster at {address} decides",
            EXIT_USAGE,
        )
    hook, bar = analysis_progress()
    try:
        return api.analyze(
            *paths,
            thresholds=th,
            jobs=jobs,
            nsys=str(nsys) if nsys else None,
            scheduler=address,
            progress=hook,
            timeline=timeline,
            timeline_full=timeline_full,
            cache=state["cache"],
        )
    finally:
        if bar is not None:
            bar.stop()
