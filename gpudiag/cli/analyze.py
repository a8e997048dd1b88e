"""``gpudiag analyze``: diagnose traces or a run directory, on this host or a Dask cluster."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from gpudiag.cli import help as clihelp
from gpudiag.cli.common import NoCache, NoColor, app, emit, state, thresholds
from gpudiag.config import Thresholds
from gpudiag.errors import EXIT_USAGE, GpudiagError


@app.command(cls=clihelp.Command)
def analyze(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Run directory, trace files, or directories of traces.", readable=False
        ),
    ],
    steps: Annotated[bool, typer.Option("--steps", help="Also print the per-step table.")] = False,
    fmt: Annotated[
        str | None, typer.Option("--format", "-f", help="table, json, csv, markdown or html.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report here.", readable=False)
    ] = None,
    idle_threshold: Annotated[
        float | None, typer.Option("--idle-threshold", help="Flag idle ratios above this (0.3).")
    ] = None,
    step_marker: Annotated[
        str | None, typer.Option("--step-marker", help="Regex for step ranges; group 1 = number.")
    ] = None,
    data_marker: Annotated[
        str | None, typer.Option("--data-marker", help="Regex for data-loading ranges.")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", help="Worker processes (CPUs).")
    ] = None,
    nsys: Annotated[
        Path | None, typer.Option("--nsys", help="nsys binary to export .nsys-rep reports with.")
    ] = None,
    include_warmup: Annotated[
        bool, typer.Option("--include-warmup", help="Keep slow leading (warm-up) steps.")
    ] = False,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            help="Analyse each rank file on this Dask scheduler's workers (tcp://HOST:PORT; "
            "`local`: here). Default: $DASK_SCHEDULER_ADDRESS, then [tool.gpudiag] scheduler.",
        ),
    ] = None,
    timeline: Annotated[
        Path | None,
        typer.Option(
            "--timeline",
            help="Also write the annotated timeline here (open it in ui.perfetto.dev), "
            "e.g. timeline.json.gz.",
        ),
    ] = None,
    timeline_full: Annotated[
        bool, typer.Option("--timeline-full", help="Add the raw kernels to --timeline.")
    ] = False,
    no_color: NoColor = False,
    no_cache: NoCache = False,
) -> None:
    """Diagnose PyTorch Profiler traces, Nsight Systems reports or a gpudiag run directory."""
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
