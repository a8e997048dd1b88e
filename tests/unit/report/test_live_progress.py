"""gpudiag run's live panel and progress lines are renderers in report/, fed the launcher's snapshot."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from gpudiag.collect.launch.progress import Progress, RankProgress
from gpudiag.report.live import progress_line, progress_table


def _snapshot() -> Progress:
    return Progress(
        run_dir=Path("runs/x"),
        elapsed_s=42.4,
        gpus=[{"index": 0, "util_ratio": 0.93}, {"index": 1, "util_ratio": None}],
        ranks={1: RankProgress(steps=7), 0: RankProgress(steps=12, steps_per_s=2.5)},
    )


def test_the_live_panel_lists_gpus_then_ranks_in_order() -> None:
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(progress_table(_snapshot()))
    lines = [" ".join(line.split()) for line in buf.getvalue().splitlines() if line.strip()]
    assert lines == [
        "gpudiag · runs/x · 42s",
        "GPU / rank util / steps",
        "gpu 0 93%",
        "gpu 1 n/a",
        "rank 0 12 (2.50/s)",
        "rank 1 7",
    ]


def test_the_plain_line_says_the_same() -> None:
    assert progress_line(_snapshot()) == "gpudiag: 42s steps r0:12 r1:7 gpu util 93% n/a"
