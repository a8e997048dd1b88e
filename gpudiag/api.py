"""The Python API: one call from paths to a Diagnosis, the same path the CLI takes.

``analyze(paths)`` is ``diagnose(load_run(paths))``; a saved diagnosis JSON (``gpudiag
analyze … -f json``) is read back instead of analysed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpudiag.analysis.diagnose import diagnose
from gpudiag.analysis.model import Diagnosis
from gpudiag.config import Thresholds
from gpudiag.errors import InputError
from gpudiag.fanout import Mapper, local_map
from gpudiag.fileio import read_input
from gpudiag.traces.common import LoadOptions
from gpudiag.traces.load import load_run

DIAGNOSIS_HEAD_BYTES = 4096
# A saved diagnosis is a few MB even for thousands of ranks and steps.
DIAGNOSIS_MAX_BYTES = 512 << 20
_SAVE_HINT = ("save one with `gpudiag analyze RUN --format json -o FILE` "
              "or `gpudiag gate RUN --save-baseline FILE`")  # fmt: skip


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
            head = f.read(DIAGNOSIS_HEAD_BYTES)
    except OSError:
        return False
    return b'"gpudiag_version"' in head and b'"traceEvents"' not in head


def load_diagnosis(path: str | os.PathLike[str]) -> Diagnosis:
    """A Diagnosis saved by ``gpudiag analyze --format json`` or ``gate --save-baseline``.

    The document is checked against the Diagnosis JSON schema and its field types; an
    InputError names the file and the first bad field by its JSON path.
    """
    p = Path(path)
    data = read_input(p, DIAGNOSIS_MAX_BYTES, "saved diagnosis")
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError as e:
        raise InputError(p, "JSON nested too deeply to be a gpudiag diagnosis", _SAVE_HINT) from e
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(p, f"not a readable gpudiag diagnosis ({e})", _SAVE_HINT) from e
    try:
        return Diagnosis.from_json(doc)
    except RecursionError as e:
        raise InputError(p, "JSON nested too deeply to be a gpudiag diagnosis", _SAVE_HINT) from e
    except ValueError as e:
        raise InputError(p, f"not a valid gpudiag diagnosis: {e}", _SAVE_HINT) from e


def analyze(
    *paths: str | os.PathLike[str],
    thresholds: Thresholds | None = None,
    step_marker: str | None = None,
    jobs: int | None = None,
    nsys: str | None = None,
    map: Mapper | None = None,
) -> Diagnosis:
    """Analyse run directories, trace files or directories of traces → Diagnosis.

    ``step_marker`` (a regex, group 1 = the step number) overrides automatic step
    detection; ``jobs`` bounds the worker processes; ``nsys`` names the binary used to
    export ``.nsys-rep`` reports; ``map`` replaces the local process pool. One saved
    diagnosis JSON is read back as it is.
    """
    if len(paths) == 1 and is_diagnosis_file(Path(paths[0])):
        return load_diagnosis(paths[0])
    th = (thresholds or Thresholds()).replace(step_re=step_marker)
    run = load_run(*paths, options=LoadOptions.from_thresholds(th, nsys))
    return diagnose(run, th, map=map or local_map(jobs))
