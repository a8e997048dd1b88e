"""``gpudiag analyze``: its options, for typer; it calls :func:`~gpudiag.cli.analyzing.run_analyze`.

The common spellings of the command run without typer (:mod:`gpudiag.cli.quick`, whose
table of these options a test holds equal to this signature).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpudiag.cli import help as clihelp
from gpudiag.cli.analyzing import run_analyze
from gpudiag.cli.common import NoCache, NoColor, app


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
    run_analyze(
        paths,
        steps=steps,
        fmt=fmt,
        output=output,
        idle_threshold=idle_threshold,
        step_marker=step_marker,
        data_marker=data_marker,
        jobs=jobs,
        nsys=nsys,
        include_warmup=include_warmup,
        scheduler=scheduler,
        timeline=timeline,
        timeline_full=timeline_full,
    )
