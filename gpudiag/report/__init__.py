"""Renderer registry by ``--format`` name and by output extension."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpudiag.analysis.model import Diagnosis
from gpudiag.errors import UsageError

Renderer = Callable[..., None]


def _console(d: Diagnosis, out: TextIO, **kw: Any) -> None:
    from gpudiag.report.console import render

    render(d, out, **kw)


def _json(d: Diagnosis, out: TextIO, **kw: Any) -> None:
    from gpudiag.report.json_report import render

    render(d, out)


def _csv(d: Diagnosis, out: TextIO, **kw: Any) -> None:
    from gpudiag.report.csv_report import render

    render(d, out)


def _markdown(d: Diagnosis, out: TextIO, **kw: Any) -> None:
    from gpudiag.report.markdown import render

    render(d, out)


RENDERERS: dict[str, Renderer] = {
    "table": _console,
    "json": _json,
    "csv": _csv,
    "markdown": _markdown,
}
EXTENSIONS = {".json": "json", ".csv": "csv", ".txt": "table", ".md": "markdown"}


def pick_format(fmt: str | None, output: Path | None) -> str:
    """The renderer name: ``--format`` wins, else the output file's extension, else a table."""
    if fmt:
        if fmt not in RENDERERS:
            raise UsageError(
                f"unknown format {fmt!r}", f"choose one of: {', '.join(sorted(RENDERERS))}"
            )
        return fmt
    if output is not None:
        return EXTENSIONS.get(output.suffix.lower(), "table")
    return "table"
