"""pandas DataFrames of a Diagnosis (the step table, the findings) and the CSV of the step table.

pandas is imported here, when a frame is built, and nowhere in analysis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from gpudiag._support.records import asdict
from gpudiag.analysis.model.diagnosis import Diagnosis

if TYPE_CHECKING:
    import pandas as pd

STEP_COLUMNS = [
    "rank",
    "step",
    "start_ns",
    "duration_ns",
    "compute_ns",
    "comm_wait_ns",
    "data_wait_ns",
    "other_ns",
    "comm_overlapped_ns",
    "gpu_ops",
    "gpu_idle_ns",
]
FINDING_COLUMNS = [
    "kind",
    "severity",
    "message",
    "ranks",
    "steps",
    "cause",
    "persistent",
    "wait_caused_ns",
    "metrics",
]


def steps_frame(d: Diagnosis) -> pd.DataFrame:
    """One row per (rank, step) as a pandas DataFrame, with both idles and the shares.

    ``idle_ratio`` is the non-compute idle (1 − compute ÷ duration); ``gpu_idle_ratio`` the
    GPU idle (no kernel, copy or memset; empty on CPU-only traces).
    """
    import pandas as pd

    df = pd.DataFrame([asdict(s) for s in d.steps], columns=STEP_COLUMNS)
    df["gpu_ops"] = df["gpu_ops"].astype("Int64")
    df["gpu_idle_ns"] = df["gpu_idle_ns"].astype("Int64")
    dur = df["duration_ns"].where(df["duration_ns"] > 0)
    df["idle_ratio"] = 1.0 - df["compute_ns"] / dur
    df["gpu_idle_ratio"] = (df["gpu_idle_ns"].astype("Float64") / dur).astype("Float64")
    out: pd.DataFrame = df
    return out


def findings_frame(d: Diagnosis) -> pd.DataFrame:
    """One row per finding: kind, severity, message, ranks, steps, … and ``metrics`` as JSON."""
    import pandas as pd

    rows = [
        {
            **asdict(f),
            "kind": str(f.kind),
            "severity": str(f.severity),
            "cause": None if f.cause is None else str(f.cause),
            "metrics": f.metrics.to_json(),
        }
        for f in d.findings
    ]
    df = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    df["wait_caused_ns"] = df["wait_caused_ns"].astype("Int64")
    out: pd.DataFrame = df
    return out


def render_csv(d: Diagnosis, out: TextIO) -> None:
    """Write the per-(rank, step) table as CSV."""
    df = steps_frame(d)
    df.to_csv(out, index=False, float_format="%.6f", lineterminator="\n")
