"""Renderer registry: every result type (Diagnosis, gate, diff, doctor) by format.

The format is picked here, once the result exists (:func:`renderer_for`): ``--format``, or
the output file's extension (``.html``, ``.json``, ``.csv``, ``.md``, ``.xml``, ``.txt``),
checked against what the result's kind offers. Renderers only format what they are given;
they compute nothing new. :func:`notices` are the lines a command writes on stderr about
its result.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.errors import UsageError

Renderer = Callable[..., None]
EXTENSIONS = {
    ".json": "json",
    ".csv": "csv",
    ".txt": "table",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".xml": "junit",
}


# (result kind, format) → "module:function"; table renderers take width/colour options.
_RENDERERS: dict[tuple[str, str], str] = {
    ("diagnosis", "table"): "gpudiag.report.console:render",
    ("diagnosis", "json"): "gpudiag.report.json_report:render",
    ("diagnosis", "csv"): "gpudiag.report.frames:render_csv",
    ("diagnosis", "markdown"): "gpudiag.report.markdown:render",
    ("diagnosis", "html"): "gpudiag.report.html_report:render",
    ("gate", "table"): "gpudiag.report.gate_console:render_gate",
    ("gate", "json"): "gpudiag.report.json_report:render_gate",
    ("gate", "markdown"): "gpudiag.report.ci:render_gate_markdown",
    ("gate", "junit"): "gpudiag.report.junit:render",
    ("diff", "table"): "gpudiag.report.gate_console:render_diff",
    ("diff", "json"): "gpudiag.report.json_report:render_diff",
    ("diff", "markdown"): "gpudiag.report.markdown:render_diff",
    ("doctor", "table"): "gpudiag.report.doctor:render_table",
    ("doctor", "json"): "gpudiag.report.doctor:render_json",
}
FORMATS: dict[str, tuple[str, ...]] = {}
for _kind, _fmt in _RENDERERS:
    FORMATS.setdefault(_kind, ())
    FORMATS[_kind] += (_fmt,)


def kind_of(result: Any) -> str:
    """The registry's name for a result's type."""
    if isinstance(result, Diagnosis):
        return "diagnosis"
    from gpudiag.analysis.compare.diff import RunDiff  # imported for gate and diff results only
    from gpudiag.analysis.compare.gate import GateResult

    if isinstance(result, GateResult):
        return "gate"
    if isinstance(result, RunDiff):
        return "diff"
    if isinstance(result, Mapping):
        return "doctor"
    raise TypeError(f"no renderer for {type(result).__name__}")


# Short names accepted for a format (``-f md``).
ALIASES = {"md": "markdown"}


def pick_format(kind: str, fmt: str | None, output: Path | None, default: str = "table") -> str:
    """``--format`` wins, else the output file's extension, else ``default``; checked.

    ``md`` is ``markdown`` wherever markdown is offered (:data:`ALIASES`).
    """
    allowed = FORMATS[kind]
    fmt = ALIASES.get(fmt, fmt) if fmt is not None else None
    if fmt is None and output is not None:
        fmt = EXTENSIONS.get(output.suffix.lower())
        if fmt is not None and fmt not in allowed:
            fmt = None  # e.g. `diff -o x.html`: fall back to the default
    fmt = fmt or default
    if fmt not in allowed:
        raise UsageError(
            f"--format {fmt} is not available for {kind}",
            f"choose one of: {', '.join(allowed)}",
        )
    return fmt


def render(result: Any, fmt: str, out: TextIO, **options: Any) -> None:
    """Render any result in one of its formats (see :data:`FORMATS`).

    ``options`` (``width``, ``color``, ``show_steps``) reach the table renderers only.
    """
    kind = kind_of(result)
    fmt = ALIASES.get(fmt, fmt)
    target = _RENDERERS.get((kind, fmt))
    if target is None:
        raise UsageError(
            f"--format {fmt} is not available for {kind}",
            f"choose one of: {', '.join(FORMATS[kind])}",
        )
    module, name = target.split(":")
    fn: Renderer = getattr(importlib.import_module(module), name)
    if fmt == "table":
        fn(result, out, **options)
    else:
        fn(result, out)


def renderer_for(
    result: Any, fmt: str | None, output: Path | None, **options: Any
) -> Callable[[TextIO], None]:
    """The report of ``result`` in the format picked for its kind (:func:`pick_format`).

    Raised here, before anything is written: a format the result's kind does not offer.
    ``options`` reach the table renderer only.
    """
    form = pick_format(kind_of(result), fmt, output)

    def write(out: TextIO) -> None:
        render(result, form, out, **options)

    return write


def notices(result: Any) -> list[str]:
    """Lines for stderr about a result, one per finding a user must not miss.

    A Diagnosis whose steps were not found from markers: every number depends on them.
    """
    if not isinstance(result, Diagnosis):
        return []
    from gpudiag.analysis.model.metrics import SourceMissingMetrics

    out = []
    for f in result.findings:
        m = f.metrics
        if isinstance(m, SourceMissingMetrics) and m.missing == "steps":
            who = ", ".join(map(str, f.ranks))
            out.append(f"gpudiag: warning: rank {who}: {f.message}")
    return out
