"""Per-step telemetry files (``ranks/rank-*.steps.jsonl``) → one pandas DataFrame of steps.

The format (written by ``gpudiag run``'s rank hook) is JSON lines: a ``header`` record,
then ``step``, ``profile``, ``error`` and ``exit`` records; see docs/run-directory.md.
A rank restarted by torchrun appends a new header: only the last segment is kept. A
truncated last line (the job was killed mid-write) is ignored; any other unreadable line
is an :class:`~gpudiag.errors.InputError`. A step record with a field of the wrong type or
a time out of range is dropped and counted in a note; an impossible rank or step number
(negative, beyond int32) is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag._support.fileio import list_dir
from gpudiag.errors import InputError
from gpudiag.rundir import layout as rundir
from gpudiag.traces.core.common import (
    STEP_MAX,
    TIME_MAX_NS,
    check_rank,
    dropped_notes,
    json_words,
)
from gpudiag.traces.runfiles.jsonl import Follower, records

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
    "cpu_ns",
    "pre_forward_ns",
    "forward_ns",
    "optimizer_ns",
    "profiled",
    "host",
]
_INT_COLS = ("step", "start_ns", "end_ns", "duration_ns")
_PHASES = ("pre_forward_ns", "forward_ns", "optimizer_ns")  # null: not seen in the step
_NULLABLE = ("data_wait_ns", "comm_wait_ns", "backward_ns", "cpu_ns", *_PHASES)
_HINT = "the file is not gpudiag step telemetry; re-run with `gpudiag run`, or remove it"


def read_steps_file(
    path: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(header, step records, other records) of the last segment of one telemetry file."""
    header: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    for n, rec in records(path, "telemetry", _HINT):
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
            check_rank(rec.get("rank"), path, f"line {n}: the header's rank", _HINT)
            header, steps, other = rec, [], []
        elif header is None:
            raise InputError(path, "telemetry does not start with a header record", _HINT)
        elif kind == "step":
            step = rec.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and not 0 <= step <= STEP_MAX:
                raise InputError(
                    path,
                    f"line {n}: step number {step} is out of range (steps are numbered 0 … "
                    f"{STEP_MAX})",
                    _HINT,
                )
            steps.append(rec)
        else:
            other.append(rec)
    if header is None:
        raise InputError(path, "empty telemetry file (no header)", _HINT)
    return header, steps, other


_WAITS = ("data_wait_ns", "comm_wait_ns", "backward_ns", "cpu_ns", *_PHASES)
_NO_STEP = "step records without a valid step, start_ns or end_ns (or of no duration) ignored"


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def usable_steps(steps: list[dict[str, Any]], dropped: Counter[str]) -> list[dict[str, Any]]:
    """The step records whose fields have their types and ranges; the others counted.

    ``step``, ``start_ns`` and ``end_ns`` are needed (integers, ``start_ns < end_ns``, times
    within ±146 years); a wait that is not a non-negative integer or null is left out
    (read as not measured), a ``profiled`` that is not a boolean is read as false.
    """
    out = []
    for rec in steps:
        start: Any = rec.get("start_ns")
        end: Any = rec.get("end_ns")
        if not (
            _int_in(rec.get("step"), 0, STEP_MAX)
            and _int_in(start, 0, TIME_MAX_NS)
            and _int_in(end, 0, TIME_MAX_NS)
            and start < end
        ):
            dropped[_NO_STEP] += 1
            continue
        rec = dict(rec)
        for k in _WAITS:
            v = rec.get(k)
            if v is not None and not _int_in(v, 0, TIME_MAX_NS):
                dropped[f"step records with {k} {json_words(v)} (read as not measured)"] += 1
                rec[k] = None
        if not isinstance(rec.get("profiled", False), bool):
            dropped["step records whose `profiled` is not true/false (read as false)"] += 1
            rec["profiled"] = False
        out.append(rec)
    return out


def steps_frame(header: dict[str, Any], steps: list[dict[str, Any]]) -> pd.DataFrame:
    """The step records of one rank as a DataFrame with :data:`COLUMNS`."""
    df = pd.DataFrame.from_records(
        steps, columns=[c for c in COLUMNS if c not in ("rank", "host", "duration_ns")]
    )
    df.insert(0, "rank", int(header["rank"]))
    host = header.get("host", "")
    df["host"] = host if isinstance(host, str) else ""
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
        found += [
            p
            for p in list_dir(base / rundir.RANKS_DIR)
            if p.name.startswith("rank-") and p.name.endswith(".steps.jsonl")
        ]
    return found


def load_steps(run_dir: Path, notes: list[str] | None = None) -> pd.DataFrame:
    """All ranks' steps of a run directory: one row per (rank, step), sorted.

    Columns: rank, step, start_ns, end_ns, duration_ns (int64, epoch ns of
    ``time.time_ns``), data_wait_ns, comm_wait_ns, backward_ns, cpu_ns (the training
    thread's CPU time in the step) and the phases pre_forward_ns, forward_ns,
    optimizer_ns (nullable Int64: <NA> where not measured, not seen or written by an
    older gpudiag), profiled (bool), host (str). Records that were dropped or read
    in part are counted in ``notes`` (one line per file and reason).
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
        dropped: Counter[str] = Counter()
        steps = usable_steps(steps, dropped)
        if notes is not None:
            notes.extend(f"{path}: {n}" for n in dropped_notes(dropped))
        try:
            frames.append(steps_frame(header, steps))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise InputError(path, f"malformed step record ({e})", _HINT) from e
    df = pd.concat(frames, ignore_index=True)
    out: pd.DataFrame = df.sort_values(["rank", "step"], kind="stable")
    out = out.reset_index(drop=True)
    return out


class StepsFollower:
    """Every rank's telemetry of a run directory as the ranks write it (the live monitor).

    :meth:`poll` returns ``(header, usable step records)`` per rank file with new records;
    a new header (a restarted rank) comes back with the steps after it. Files that appear
    later (a rank that starts late, another node directory) are picked up.
    """

    def __init__(self, run_dir: Path, relist_s: float = 1.0) -> None:
        self.run_dir = Path(run_dir)
        self.files: dict[Path, Follower] = {}
        self.headers: dict[Path, dict[str, Any]] = {}
        self.dropped: Counter[str] = Counter()
        self.relist_s = relist_s
        self._listed = -relist_s

    def poll(self) -> list[tuple[dict[str, Any], list[dict[str, Any]], bool]]:
        """(header, new steps, restarted) of each rank file that has new records."""
        now = time.monotonic()
        if now - self._listed >= self.relist_s:  # new files: at most once per relist_s
            self._listed = now
            with contextlib.suppress(InputError):
                for path in steps_files(self.run_dir):
                    self.files.setdefault(path, Follower(path))
        out = []
        for path, f in self.files.items():
            steps: list[dict[str, Any]] = []
            restarted = False
            for rec in f.poll():
                if rec["type"] == "header":
                    if rec.get("format") == STEPS_FORMAT and _int_in(rec.get("rank"), 0, 1 << 30):
                        restarted = path in self.headers
                        self.headers[path] = rec
                        steps = []
                elif rec["type"] == "step" and path in self.headers:
                    steps.append(rec)
            if path in self.headers and (steps or restarted):
                out.append((self.headers[path], usable_steps(steps, self.dropped), restarted))
        return out

    def close(self) -> None:
        """Close every file."""
        for f in self.files.values():
            f.close()
