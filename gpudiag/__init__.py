"""gpudiag: why is my distributed PyTorch training slow? Compute, data-wait, comm-wait, stragglers.

The public API is small::

    import gpudiag
    diag = gpudiag.analyze("runs/exp1")       # run directory, trace file(s) or directory
    gpudiag.steps_frame(diag)                  # pandas DataFrame, one row per (rank, step)
    run = gpudiag.load_run("traces/")          # the interval model, for your own analysis
    diag = gpudiag.diagnose(run)               # the same analysis on a loaded (or built) run

Names are imported on first use: ``import gpudiag`` stays cheap, because the rank
bootstrap of ``gpudiag run`` imports this package inside the training job.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpudiag.analysis.model.diagnosis import Diagnosis
    from gpudiag.api.load import analyze, diagnose, load_diagnosis, to_markdown
    from gpudiag.api.saved import diagnosis_from_json
    from gpudiag.config import Thresholds
    from gpudiag.report.frames import findings_frame, steps_frame
    from gpudiag.traces.core.common import LoadOptions
    from gpudiag.traces.load import load_run
    from gpudiag.traces.schema import RankTimeline, RunTimeline

_LAZY = {
    "analyze": "gpudiag.api.load",
    "load_diagnosis": "gpudiag.api.load",
    "to_markdown": "gpudiag.api.load",
    "steps_frame": "gpudiag.report.frames",
    "findings_frame": "gpudiag.report.frames",
    "diagnosis_from_json": "gpudiag.api.saved",
    "diagnose": "gpudiag.api.load",
    "Diagnosis": "gpudiag.analysis.model.diagnosis",
    "Thresholds": "gpudiag.config",
    "LoadOptions": "gpudiag.traces.core.common",
    "load_run": "gpudiag.traces.load",
    "RankTimeline": "gpudiag.traces.schema",
    "RunTimeline": "gpudiag.traces.schema",
}

__all__ = [
    "Diagnosis",
    "LoadOptions",
    "RankTimeline",
    "RunTimeline",
    "Thresholds",
    "__version__",
    "analyze",
    "diagnose",
    "diagnosis_from_json",
    "findings_frame",
    "load_diagnosis",
    "load_run",
    "steps_frame",
    "to_markdown",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpudiag' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
