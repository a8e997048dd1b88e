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
    from gpudiag.analysis.diagnose import diagnose
    from gpudiag.analysis.model import Diagnosis
    from gpudiag.api import analyze, load_diagnosis, to_markdown
    from gpudiag.config import Thresholds
    from gpudiag.frames import findings_frame, steps_frame
    from gpudiag.serialise import diagnosis_from_json
    from gpudiag.traces.common import LoadOptions
    from gpudiag.traces.load import load_run
    from gpudiag.traces.schema import RankTimeline, RunTimeline

_LAZY = {
    "analyze": "gpudiag.api",
    "load_diagnosis": "gpudiag.api",
    "to_markdown": "gpudiag.api",
    "steps_frame": "gpudiag.frames",
    "findings_frame": "gpudiag.frames",
    "diagnosis_from_json": "gpudiag.serialise",
    "diagnose": "gpudiag.analysis.diagnose",
    "Diagnosis": "gpudiag.analysis.model",
    "Thresholds": "gpudiag.config",
    "LoadOptions": "gpudiag.traces.common",
    "load_run": "gpudiag.traces.load",
    "RankTimeline": "gpudiag.traces.schema",
    "RunTimeline": "gpudiag.traces.schema",
}

__all__ = [
    "Diagnosis", "LoadOptions", "RankTimeline", "RunTimeline", "Thresholds", "__version__",
    "analyze", "diagnose", "diagnosis_from_json", "findings_frame", "load_diagnosis",
    "load_run", "steps_frame", "to_markdown",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpudiag' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
