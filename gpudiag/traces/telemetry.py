"""Per-step telemetry files (``ranks/rank-*.steps.jsonl``) → one pandas DataFrame of steps.

The format (written by ``gpudiag run``'s rank hook) is JSON lines: a ``header`` record,
then ``step``, ``profile``, ``error`` and ``exit`` records; see docs/run-directory.md.
A rank restarted by torchrun appends a new header: only the last segment is kept. A
truncated last line (the job was killed mid-write) is ignored; any other unreadable line
is an :class:`~gpudiag.errors.InputError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag import rundir
from gpudiag.errors import InputError
from gpudiag.traces.jsonl import records

STEPS_FORMAT = "gpudiag.steps"
KNOWN_VERSIONS = (1,)
COLUMNS = [
    "rank",
    "step",
    "start_ns",
    "end_ns",
    "duration_ns",
    "data_wait_ns",
    "comm_wait_ns",
    "backward_ns",
    "profiled",
    "host",
]
_INT_COLS = ("step", "start_ns", "end_ns", "duration_ns")
_NULLABLE = ("data_wait_ns", "comm_wait_ns", "backward_ns")
_HINT = "the file is not gpudiag step telemetry; re-run with `gpudiag run`, or remove it"


def read_steps_file(
    path: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(header, step records, other records) of the last segment of one telemetry file."""
    header: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    for _, rec in records(path, "telemetry", _HINT):
        kind = rec["type"]
        if kind == "header":
            if rec.get("format") != STEPS_FORMAT:
                raise InputError(path, f"unknown format {rec.get('format')!r}", _HINT)
            if rec.get("version") not in KNOWN_VERSIONS:
                raise InputError(
                    path,
                    f"telemetry version {rec.get('version')} not supported "
                    f"(known: {', '.join(map(str, KNOWN_VERSIONS))})",
                    "upgrade gpudiag to read this run",
                )
            header, steps, other = rec, [], []
        elif header is None:
            raise InputError(path, "telemetry does not start with a header record", _HINT)
        elif kind == "step":
            steps.append(rec)
        else:
            other.append(rec)
    if header is None:
        raise InputError(path, "empty telemetry file (no header)", _HINT)
    return header, steps, other


def steps_frame(header: dict[str, Any], steps: list[dict[str, Any]]) -> pd.DataFrame:
    """The step records of one rank as a DataFrame with :data:`COLUMNS`."""
    df = pd.DataFrame.from_records(
        steps, columns=[c for c in COLUMNS if c not in ("rank", "host", "duration_ns")]
    )
    df.insert(0, "rank", int(header["rank"]))
    df["host"] = str(header.get("host", ""))
    for c in ("step", "start_ns", "end_ns"):
        df[c] = df[c].astype("int64")
    df["duration_ns"] = (df["end_ns"] - df["start_ns"]).astype("int64")
    for c in _NULLABLE:
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    df["profiled"] = df["profiled"].fillna(False).astype(bool)
    out: pd.DataFrame = df[COLUMNS]
    return out


def steps_files(run_dir: Path) -> list[Path]:
    """Every telemetry file of a run directory, in every node directory."""
    bases = rundir.node_dirs(run_dir) or [run_dir]
    found: list[Path] = []
    for base in bases:
        found += sorted((base / rundir.RANKS_DIR).glob("rank-*.steps.jsonl"))
    return found


def load_steps(run_dir: Path) -> pd.DataFrame:
    """All ranks' steps of a run directory: one row per (rank, step), sorted.

    Columns: rank, step, start_ns, end_ns, duration_ns (int64, epoch ns of
    ``time.time_ns``), data_wait_ns, comm_wait_ns, backward_ns (nullable Int64: <NA>
    where not measured), profiled (bool), host (str).
    """
    files = steps_files(Path(run_dir))
    if not files:
        raise InputError(
            run_dir,
            "no step telemetry (ranks/rank-*.steps.jsonl)",
            "capture it with `gpudiag run -- <command>`",
        )
    frames = []
    for path in files:
        header, steps, _ = read_steps_file(path)
        try:
            frames.append(steps_frame(header, steps))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(path, f"malformed step record ({e})", _HINT) from e
    df = pd.concat(frames, ignore_index=True)
    out: pd.DataFrame = df.sort_values(["rank", "step"], kind="stable")
    out = out.reset_index(drop=True)
    return out
