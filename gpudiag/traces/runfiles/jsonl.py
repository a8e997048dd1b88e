"""Append-only JSON-lines files written by ``gpudiag run``: every complete record, in order.

A writer killed mid-record leaves a truncated last line without its newline: that line
is skipped. Any other line that is not a JSON object is an
:class:`~gpudiag.errors.InputError` naming the file and the line. Only regular files are
read, one line at a time, each at most :data:`LINE_MAX_BYTES` (a record is a few hundred
bytes), so neither a link to an endless device nor a file without newlines fills memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from gpudiag._support.fileio import read_lines
from gpudiag.errors import InputError

LINE_MAX_BYTES = 1 << 20


def records(path: Path, what: str, hint: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each complete record of ``path``; ``what`` names the file."""
    for n, raw in read_lines(path, LINE_MAX_BYTES, what):
        complete = raw.endswith(b"\n")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if not complete:
                return  # truncated last line: the writer was killed mid-record
            raise InputError(path, f"line {n} is not UTF-8 text ({e.reason})", hint) from e
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except RecursionError as e:
            raise InputError(path, f"line {n} is JSON nested too deeply", hint) from e
        except ValueError as e:
            if not complete:
                return  # truncated last line: the writer was killed mid-record
            raise InputError(path, f"line {n} is not JSON ({e})", hint) from e
        if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
            raise InputError(path, f"line {n} is not a {what} record", hint)
        yield n, rec


class Follower:
    """The records appended to one JSON-lines file since the last :meth:`poll` (a live reader).

    The file stays open between polls, so a poll with nothing new is one ``read``. A line
    still being written (no newline yet) waits for the next poll; a line that is not a JSON
    object with a ``type`` is skipped and counted in ``skipped`` — the job is still writing,
    so the offline loader, not the live one, refuses a damaged file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped = 0
        self._file: BinaryIO | None = None
        self._partial = b""

    def poll(self, limit: int = 1 << 24) -> list[dict[str, Any]]:
        """New complete records, at most ``limit`` bytes of them per call."""
        try:
            if self._file is None:
                self._file = open(self.path, "rb")  # noqa: SIM115 - kept open between polls
            data = self._partial + self._file.read(limit)
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._partial = data[end:]
        if len(self._partial) > LINE_MAX_BYTES:  # no record is this long: not a record
            self._partial = b""
            self.skipped += 1
        out = []
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                self.skipped += 1
                continue
            if isinstance(rec, dict) and isinstance(rec.get("type"), str):
                out.append(rec)
            else:
                self.skipped += 1
        return out

    def close(self) -> None:
        """Close the file (a later poll opens it again and reads it from the start)."""
        if self._file is not None:
            self._file.close()
            self._file, self._partial = None, b""
