"""The live display's snapshot of a running job: each rank's steps so far and its rate.

Followed from the ranks' ``rank-*.steps.jsonl`` files (:class:`StepsTail`).
"""

from __future__ import annotations

import time
from dataclasses import field
from pathlib import Path
from typing import Any

from gpudiag._support.records import dataclass
from gpudiag.rundir import layout as rundir


@dataclass
class RankProgress:
    """Steps seen so far for one rank, from its telemetry file."""

    steps: int = 0
    steps_per_s: float | None = None
    last_end_ns: int | None = None


@dataclass
class Progress:
    """A snapshot for the live display."""

    run_dir: Path
    elapsed_s: float
    gpus: list[dict[str, Any]] = field(default_factory=list)
    ranks: dict[int, RankProgress] = field(default_factory=dict)
    alerts: list[str] = field(default_factory=list)  # raised now (the watchers' lines)


class StepsTail:
    """Follows every ``rank-*.steps.jsonl`` of a run directory for the live display."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}
        self.ranks: dict[int, RankProgress] = {}
        self.history: dict[int, list[tuple[float, int]]] = {}

    def poll(self) -> dict[int, RankProgress]:
        """Read the lines appended since the last poll."""
        now = time.monotonic()
        for rank, lines in rundir.appended_step_lines(self.run_dir, self.offsets):
            rp = self.ranks.setdefault(rank, RankProgress())
            rp.steps += sum(b'"type":"step"' in line for line in lines)
            hist = self.history.setdefault(rank, [])
            hist.append((now, rp.steps))
            while len(hist) > 2 and now - hist[0][0] > 10.0:
                hist.pop(0)
            t0, s0 = hist[0]
            rp.steps_per_s = (rp.steps - s0) / (now - t0) if now - t0 > 0.5 else None
        return self.ranks
