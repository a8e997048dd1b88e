"""gpudiag: why is my distributed PyTorch training slow? Compute, data-wait, comm-wait, stragglers.

The public API is small::

    import gpudiag
    diag = gpudiag.analyze("runs/exp1")       # run directory, trace file(s) or directory
    diag.steps_frame()                         # pandas DataFrame, one row per (rank, step)
    timeline = gpudiag.load_run("traces/")     # the interval model, for your own analysis
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpudiag.analysis.model import Diagnosis
    from gpudiag.traces.schema import RunTimeline

__all__ = ["__version__", "analyze", "diagnose", "load_run"]


def load_run(*paths: Any, **kwargs: Any) -> RunTimeline:
    """Load a run directory or trace files into the interval model."""
    from gpudiag.traces.load import load_run as _load

    return _load(*paths, **kwargs)


def analyze(*paths: Any, **kwargs: Any) -> Diagnosis:
    """Analyse a run directory or trace files and return the Diagnosis."""
    from gpudiag.analysis.diagnose import analyze_paths

    return analyze_paths(*paths, **kwargs)


diagnose = analyze
