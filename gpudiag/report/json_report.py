"""Diagnosis → stable JSON (named so it does not shadow stdlib json)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TextIO

from gpudiag._support.records import asdict

if TYPE_CHECKING:  # annotations only: a diagnosis' JSON needs neither gate nor diff
    from gpudiag.analysis.compare.diff import RunDiff
    from gpudiag.analysis.compare.gate import GateResult
    from gpudiag.analysis.model.diagnosis import Diagnosis


def dump(doc: Any, out: TextIO) -> None:
    """Write a JSON document, indented, with a trailing newline; NaN is refused."""
    json.dump(doc, out, indent=2, allow_nan=False)
    out.write("\n")


def render(d: Diagnosis, out: TextIO) -> None:
    """Write the Diagnosis as indented JSON with a trailing newline."""
    dump(d.to_json(), out)


def render_gate(res: GateResult, out: TextIO) -> None:
    """The gate's verdict and checks as JSON (``exit_code`` included)."""
    dump(res.to_json(), out)


def render_diff(res: RunDiff, out: TextIO) -> None:
    """A run diff as JSON."""
    dump(asdict(res), out)
