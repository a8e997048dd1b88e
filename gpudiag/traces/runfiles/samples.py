"""NVML sample files (``nvml/<host>.jsonl``) → one pandas DataFrame of per-GPU samples.

Written by ``gpudiag run``'s sampler; the format is in docs/run-directory.md. Fields the
GPU or driver did not support are ``null`` on disk and NaN here, never 0. A truncated
last line is ignored. A sample without a valid ``time_ns`` or ``gpu_uuid`` is dropped, a
value that is not a number is read as unknown (NaN); both are counted in a note.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag._support.fileio import list_dir
from gpudiag.errors import InputError
from gpudiag.rundir import layout as rundir
from gpudiag.traces.core.common import TIME_MAX_NS, dropped_notes
from gpudiag.traces.runfiles.jsonl import Follower, records

NVML_FORMAT = "gpudiag.nvml"
KNOWN_VERSIONS = (1,)
FLOAT_COLUMNS = [
    "util_ratio",
    "mem_util_ratio",
    "mem_bytes",
    "mem_total_bytes",
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "pcie_rx_bytes_s",
    "pcie_tx_bytes_s",
    "nvlink_rx_bytes_s",
    "nvlink_tx_bytes_s",
]
COLUMNS = ["time_ns", "host", "gpu_uuid", "index", *FLOAT_COLUMNS, "throttle_reasons"]
_HINT = "the file is not a gpudiag NVML sample file; re-run with `gpudiag run`, or remove it"


def read_nvml_file(
    path: Path, notes: list[str] | None = None
) -> tuple[dict[str, Any], pd.DataFrame]:
    """(header, samples) of one NVML sample file; what was dropped is counted in ``notes``."""
    header: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    for _, rec in records(path, "NVML sample", _HINT):
        if rec.get("type") == "header":
            if rec.get("format") != NVML_FORMAT or rec.get("version") not in KNOWN_VERSIONS:
                raise InputError(
                    path,
                    f"NVML sample format {rec.get('format')!r} v{rec.get('version')} not supported",
                    "upgrade gpudiag to read this run",
                )
            header = rec
        elif rec.get("type") == "sample":
            if header is None:
                raise InputError(path, "samples before the header record", _HINT)
            rows.append(rec)
    if header is None:
        raise InputError(path, "empty NVML sample file (no header)", _HINT)
    dropped: Counter[str] = Counter()
    rows = _usable(rows, dropped)
    if notes is not None:
        notes.extend(f"{path}: {n}" for n in dropped_notes(dropped))
    return header, _frame(header, rows)


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _usable(rows: list[dict[str, Any]], dropped: Counter[str]) -> list[dict[str, Any]]:
    """Samples with a time and a GPU, each value a number or null; the rest counted."""
    out = []
    for rec in rows:
        if not _is_int(rec.get("time_ns"), 0, TIME_MAX_NS):
            dropped["samples without a valid time_ns ignored"] += 1
            continue
        if not isinstance(rec.get("gpu_uuid"), str):
            dropped["samples without a gpu_uuid ignored"] += 1
            continue
        rec = dict(rec)
        if "mem_used_bytes" in rec and "mem_bytes" not in rec:
            rec["mem_bytes"] = rec.pop("mem_used_bytes")
        for c in FLOAT_COLUMNS:
            v = rec.get(c)
            if v is not None and not (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            ):
                dropped[f"{c} values that are not numbers (read as unknown)"] += 1
                rec[c] = None
        for c, hi in (("index", 2**31 - 1), ("throttle_reasons", 2**63 - 1)):
            v = rec.get(c)
            if v is not None and not _is_int(v, 0, hi):
                dropped[f"{c} values that are not integers ≥ 0 (read as unknown)"] += 1
                rec[c] = None
        out.append(rec)
    return out


def _frame(header: dict[str, Any], rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows)
    if "mem_used_bytes" in df:
        df = df.rename(columns={"mem_used_bytes": "mem_bytes"})
    host = header.get("host", "")
    df["host"] = host if isinstance(host, str) else ""
    for c in COLUMNS:
        if c not in df:
            df[c] = None
    df["time_ns"] = df["time_ns"].astype("int64")
    df["index"] = pd.array(df["index"].tolist(), dtype="Int64")
    for c in FLOAT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    df["throttle_reasons"] = pd.array(df["throttle_reasons"].tolist(), dtype="Int64")
    out: pd.DataFrame = df[COLUMNS]
    return out


def load_samples(run_dir: Path, notes: list[str] | None = None) -> pd.DataFrame:
    """Every node's NVML samples of a run directory, sorted by time; empty if none."""
    bases = rundir.node_dirs(Path(run_dir)) or [Path(run_dir)]
    frames = [
        read_nvml_file(path, notes)[1]
        for base in bases
        for path in list_dir(base / rundir.NVML_DIR)
        if path.name.endswith(".jsonl")
    ]
    if not frames:
        empty: pd.DataFrame = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS})
        return empty
    df = pd.concat(frames, ignore_index=True)
    out: pd.DataFrame = df.sort_values(["time_ns", "host", "gpu_uuid"], kind="stable")
    out = out.reset_index(drop=True)
    return out


class SamplesFollower:
    """NVML samples of a run directory as the sampler writes them (the live monitor)."""

    def __init__(self, run_dir: Path, relist_s: float = 1.0) -> None:
        self.run_dir = Path(run_dir)
        self.files: dict[Path, Follower] = {}
        self.dropped: Counter[str] = Counter()
        self.relist_s = relist_s
        self._listed = -relist_s

    def poll(self) -> list[dict[str, Any]]:
        """The usable sample records written since the last poll, every file together."""
        now = time.monotonic()
        if now - self._listed >= self.relist_s:  # new files: at most once per relist_s
            self._listed = now
            for base in rundir.node_dirs(self.run_dir) or [self.run_dir]:
                with contextlib.suppress(InputError):
                    for path in list_dir(base / rundir.NVML_DIR):
                        if path.suffix == ".jsonl":
                            self.files.setdefault(path, Follower(path))
        out: list[dict[str, Any]] = []
        for f in self.files.values():
            out += [r for r in f.poll() if r["type"] == "sample"]
        return _usable(out, self.dropped) if out else []

    def close(self) -> None:
        """Close every file."""
        for f in self.files.values():
            f.close()
