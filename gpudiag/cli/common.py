"""What every command shares: the typer app and its root options.

Their state, thresholds, output and diagnoses are in :mod:`gpudiag.cli.base` (no typer).

The commands live in :mod:`gpudiag.cli.analyze`, :mod:`gpudiag.cli.capture` and
:mod:`gpudiag.cli.gate`; :mod:`gpudiag.cli.main` is the entry point that builds only the command
it runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gpudiag import __version__
from gpudiag.cli import help as clihelp
from gpudiag.cli.base import set_no_cache, set_no_color, set_root

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


def _version(value: bool) -> None:
    if value:
        print(f"gpudiag {__version__}")
        raise typer.Exit()


def _no_color(value: bool) -> None:
    if value:
        set_no_color()


NoColor = Annotated[
    bool,
    typer.Option("--no-color", callback=_no_color, help="No colour (also: NO_COLOR=1, TERM=dumb)."),
]


def _no_cache(value: bool) -> None:
    if value:
        set_no_cache()


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
    set_root(debug)
