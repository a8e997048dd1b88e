"""Fans per-rank work out: the ``map`` given to loading and diagnosis (local processes by default).

A *mapper* is any callable ``mapper(fn, items) -> [fn(item) for item in items]``, in order.
:func:`local_map` runs the items in forked worker processes when there are several; a
Dask cluster plugs in the same way (``gpudiag.dask_map``). ``fn`` and the items must be
picklable, and what ``fn`` returns is all that crosses back.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


def serial_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(item) for item in items]`` in this process."""
    return [fn(item) for item in items]


def local_map(jobs: int | None = None) -> Mapper:
    """A mapper over up to ``jobs`` forked processes (default: every CPU)."""

    def run(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        workers = min(len(items), jobs or os.cpu_count() or 1)
        if workers <= 1:
            return serial_map(fn, items)
        # Objects that exist before the fork are moved out of the collector's reach, so a
        # collection in a worker does not write to (and copy) every page it shares with us.
        gc.freeze()
        try:
            with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as ex:
                futures = [ex.submit(fn, item) for item in items]
                return [f.result() for f in futures]
        finally:
            gc.unfreeze()

    return run
