"""The rank's telemetry file (``steps/rank-N.jsonl``): one ``write`` per record, nothing half.

A write that fails (disk full, directory gone) drops that record, truncates any
half-written line and is counted; the next successful write says what was lost (a
``lost`` record). Only the process that opened the writer writes.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from gpudiag.collect.rank.faults import Faults
from gpudiag.rundir import layout as rundir


class TelemetryWriter:
    """Appends JSONL records to one rank's telemetry file through a raw ``O_APPEND`` fd."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        pid: int,
        header: Callable[[], dict[str, Any]],
        step: Callable[[], int],
        faults: Faults,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.pid = pid
        self.header_written = False
        self._header = header
        self._step = step
        self._faults = faults
        self._fd: int | None = None
        self._size = 0  # file size after the last complete record
        self._lost: dict[str, Any] | None = None
        self._lost_logged = False

    def _open(self) -> int:
        path = rundir.steps_path(self.run_dir, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._fd = fd
        self._size = os.fstat(fd).st_size
        if not self.header_written:
            self._append(fd, line(self._header()))
            self.header_written = True
        return fd

    def _append(self, fd: int, data: bytes) -> None:
        """One ``write`` per record; a failed or short write is undone, never left half."""
        try:
            if self._faults and self._faults.on("write:enospc", self._step()):
                os.write(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device (GPUDIAG_FAULT)")
            n = os.write(fd, data)
            if n != len(data):
                raise OSError(errno.ENOSPC, f"short write ({n} of {len(data)} bytes)")
        except OSError:
            with suppress(OSError):
                os.ftruncate(fd, self._size)
            raise
        self._size += n

    def write(self, rec: dict[str, Any]) -> None:
        """Append one record; when it cannot be written it is counted as lost, never raised."""
        if os.getpid() != self.pid:
            return
        try:
            fd = self._fd if self._fd is not None else self._open()
            if self._lost is not None:
                self._append(fd, line(self._lost))
                self._lost = None
            self._append(fd, line(rec))
        except OSError as e:
            self._note_lost(rec, e)

    def _note_lost(self, rec: dict[str, Any], e: OSError) -> None:
        step = rec.get("step", self._step())
        if self._lost is None:
            self._lost = {
                "type": "lost",
                "time_ns": time.time_ns(),
                "records": 0,
                "first_step": step,
                "last_step": step,
                "message": f"{type(e).__name__}: {e}",
            }
        self._lost["records"] += 1
        self._lost["last_step"] = step
        kinds = self._lost.setdefault("types", {})  # what was lost: steps, a window's outcome…
        kind = str(rec.get("type", "?"))
        kinds[kind] = kinds.get(kind, 0) + 1
        if not self._lost_logged:
            self._lost_logged = True
            stderr(
                f"gpudiag: rank {self.rank}: telemetry write failed ({type(e).__name__}: {e}); "
                "records are dropped until writes succeed again; the job continues"
            )

    def close(self) -> None:
        """Close the fd; the next write reopens the file (and writes no second header)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)


def line(rec: Mapping[str, Any]) -> bytes:
    """One compact JSON line."""
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def stderr(msg: str) -> None:
    """Print to stderr, never raising."""
    with suppress(Exception):
        print(msg, file=sys.stderr, flush=True)
