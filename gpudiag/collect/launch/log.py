"""Gpudiag's own messages while it launches or watches a job: one line each, on stderr."""

from __future__ import annotations

import contextlib
import sys


def log(msg: str) -> None:
    """Gpudiag's own messages go to stderr, never stdout; a closed stderr is not an error."""
    with contextlib.suppress(Exception):
        print(f"gpudiag: {msg}", file=sys.stderr, flush=True)
