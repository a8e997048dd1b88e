"""The cross-rank step stays linear in ranks (issue 23): counted, not timed.

A quadratic loop hid in the exposed-copies rule (every rank summed every step: 8,192
ranks took 60 s instead of 1.4 s in ``benchmarks/bench_scale.py --synthetic``). Time on a
shared 2-core host is too noisy to catch that in a test, so this counts the lines of
gpudiag's analysis that ``build_diagnosis`` executes (``sys.settrace``) on 32 and 512
synthetic ranks: 16× the ranks must cost at most 24× the lines (×14.4 measured; with that
quadratic pass it was ×39).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
from testpaths import DATA

from gpudiag.analysis.diagnose import build_diagnosis
from gpudiag.config import Thresholds
from gpudiag.fanout.work import RankWork
from gpudiag.traces.load import load_run

SOURCE = DATA / "straggler_comms_id" / "rank-0.json.gz"


def _ranks(base: Any, n: int) -> list[Any]:
    rng = np.random.default_rng(23)
    out = []
    for r in range(n):
        steps = [
            dataclasses.replace(s, rank=r, compute_ns=int(s.compute_ns * k))
            for s, k in zip(base.steps, rng.normal(1.0, 0.02, len(base.steps)), strict=True)
        ]
        c = base.collectives
        if c is not None:
            c = dataclasses.replace(c, rank=r, start=c.start + rng.integers(0, 50, len(c.start)))
        meta = dataclasses.replace(base.meta, world_size=n)
        out.append(dataclasses.replace(base, rank=r, steps=steps, collectives=c, meta=meta))
    return out


def _lines(results: list[Any]) -> int:
    count = 0

    def line(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return line

    def call(frame: Any, event: str, arg: Any) -> Any:
        return line if "gpudiag" in frame.f_code.co_filename else None

    sys.settrace(call)
    try:
        build_diagnosis(results, Thresholds())
    finally:
        sys.settrace(None)
    return count


def test_sixteen_times_the_ranks_costs_at_most_24_times_the_lines() -> None:
    (base,) = RankWork(Thresholds())(load_run(SOURCE).sources[0])
    small, large = _lines(_ranks(base, 32)), _lines(_ranks(base, 512))
    assert large <= 24 * small, (small, large, large / small)
