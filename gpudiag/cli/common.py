"""What every command shares: the typer app, the root options, thresholds, output, diagnoses.

The commands live in :mod:`gpudiag.cli.analyze`, :mod:`gpudiag.cli.capture` and
:mod:`gpudiag.cli.gate`; :mod:`gpudiag.cli.main` is the entry point that builds only the command
it runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpudiag import __version__
from gpudiag.cli import help as clihelp
from gpudiag.config import Thresholds, load_project_config, thresholds_from_config

app = typer.Typer(
    name="gpudiag",
    cls=clihelp.Group,
    help="Why is my distributed PyTorch training slow? Compute, data-wait, comm-wait, stragglers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)


state: dict[str, Any] = {"debug": False, "cache": True}


def _version(value: bool) -> None:
    if value:
        print(f"gpudiag {__version__}")
        raise typer.Exit()


def _no_color(value: bool) -> None:
    """``--no-color``: as ``NO_COLOR=1`` for everything this process prints."""
    if value:
        os.environ["NO_COLOR"] = "1"


NoColor = Annotated[
    bool,
    typer.Option("--no-color", callback=_no_color, help="No colour (also: NO_COLOR=1, TERM=dumb)."),
]


def _no_cache(value: bool) -> None:
    """``--no-cache``: analyse every trace file anew, and store nothing (gpudiag.fanout.cache)."""
    if value:
        state["cache"] = False


NoCache = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        callback=_no_cache,
        help="Read every trace anew; keep no per-rank results (also: GPUDIAG_NO_CACHE=1).",
    ),
]


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    no_color: NoColor = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    state["debug"] = debug
    state["cache"] = True  # until a command's --no-cache says otherwise


def thresholds(**overrides: Any) -> Thresholds:
    """Defaults → [tool.gpudiag] → CLI options (``None`` means not given)."""
    return thresholds_from_config(load_project_config()).replace(**overrides)


def emit(result: Any, fmt: str | None, output: Path | None, **options: Any) -> None:
    """Render ``result`` on stdout, or into ``output`` (:mod:`gpudiag._support.fileio` rules).

    The renderer picks the format for the result (``fmt``, else ``output``'s extension, else
    its default) and says what to warn about on stderr. ``-`` is stdout; a regular file (or
    a new one) is replaced atomically; a device, FIFO or symbolic link is written through;
    anything else is refused with one line.
    """
    from gpudiag.report import notices, renderer_for

    write = renderer_for(result, fmt, output, **options)
    for line in notices(result):
        print(line, file=sys.stderr)
    if output is None or str(output) == "-":
        write(sys.stdout)
        return
    from gpudiag._support.fileio import write_output

    with write_output(output) as f:
        write(f)
    print(f"wrote {output}", file=sys.stderr)


def diagnosis(path: Path, th: Thresholds, **kw: Any) -> Any:
    """A Diagnosis: a saved diagnosis JSON read back, anything else analysed."""
    from gpudiag.api import load as api

    return api.analyze(path, thresholds=th, cache=state["cache"], **kw)
