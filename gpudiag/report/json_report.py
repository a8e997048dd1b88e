"""Diagnosis → stable JSON (named so it does not shadow stdlib json)."""

from __future__ import annotations

import json
from typing import TextIO

from gpudiag.analysis.model import Diagnosis


def render(d: Diagnosis, out: TextIO) -> None:
    """Write the Diagnosis as indented JSON with a trailing newline."""
    json.dump(d.to_json(), out, indent=2, allow_nan=False)
    out.write("\n")
