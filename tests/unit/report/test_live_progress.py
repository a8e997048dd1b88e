"""gpudiag run's status and progress lines are renderers in report/, fed the launcher's snapshot."""

from __future__ import annotations

import os
from pathlib import Path

from gpudiag.collect.launch.progress import Progress, RankProgress
from gpudiag.report.live import StatusLine, progress_line


def _snapshot() -> Progress:
    return Progress(
        run_dir=Path("runs/x"),
        elapsed_s=42.4,
        gpus=[{"index": 0, "util_ratio": 0.93}, {"index": 1, "util_ratio": None}],
        ranks={1: RankProgress(steps=7), 0: RankProgress(steps=12, steps_per_s=2.5)},
    )


def test_the_plain_line_says_the_same() -> None:
    assert progress_line(_snapshot()) == "gpudiag: 42s steps r0:12 r1:7 gpu util 93% n/a"


class _Tty(StatusLine):
    """A status line whose terminal is a list of writes, 24 rows × 80 columns."""

    def __init__(self) -> None:
        super().__init__(-1)
        self.out: list[str] = []
        self.size = (24, 80)

    def _size(self) -> tuple[int, int]:
        return self.size

    def _write(self, text: str) -> None:
        self.out.append(text)


def test_the_status_keeps_the_last_row_out_of_the_jobs_scrolling_region() -> None:
    s = _Tty()
    s.start()
    assert s.out == ["\n\x1b[A\x1b7\x1b[1;23r\x1b8"]  # rows 1..23 scroll, row 24 is ours
    s.show("x" * 200)
    # one write: save the cursor, draw on row 24 (cut to 79 columns), restore the cursor
    assert s.out[-1] == "\x1b7\x1b[24;1H\x1b[2K" + "x" * 79 + "\x1b8"
    s.size = (30, 80)
    s.show("y")  # a resize: the old status erased below the cursor, the region set again
    assert s.out[-2] == "\x1b7\x1b[r\x1b8\x1b[J\x1b[S\x1b[A\x1b7\x1b[1;29r\x1b8"
    s.stop()
    assert s.out[-1] == "\x1b7\x1b[30;1H\x1b[2K\x1b[r\x1b8" and s.rows == 0
    s.show("z")  # after stop nothing is drawn
    assert s.out[-1].endswith("\x1b8") and "z" not in s.out[-1]


def test_a_terminal_too_short_gets_no_status() -> None:
    s = _Tty()
    s.size = (2, 80)
    s.start()
    s.show("x")
    assert s.out == []


def test_the_status_line_carries_the_alerts() -> None:
    p = _snapshot()
    p.alerts = ["alert: step 3: a", "alert: step 21: rank 1 is a straggler: +300 ms a step"]
    assert progress_line(p).endswith(
        " · alert: step 21: rank 1 is a straggler: +300 ms a step (+1 more)"
    )


def test_a_pipe_is_not_a_terminal_for_the_status(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        s = StatusLine(w)
        s.start()
        assert s.rows == 0  # no size on a pipe: nothing reserved, nothing written
    finally:
        os.close(r)
        os.close(w)
