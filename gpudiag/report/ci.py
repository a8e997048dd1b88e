"""Gate outputs for CI: the JUnit and Markdown files, and GitHub's job summary."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from gpudiag.analysis.compare.gate import GateResult
from gpudiag.report import junit, markdown

# GitHub drops a step summary above 1 MiB; stay far below it.
SUMMARY_MAX_BYTES = 256 * 1024


def gate_markdown(res: GateResult) -> str:
    """The gate's Markdown, cut to :data:`SUMMARY_MAX_BYTES` at a line boundary if needed."""
    buf = io.StringIO()
    markdown.render_gate(res, buf)
    text = buf.getvalue()
    if len(text.encode()) <= SUMMARY_MAX_BYTES:
        return text
    cut = text.encode()[: SUMMARY_MAX_BYTES - 100].decode(errors="ignore")
    return cut[: cut.rfind("\n") + 1] + "\n_(truncated)_\n"


def render_gate_markdown(res: GateResult, out: TextIO) -> None:
    """Write the gate's Markdown (cut like a job summary)."""
    out.write(gate_markdown(res))


def write_outputs(
    res: GateResult,
    junit_path: Path | None,
    markdown_path: Path | None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Write the requested files; append the Markdown to ``$GITHUB_STEP_SUMMARY`` if set.

    The files follow the output rules of :mod:`gpudiag._support.fileio` (as ``-o`` does).
    """
    from gpudiag._support.fileio import write_output

    env = os.environ if env is None else env
    if junit_path is not None:
        with write_output(junit_path) as f:
            junit.render(res, f)
        print(f"wrote {junit_path}", file=sys.stderr)
    md = gate_markdown(res)
    if markdown_path is not None:
        with write_output(markdown_path) as f:
            f.write(md)
        print(f"wrote {markdown_path}", file=sys.stderr)
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(md)
