"""Gets a Diagnosis from a saved diagnosis JSON file or by analysing a run directory / traces."""

from __future__ import annotations

import json
from pathlib import Path

from gpudiag.analysis.model import Diagnosis
from gpudiag.config import Thresholds
from gpudiag.errors import InputError


def is_diagnosis_file(path: Path) -> bool:
    """True for a plain JSON file whose first bytes look like ``Diagnosis.to_json`` output.

    Only the head is read: Kineto traces are also ``.json`` and may be huge. A Diagnosis
    document starts with ``schema_version`` then ``gpudiag_version``; a trace has
    ``traceEvents``.
    """
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"gpudiag_version"' in head and b'"traceEvents"' not in head


def load_diagnosis_file(path: Path) -> Diagnosis:
    """A Diagnosis saved by ``gpudiag analyze --format json`` or ``gate --save-baseline``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return Diagnosis.from_json(doc)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise InputError(
            path,
            f"not a readable gpudiag diagnosis ({type(e).__name__}: {e})",
            "save one with `gpudiag analyze RUN --format json -o FILE` "
            "or `gpudiag gate RUN --save-baseline FILE`",
        ) from e


def diagnosis_of(
    path: Path, thresholds: Thresholds | None = None, jobs: int | None = None
) -> Diagnosis:
    """Load ``path`` if it is a saved diagnosis, else analyse it (run dir, traces)."""
    if is_diagnosis_file(path):
        return load_diagnosis_file(path)
    from gpudiag.analysis.diagnose import analyze_paths

    return analyze_paths(path, thresholds=thresholds, jobs=jobs)
