"""Diagnosis → CSV of the step table (one row per rank and step)."""

from __future__ import annotations

from typing import TextIO

from gpudiag.analysis.model import Diagnosis


def render(d: Diagnosis, out: TextIO) -> None:
    """Write the per-(rank, step) table as CSV."""
    df = d.steps_frame()
    df.to_csv(out, index=False, float_format="%.6f", lineterminator="\n")
