"""What every command shares that needs no typer: the state of the root options, thresholds, output.

:mod:`gpudiag.cli.common` adds the typer app and its root options; ``gpudiag analyze``'s
quick path (:mod:`gpudiag.cli.quick`) runs with this module alone, without typer.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gpudiag.config import Thresholds, load_project_config, thresholds_from_config

state: dict[str, Any] = {"debug": False, "cache": True}


def set_no_color() -> None:
    """``--no-color``: as ``NO_COLOR=1`` for everything this process prints."""
    os.environ["NO_COLOR"] = "1"


def set_no_cache() -> None:
    """``--no-cache``: analyse every trace file anew, and store nothing (gpudiag.fanout.cache)."""
    state["cache"] = False


def set_root(debug: bool) -> None:
    """The root options' state, before a command's own options."""
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
