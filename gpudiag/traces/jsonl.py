"""Append-only JSON-lines files written by ``gpudiag run``: every complete record, in order.

A writer killed mid-record leaves a truncated last line without its newline: that line
is skipped. Any other line that is not a JSON object is an
:class:`~gpudiag.errors.InputError` naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpudiag.errors import InputError


def records(path: Path, what: str, hint: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each complete record of ``path``; ``what`` names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(path, f"unreadable {what} ({e})", hint) from e
    lines = text.split("\n")
    complete = text.endswith("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            if i == len(lines) - 1 and not complete:
                return  # truncated last line: the writer was killed mid-record
            raise InputError(path, f"line {i + 1} is not JSON ({e})", hint) from e
        if not isinstance(rec, dict) or "type" not in rec:
            raise InputError(path, f"line {i + 1} is not a {what} record", hint)
        yield i + 1, rec
