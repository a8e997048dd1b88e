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
from typing import Any

from gpudiag.errors import InputError
from gpudiag.fileio import read_lines

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
