"""Diagnosis → CSV of the step table (one row per rank and step)."""

from __future__ import annotations

from typing import TextIO

from gpudiag.analysis.model import Diagnosis
from gpudiag.frames import steps_frame


def render(d: Diagnosis, out: TextIO) -> None:
    """Write the per-(rank, step) table as CSV."""
    df = steps_frame(d)
    df.to_csv(out, index=False, float_format="%.6f", lineterminator="\n")
