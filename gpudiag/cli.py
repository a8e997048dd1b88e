"""Thin typer app (run, collect, attach, analyze, report, gate, doctor); each command ≲ 20 lines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from gpudiag import __version__
from gpudiag.config import Thresholds, load_project_config, thresholds_from_config
from gpudiag.errors import EXIT_USAGE, GpudiagError

app = typer.Typer(
    name="gpudiag",
    help="Why is my distributed PyTorch training slow? Compute, data-wait, comm-wait, stragglers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)

_state: dict[str, Any] = {"debug": False}


def _version(value: bool) -> None:
    if value:
        print(f"gpudiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _state["debug"] = debug


def thresholds(**overrides: Any) -> Thresholds:
    """Defaults → [tool.gpudiag] → CLI options (``None`` means not given)."""
    return thresholds_from_config(load_project_config()).replace(**overrides)


def emit(render: Any, output: Path | None, binary: bool = False) -> None:
    """Call ``render(stream)`` on stdout, or on ``output`` written atomically."""
    if output is None:
        render(sys.stdout)
        return
    from gpudiag.rundir import atomic_write

    with atomic_write(output) as f:
        render(f)
    print(f"wrote {output}", file=sys.stderr)


def _render_diagnosis(d: Any, fmt: str, steps: bool) -> Any:
    from gpudiag.report import RENDERERS

    def go(out: TextIO) -> None:
        RENDERERS[fmt](d, out, show_steps=steps)

    return go


@app.command()
def analyze(
    paths: Annotated[
        list[Path], typer.Argument(help="Run directory, trace files, or directories of traces.")
    ],
    steps: Annotated[bool, typer.Option("--steps", help="Also print the per-step table.")] = False,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="table, json or csv.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report here.")
    ] = None,
    idle_threshold: Annotated[
        float | None, typer.Option("--idle-threshold", help="Flag idle ratios above this (0.30).")
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
) -> None:
    """Diagnose PyTorch Profiler traces or a gpudiag run directory."""
    from gpudiag.analysis.diagnose import analyze_paths
    from gpudiag.report import pick_format

    form = pick_format(fmt, output)
    th = thresholds(idle_ratio_max=idle_threshold, step_re=step_marker, data_re=data_marker)
    d = analyze_paths(*paths, thresholds=th, jobs=jobs)
    emit(_render_diagnosis(d, form, steps), output)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; print GpudiagError as one line plus a hint, exit with its code."""
    try:
        app(args=argv, standalone_mode=False)
    except GpudiagError as e:
        if _state["debug"]:
            raise
        print(f"gpudiag: error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"  hint: {e.hint}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("gpudiag: aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        show = getattr(e, "show", None)
        if callable(show) and hasattr(e, "exit_code"):  # click/typer usage errors
            show(file=sys.stderr)
            sys.exit(int(getattr(e, "exit_code", EXIT_USAGE) or EXIT_USAGE))
        if _state["debug"]:
            raise
        print(f"gpudiag: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            "  hint: re-run with --debug for the traceback, and please report it", file=sys.stderr
        )
        sys.exit(70)


# ---- capture commands (run, attach, doctor) ----
